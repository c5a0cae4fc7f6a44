"""What the client reads: ctrlrun's answers as JSON-RPC errors, one sentence each, and the
receipt metadata on relayed results. Messages name ids and the effect key, no argument value."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from .._time import format_ts
from ..evidence.receipt import Receipt
from .wire import CODES, INTERNAL_ERROR, INVALID_PARAMS, error

__all__ = ["Answers", "RECEIPT_META"]

RECEIPT_META = "com.ctrlrun/receipt"


class Answers:
    """The answers for one ``tools/call`` request; fields fill in as the call gets built."""

    def __init__(self, request_id: Any, action_name: Callable[[str], str]) -> None:
        self.request_id = request_id
        self._action_name = action_name
        self.tool: str | None = None
        self.action_id: str | None = None
        self.effect_key: str | None = None

    @property
    def action(self) -> str | None:
        """``mcp.<alias>.<tool>``, once the tool name passed."""
        return self._action_name(self.tool) if self.tool is not None else None

    def _ctrlrun(self, code: int, message: str, **data: Any) -> dict[str, Any]:
        body = {"error": CODES[code], "action": self.action, "action_id": self.action_id, **data}
        return error(self.request_id, code, message, body)

    # -- refusals before anything is recorded ----------------------------------------------------

    def invalid(self, message: str) -> dict[str, Any]:
        return error(self.request_id, INVALID_PARAMS, message)

    def internal(self, message: str) -> dict[str, Any]:
        return error(self.request_id, INTERNAL_ERROR, message)

    def no_principal(self, why: str | None) -> dict[str, Any]:
        detail = f" ({why})" if why else ""
        return self._ctrlrun(
            -41007,
            f"No principal: the gateway has none for this call{detail}; its operator must configure "
            "--principal or the identity header, nothing was run.",
        )

    def unrepresentable(self, pointer: str) -> dict[str, Any]:
        return self._ctrlrun(
            -41008,
            f"Unrepresentable argument: the number at {pointer} is not an integer; send integer minor "
            "units or a decimal string, nothing was run.",
            pointer=pointer,
        )

    # -- the pipeline's refusals -------------------------------------------------------------------

    def denied(self, reason: str) -> dict[str, Any]:
        return self._ctrlrun(-41001, f"Denied: the policy does not allow {self.action} ({reason}); nothing was run.",
                             reason=reason)  # fmt: skip

    def unauthorized(self, reason: str, grant_id: str | None) -> dict[str, Any]:
        return self._ctrlrun(
            -41012,
            f"Unauthorized: no grant lets this principal run {self.action} ({reason}); nothing was run.",
            reason=reason,
            grant_id=grant_id,
        )

    def approval_required(self, request_id: str, action_hash: str, expires_at: datetime | None) -> dict[str, Any]:
        return self._ctrlrun(
            -41002,
            f"Approval required: a human must approve request {request_id} (ctrlrun approve "
            f"{request_id}), then repeat this exact call.",
            request_id=request_id,
            action_hash=action_hash,
            expires_at=format_ts(expires_at) if expires_at is not None else None,
        )

    def approval_denied(self, request_id: str) -> dict[str, Any]:
        return self._ctrlrun(
            -41003,
            f"Approval denied: a human denied request {request_id} for this exact call; do not repeat it.",
            request_id=request_id,
        )

    def duplicate(self, effect_key: str, state: str) -> dict[str, Any]:
        what = "already happened" if state == "committed" else f"is held by another call ({state})"
        return self._ctrlrun(
            -41004,
            f"Duplicate effect: effect {effect_key} {what}; this call will not run it again.",
            effect_key=effect_key,
            state=state,
        )

    def ambiguous(self, effect_key: str) -> dict[str, Any]:
        return self._ctrlrun(
            -41005,
            f"Ambiguous effect: effect {effect_key} may already have happened; an operator must settle "
            f"it (ctrlrun resolve {effect_key} --committed or --failed) before it can run again.",
            effect_key=effect_key,
        )

    def blocked(self, reason: str) -> dict[str, Any]:
        return self._ctrlrun(
            -41006,
            f"Blocked: the approval for this call cannot be used ({reason}); repeat the exact call to "
            "get a new approval request.",
            reason=reason,
        )

    def unknown_continuation(self) -> dict[str, Any]:
        return self._ctrlrun(
            -41009,
            "Unknown continuation: no call of this principal waits for these input responses; start "
            "the call again.",
        )

    # -- outcomes without an upstream answer to relay ---------------------------------------------

    def upstream_ambiguous(self, receipt: Receipt | None) -> dict[str, Any]:
        receipt_id = receipt.receipt_id if receipt is not None else None
        if self.effect_key is not None:
            text = (f"Upstream outcome unknown: the tool may have run (effect {self.effect_key}, receipt "
                    f"{receipt_id}); an operator must settle it with ctrlrun resolve {self.effect_key} "
                    "before it can run again.")  # fmt: skip
        else:
            text = (f"Upstream outcome unknown: the tool may have run (receipt {receipt_id}); check "
                    "before repeating the call.")  # fmt: skip
        return self._ctrlrun(-41010, text, effect_key=self.effect_key, receipt_id=receipt_id)

    def not_executed(self, receipt: Receipt | None) -> dict[str, Any]:
        receipt_id = receipt.receipt_id if receipt is not None else None
        return self._ctrlrun(
            -41011,
            f"Not executed: the upstream was never reached (receipt {receipt_id}); the call can be repeated.",
            effect_key=self.effect_key,
            receipt_id=receipt_id,
        )

    def with_receipt(self, relay: dict[str, Any], receipt: Receipt | None, state: str) -> dict[str, Any]:
        """The upstream's answer, unchanged but for the receipt metadata on a result."""
        result = relay.get("result")
        if not isinstance(result, dict):
            return relay
        meta = result.get("_meta")
        shown = str(receipt.result) if receipt is not None else state
        if shown not in ("committed", "failed", "ambiguous", "observed"):
            shown = state
        if state == "waiting":
            shown = "waiting"
        stamp = {
            "action_id": self.action_id,
            "receipt_id": receipt.receipt_id if receipt is not None else None,
            "effect_key": self.effect_key,
            "result": shown,
            "attempt": receipt.attempt if receipt is not None else None,
        }
        merged = {**(meta if isinstance(meta, dict) else {}), RECEIPT_META: stamp}
        return {**relay, "result": {**result, "_meta": merged}}
