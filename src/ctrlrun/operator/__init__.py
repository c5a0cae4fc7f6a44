"""The operator library: what the CLI, the console, the MCP operator and the adapters do to a store
on a human's behalf, written once; the front-ends parse, call this, and render. Each name loads
its module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .stores import Settings
    from .answers import (
        Answer, AnswerRefused, Decision, ResolveRefused, check_answerable, decision_of, deny, edit, grant, resolve,
    )  # fmt: skip
    from .pending import effect_state, pending_document, policy_keys, requested_key
    from .stores import follow_up_store_option, open_store
    from .text import compact_json, safe

_LAZY: dict[str, str] = {
    "Settings": "stores",
    **dict.fromkeys(("Answer", "AnswerRefused", "Decision", "ResolveRefused", "check_answerable", "decision_of", "deny", "edit", "grant", "resolve"), "answers"),
    **dict.fromkeys(("effect_state", "pending_document", "policy_keys", "requested_key"), "pending"),
    **dict.fromkeys(("follow_up_store_option", "open_store"), "stores"),
    **dict.fromkeys(("compact_json", "safe"), "text"),
}

__all__ = [
    "Answer", "AnswerRefused", "Decision", "ResolveRefused", "Settings", "check_answerable", "compact_json", "decision_of", "deny", "edit",
    "effect_state", "follow_up_store_option", "grant", "open_store", "pending_document",
    "policy_keys", "requested_key", "resolve", "safe",
]  # fmt: skip

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
