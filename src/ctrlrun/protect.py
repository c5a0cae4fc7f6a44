"""``@protect``: turn a function call into an action that goes through a Control."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar

from .control import ambient as _ambient
from .control.default import cached_control, default_control
from .control.steps import GIVE_WAY, Steps, drive, drive_async
from .control.options import _Options
from .control.steps import call as blocking
from .action import Action, new_action
from .errors import ActionDenied, ApprovalMismatch, ApprovalRequired, EffectKeyError, InvalidArgument
from .policy.templates import (
    plain_effect_key,
    render_effect_key,
    render_resource,
    template_placeholders,
)

if TYPE_CHECKING:  # a Control is built (and its module loaded) by whoever passes one, or the default
    from .control.options import Reconcile
    from .control.front import Control

__all__ = ["protect"]

log = logging.getLogger("ctrlrun")

P = ParamSpec("P")
R = TypeVar("R")


def _check_template(name: str, what: str, template: str | None) -> None:
    if template is None:
        return
    if not isinstance(template, str):
        raise InvalidArgument(f"@protect({name!r}): {what}= must be a string template")
    try:
        template_placeholders(template)
    except Exception as exc:
        raise InvalidArgument(
            f"@protect({name!r}): {what}={template!r} is not a valid template ({exc}); "
            "use literal text and {identifier} placeholders"
        ) from None


def _check_function(name: str, func: Callable[..., Any]) -> inspect.Signature:
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise InvalidArgument(
            f"@protect({name!r}) cannot wrap a generator: calling it would commit an un-run "
            "generator as the result; protect a function that performs the effect"
        )
    signature = inspect.signature(func)
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise InvalidArgument(
                f"@protect({name!r}): *args/**kwargs ({parameter.name}) cannot be bound to a "
                "policy; name every parameter"
            )
        if parameter.name == "data_scope":
            raise InvalidArgument(
                f"@protect({name!r}): a parameter may not be named 'data_scope' (the policy "
                "derives that name itself); rename it"
            )
    return signature


class _Call(NamedTuple):
    control: Control
    action: Action
    effect_key: str | None
    effect_error: EffectKeyError | None
    task: str | None
    hop: str | None


class _Protected:
    """Everything one decorated function needs at call time."""

    def __init__(self, name: str, func: Callable[..., Any], signature: inspect.Signature,
                 effect: str | None, resource: str | None, wait: bool, lease: timedelta | None,
                 reconcile: Reconcile | None, reconcile_eagerly: bool, control: Control | None,
                 task: str | None, hop: str | None, scope: Any,
                 preconditions: Callable[[Action], Mapping[str, Any]] | None = None) -> None:  # fmt: skip
        self.name = name
        self.func = func
        self.signature = signature
        self.effect = effect
        self.resource = resource
        self.wait = wait
        self.lease = lease
        self.reconcile = reconcile
        self.reconcile_eagerly = reconcile_eagerly
        self.control = control
        self.task = task
        self.hop = hop
        self.scope = scope
        self.preconditions = preconditions
        self.positional_only = tuple(
            p.name for p in signature.parameters.values() if p.kind is p.POSITIONAL_ONLY
        )
        parameters = signature.parameters.values()
        self._names = tuple(p.name for p in parameters)
        self._name_set = frozenset(self._names)
        self._positional = tuple(
            p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD
        )
        self._defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        # keyword-only and positional-or-keyword parameters only: bound by hand (see bind)
        self._by_hand = not self.positional_only
        self._templates: tuple[Control, tuple[str | None, str | None, str]] | None = None
        #: per Control: this function's settings checked once, and its straight path's ``run``
        self._settings: tuple[Control, _Options, Callable[..., tuple[Any, Any]]] | None = None
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, *args)

    def templates(self, control: Control) -> tuple[str | None, str | None]:
        """The decorator's templates win; a differing policy template is warned about once."""
        policy = control.policy
        chosen = []
        for what, mine, theirs in (
            ("effect", self.effect, policy.effect_template(self.name)),
            ("resource", self.resource, policy.resource_template(self.name)),
        ):
            if mine is not None and theirs is not None and mine != theirs:
                self.warn_once(
                    what,
                    "action %r: @protect(%s=%r) differs from the policy's %s: %r; using the decorator's",
                    self.name, what, mine, what, theirs,
                )  # fmt: skip
            chosen.append(mine if mine is not None else theirs)
        return chosen[0], chosen[1]

    def needs_default(self) -> bool:
        """True when this call uses the process default Control (refused without a principal)."""
        if self.control is not None:
            return False
        if _ambient.current_hint() is None:
            log.warning("action %r called outside ctrlrun.context(); denied", self.name)
            raise ActionDenied(
                f"action {self.name!r} denied: no principal; call it inside "
                "ctrlrun.context(agent=...)",
                reason="no_principal",
                action_id=None,
            )
        return True

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, in the signature's order, defaults applied: what
        ``signature.bind`` + ``apply_defaults`` give, without them when the call is plain."""
        names = self._names
        if not args and self._by_hand and tuple(kwargs) == names:
            return dict(kwargs)  # every parameter given by name, in the signature's order
        if self._by_hand and len(args) <= len(self._positional):
            given = dict(zip(self._positional, args)) if args else {}
            if not given.keys() & kwargs.keys():
                given.update(kwargs)
                if len(given) == len(names) and given.keys() == self._name_set:
                    return {n: given[n] for n in names}  # every parameter given
                defaults = self._defaults
                if given.keys() <= self._name_set and all(
                    n in given or n in defaults for n in names
                ):
                    return {n: given[n] if n in given else defaults[n] for n in names}
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def prepare(self, control: Control, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """Principal, bound arguments, resource, the Action and its effect key; writes nothing."""
        principal = control.resolve_principal(self.name)
        arguments = self.bind(args, kwargs)
        cached = self._templates
        if cached is not None and cached[0] is control:
            effect, resource_template, environment = cached[1]
        else:
            effect, resource_template = self.templates(control)
            environment = control.wiring.environment
            self._templates = (control, (effect, resource_template, environment))
        resource = None
        if resource_template is not None:
            resource = render_resource(resource_template, arguments)
        action = new_action(self.name, arguments, principal, resource, environment)
        effect_key, effect_error = None, None
        if effect is not None:
            # the checked arguments render as their canonical form would, when plain
            effect_key = plain_effect_key(effect, action.arguments)
            if effect_key is None:
                try:
                    effect_key = render_effect_key(effect, action._arguments_view(), action.resource)
                except EffectKeyError as exc:
                    effect_error = exc
        elif self.reconcile is not None:
            self.warn_once("reconcile", "action %r has a reconcile hook but no effect key; "
                           "the hook is never called", self.name)  # fmt: skip
        task = render_resource(self.task, arguments) if self.task is not None else None
        hop = render_resource(self.hop, arguments) if self.hop is not None else None
        return _Call(control, action, effect_key, effect_error, task, hop)

    def executor(self, action: Action) -> Callable[[], Any]:
        """Call the function with fresh canonical copies of the arguments, never the caller's."""

        func, positional_only = self.func, self.positional_only

        def run() -> Any:
            arguments = action.canonical_arguments
            if not positional_only:
                return func(**arguments)
            positional = [arguments.pop(name) for name in positional_only]
            return func(*positional, **arguments)

        return run

    def rebind(self, call: _Call, arguments: dict[str, Any]) -> _Call:
        """The call a human approved with edits: the same action with the approved arguments."""
        rest = dict(arguments)
        positional = [rest.pop(name) for name in self.positional_only if name in rest]
        try:
            self.signature.bind(*positional, **rest)
        except TypeError as exc:
            raise InvalidArgument(
                f"action {self.name!r}: the approved arguments {arguments} do not fit the "
                f"function ({exc}); ask the approver to edit only its parameters"
            ) from None
        action = call.action.replace(arguments=arguments)
        effect, _ = self.templates(call.control)
        effect_key, effect_error = None, None
        if effect is not None:
            try:
                effect_key = render_effect_key(effect, action.canonical_arguments, action.resource)
            except EffectKeyError as exc:
                effect_error = exc
        return call._replace(action=action, effect_key=effect_key, effect_error=effect_error)

    def steps(self, call: _Call, evaluation: Any = None) -> Steps[Any]:
        """The whole call, sync or async alike; with ``wait=True``, ask a human and go on (a
        granted approval of the identical action is spent instead of asking again)."""
        if self.wait and _ambient.presented_approval() is None:
            granted = yield blocking(_granted_for, call.control, call.action, evaluation)
            if granted is not None:
                try:
                    with _ambient.with_approval(granted):
                        return (yield from self.attempt(call, evaluation))
                except ApprovalMismatch as lost:
                    if lost.reason not in ("consumed", "expired"):
                        raise
                    log.info("approval %s was spent or expired meanwhile; asking again", granted)
        try:
            return (yield from self.attempt(call, evaluation))
        except ApprovalRequired as required:
            if not self.wait:
                raise
            request_id = required.request_id
            _announce_wait(self.name, request_id)
            approval = yield blocking(call.control.approvals.wait, request_id, None)
            if approval is not None and approval.edited_from == call.action.action_hash:
                record = yield blocking(call.control.store.get_approval, request_id)
                call = self.rebind(call, record.approved_arguments)
            with _ambient.with_approval(request_id):
                return (yield from self.attempt(call))

    def attempt(self, call: _Call, evaluation: Any = None) -> Steps[Any]:
        """One pass through the Control: a key that cannot be rendered is refused and recorded."""
        if call.effect_error is not None:
            yield from call.control.refuse_effect_key(call.action, call.effect_error)
            raise call.effect_error
        value, _ = yield from call.control.pipeline(
            call.action,
            self.executor(call.action),
            call.effect_key,
            evaluation=evaluation,
            lease=self.lease,
            reconcile=self.reconcile,
            reconcile_eagerly=self.reconcile_eagerly,
            task=call.task,
            hop=call.hop,
            scope=self.scope,
            preconditions=self.preconditions,
        )
        return value

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        control = self.control
        if control is None:
            self.needs_default()  # refuses a call outside ctrlrun.context()
            control = default_control()
        call = self.prepare(control, args, kwargs)
        evaluation = None
        if call.effect_error is None and self.scope is None:
            settings = self._settings
            if settings is None or settings[0] is not control:
                # what Control.straight checks of this function's settings, once per Control
                checked = control.wiring.options(call.action, None, lease=self.lease,
                                                 reconcile=self.reconcile,
                                                 reconcile_eagerly=self.reconcile_eagerly)  # fmt: skip
                settings = self._settings = (control, checked, control.wiring.straight.run)
            key, base = call.effect_key, settings[1]
            if key is not None and (key == "" or key.startswith("policy:")):
                control.wiring.options(call.action, key)  # refused: the error names the key
            options = _Options(key, base.lease, base.reconcile, base.reconcile_eagerly, call.task,
                               call.hop, base.preconditions)  # fmt: skip
            value, evaluation = settings[2](call.action, self.executor(call.action), key, options)
            if value is not GIVE_WAY:
                return value
        return drive(self.steps(call, evaluation))

    async def acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        control = self.control
        if self.needs_default():
            control = cached_control() or await _to_thread(default_control)
        assert control is not None
        return await drive_async(self.steps(self.prepare(control, args, kwargs)))


