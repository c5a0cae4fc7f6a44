"""``ApprovalScope``: the capability that puts each tool call's ``RunContext`` in scope.

Imported on first use of ``ctrlrun_pydantic_ai.ApprovalScope`` (it subclasses Pydantic AI's
``AbstractCapability``, so defining it imports the framework).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities import AbstractCapability, ValidatedToolArgs, WrapToolExecuteHandler
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition

from ._calls import ToolCall, current

__all__ = ["ApprovalScope"]


@dataclass
class ApprovalScope(AbstractCapability[AgentDepsT]):
    """Hold the tool's ``RunContext`` in a context variable while the tool executes.

    Add it to the agent: ``Agent(..., capabilities=[ApprovalScope()])``. ``PydanticAIInterrupt``
    reads it to defer the call (first pass) or to read the human's answer (resumed pass). Sync
    tools run in a worker thread that copies the context, so they see it too. It changes nothing
    else: the tool's arguments, result and errors pass through untouched.
    """

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built in code next to the Control, never from an agent spec

    async def wrap_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        token = current.set(ToolCall(ctx))
        try:
            return await handler(args)
        finally:
            current.reset(token)
