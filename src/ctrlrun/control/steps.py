"""One pipeline, two drivers: the pipeline is a generator that yields the work it needs done.

A step is either blocking work (a store call, a provider's wait, a reconcile hook) or the protected
function itself. ``drive`` runs steps inline; ``drive_async`` runs blocking work in a worker thread
so the event loop never waits on a lock, and awaits the protected coroutine in the caller's task.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

__all__ = ["GIVE_WAY", "Carried", "Steps", "Work", "call", "drive", "drive_async", "run_function", "unwrap"]

T = TypeVar("T")

GIVE_WAY: Any = object()
"""What the straight path answers when the call must take the pipeline instead."""


@dataclass(slots=True)
class Work:
    """Something the pipeline needs done: ``fn(*args, **kwargs)``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    function: bool = False  # the protected function: awaited in place, never sent to a thread


Steps = Generator[Work, Any, T]


class Carried(Exception):
    """A ``GeneratorExit`` raised by the work, carried into the pipeline as an ordinary error: a
    generator thrown ``GeneratorExit`` itself may not go on to record what happened."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


def _carry(exc: BaseException) -> BaseException:
    return Carried(exc) if isinstance(exc, GeneratorExit) else exc


def unwrap(exc: BaseException) -> BaseException:
    """The work's own exception, ``Carried`` or not."""
    return exc.original if isinstance(exc, Carried) else exc


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
            error = _carry(exc)


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
                value = await _to_thread(work.fn, *work.args, **work.kwargs)
        except BaseException as exc:  # cancellation included: the pipeline records it, then re-raises
            error = _carry(exc)


async def _to_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``asyncio.to_thread``, imported when first awaited: ``import ctrlrun`` stays free of
    asyncio (and the ssl it imports)."""
    import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)
