"""The tool call in scope: set by ``ApprovalScope`` around each tool execution, read by the
interrupt.

Kept apart from ``_scope`` so that reading it never imports Pydantic AI.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic_ai.tools import RunContext


@dataclass
class ToolCall:
    """One tool execution under ``ApprovalScope``: Pydantic AI's ``RunContext`` for it.

    ``request_id`` is the one ctrlrun request this tool call has been put to (asked on the first
    pass, answered on the resumed one); a second request under the same call is refused.
    """

    ctx: RunContext[Any]
    request_id: str | None = None


current: ContextVar[ToolCall | None] = ContextVar("ctrlrun_pydantic_ai_tool_call", default=None)