def _granted_for(control: Control, action: Action, evaluation: Any) -> str | None:
    """A granted, unexpired approval of exactly this action (a call restarted after its
    request was approved), when the policy asks for one; ``None`` otherwise."""
    from .policy import Decision

    decided = evaluation if evaluation is not None else control.policy.evaluate(action)
    if decided.decision is not Decision.APPROVE:
        return None
    finder = getattr(control.store, "find_granted_approval", None)  # a store of another make may lack it
    granted = None if finder is None else finder(action.action_hash)
    return None if granted is None else str(granted.approval_id)


def _announce_wait(name: str, request_id: str) -> None:
    """Say once that a call waits for a human, and the command that answers it: a ``logging``
    warning, and a line on an interactive stderr that the log would not reach already."""
    message = (f"action {name!r} is waiting for a human: approve it with `ctrlrun approve "
               f"{request_id}` (or refuse it with `ctrlrun deny {request_id}`)")  # fmt: skip
    log.warning("%s", message)
    stderr = sys.stderr
    if stderr is not None and stderr.isatty() and not _logged_to(stderr):
        print(f"ctrlrun: {message}", file=stderr, flush=True)


def _logged_to(stream: Any) -> bool:
    """Whether a warning on the ``ctrlrun`` logger is written to ``stream`` (by a handler on
    the way to the root, or by ``logging.lastResort`` when there is none)."""
    if not log.isEnabledFor(logging.WARNING):
        return False
    logger: logging.Logger | None = log
    found = False
    while logger is not None:
        for handler in logger.handlers:
            found = True
            if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                return handler.level <= logging.WARNING
        logger = logger.parent if logger.propagate else None
    if not found:
        last = logging.lastResort
        return last is not None and last.level <= logging.WARNING and stream is sys.stderr
    return False


