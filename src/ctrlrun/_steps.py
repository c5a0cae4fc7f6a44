"""One pipeline, two drivers: the pipeline is a generator that yields the work it needs done.

A step is either blocking work (a store call, a provider's wait, a reconcile hook) or the protected
function itself. ``drive`` runs steps inline; ``drive_async`` runs blocking work in a worker thread
so the event loop never waits on a lock, and awaits the protected coroutine in the caller's task.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

__all__ = ["Steps", "Work", "call", "drive", "drive_async", "run_function"]

T = TypeVar("T")


@dataclass(slots=True)
class Work:
    """Something the pipeline needs done: ``fn(*args, **kwargs)``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    function: bool = False  # the protected function: awaited in place, never sent to a thread


Steps = Generator[Work, Any, T]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Work:
    """Blocking work (store, provider, hook): ``result = yield call(store.record, ...)``."""
    return Work(fn, args, kwargs)


def run_function(executor: Callable[[], Any]) -> Work:
    """The protected function's own call."""
    return Work(executor, function=True)


def drive(steps: Steps[T]) -> T:
    """Run a pipeline synchronously, doing each step inline."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            work = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        value, error = None, None
        try:
            value = work.fn(*work.args, **work.kwargs)
        except BaseException as exc:  # handed back to the pipeline, which decides
            error = exc


async def drive_async(steps: Steps[T]) -> T:
    """Run a pipeline in an event loop: blocking work in a worker thread, the function awaited."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            work = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(T, done.value)
        value, error = None, None
        try:
            if work.function:
                value = work.fn()
                if inspect.isawaitable(value):
                    value = await value
            elif inspect.iscoroutinefunction(work.fn):
                value = await work.fn(*work.args, **work.kwargs)
            else:
                value = await asyncio.to_thread(work.fn, *work.args, **work.kwargs)
        except BaseException as exc:  # cancellation included: the pipeline records it, then re-raises
            error = exc
