"""``ApprovalMiddleware``: the function middleware that pauses a call and fails closed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agent_framework import (
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    MiddlewareFailure,
    MiddlewareTermination,
)

from ctrlrun.errors import CTRLRunError

from . import _ApprovalPause, _Scope, _scope

__all__ = ["ApprovalMiddleware"]


class ApprovalMiddleware(FunctionMiddleware):
    """Put ctrlrun approvals through Agent Framework's function approval.

    Holds the invocation context in a context variable around ``call_next()`` so
    ``AgentFrameworkInterrupt`` can read the framework's bound answer. On the adapter's pause
    signal it sets ``context.result`` to a ``function_approval_request`` (the tool's validated
    arguments; ctrlrun's payload under ``additional_properties["ctrlrun"]``) and raises
    ``MiddlewareTermination``; on a ``CTRLRunError`` it raises ``MiddlewareFailure`` from it, so
    the run fails closed instead of the framework handing the model an error result (use
    ``unwrap`` to get the ctrlrun error back). Other exceptions pass untouched.
    """

    def __repr__(self) -> str:
        return "ApprovalMiddleware()"

    async def process(
        self,
        context: FunctionInvocationContext,
        call_next: Callable[[], Awaitable[None]],
    ) -> None:
        token = _scope.set(_Scope(context))
        try:
            await call_next()
        except _ApprovalPause as pause:
            call = Content.from_function_call(
                call_id=pause.call_id,
                name=pause.name,
                arguments=pause.arguments,
                id=pause.occurrence_id,
            )
            context.result = Content.from_function_approval_request(
                pause.occurrence_id,
                call,
                additional_properties={"ctrlrun": pause.pending.to_dict()},
            )
            raise MiddlewareTermination(
                f"ctrlrun: {pause.pending.action} needs approval (request "
                f"{pause.pending.request_id}); answer the function_approval_request in the same "
                "session"
            ) from None
        except CTRLRunError as error:
            raise MiddlewareFailure(
                f"ctrlrun refused the call to {context.function.name!r}: "
                f"{type(error).__name__}: {error} (ctrlrun_agent_framework.unwrap(e) returns it)"
            ) from error
        finally:
            _scope.reset(token)