def protect(
    name: str,
    *,
    effect: str | None = None,
    resource: str | None = None,
    wait: bool = False,
    lease: timedelta | None = None,
    reconcile: Reconcile | None = None,
    reconcile_eagerly: bool = False,
    control: Control | None = None,
    preconditions: Callable[[Action], Mapping[str, Any]] | None = None,
    task: str | None = None,
    hop: str | None = None,
    scope: Callable[[Action], Mapping[str, Any]] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Protect a consequential function: policy, exact approvals, once-only effects, receipts.

    Works on ``def`` and ``async def`` functions alike; an ``async def`` gets an ``async def``
    wrapper running the same pipeline, with store work kept off the event loop.
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"@protect needs a non-empty action name, got {name!r}")
    for what, template in (("effect", effect), ("resource", resource), ("task", task), ("hop", hop)):
        _check_template(name, what, template)
    for what, value in (("reconcile", reconcile), ("preconditions", preconditions), ("scope", scope)):
        if value is not None and not callable(value):
            raise InvalidArgument(f"@protect({name!r}): {what}= must be callable")
    if scope is not None:
        raise InvalidArgument(
            f"@protect({name!r}): scope= is not enforced by this version of ctrlrun; "
            "remove it rather than run without it"
        )
    if lease is not None and (not isinstance(lease, timedelta) or lease <= timedelta(0)):
        raise InvalidArgument(f"@protect({name!r}): lease= must be a positive timedelta")
    if not isinstance(reconcile_eagerly, bool):
        raise InvalidArgument(f"@protect({name!r}): reconcile_eagerly= must be True or False")
    if reconcile_eagerly and reconcile is None:
        raise InvalidArgument(f"@protect({name!r}): reconcile_eagerly=True needs reconcile=")
    if not isinstance(wait, bool):
        raise InvalidArgument(f"@protect({name!r}): wait= must be True or False")
    if control is not None:
        from .control.front import Control  # loaded already: whoever built this control imported it

        if not isinstance(control, Control):
            raise InvalidArgument(f"@protect({name!r}): control= must be a ctrlrun.Control")

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        signature = _check_function(name, func)
        protected = _Protected(name, func, signature, effect, resource, wait, lease, reconcile,
                               reconcile_eagerly, control, task, hop, scope, preconditions)  # fmt: skip

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await protected.acall(args, kwargs)

            async_wrapper.__ctrlrun__ = protected  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return protected.call(args, kwargs)  # type: ignore[no-any-return]

        wrapper.__ctrlrun__ = protected  # type: ignore[attr-defined]
        return wrapper

    return decorate


async def _to_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``asyncio.to_thread``, imported when first awaited: ``import ctrlrun`` stays free of
    asyncio (and the ssl it imports)."""
    import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)
