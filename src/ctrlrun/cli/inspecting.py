"""``ctrlrun inspect ID``: one action's whole story (``ctrlrun.operator.inspect``), printed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..action import canonical_bytes
from ..operator.inspect import KINDS, inspect_story
from .text import compact_json, say, say_raw

__all__ = ["KINDS", "inspect_story", "print_story"]


def _who(principal: Mapping[str, Any] | None) -> str:
    if not principal:
        return "-"
    agent = str(principal.get("agent") or "-")
    return agent + (f"/{principal['user']}" if principal.get("user") else "")


def _arguments(value: Any) -> str:
    return "-" if value is None else canonical_bytes(value).decode("utf-8")


def print_story(documents: list[dict[str, Any]], as_json: bool) -> None:
    """One JSON line per document, or the story as lines (escaped, as every CLI line is)."""
    if as_json:
        for document in documents:
            say_raw(compact_json(document))
        return
    for d in documents:
        kind = d["kind"]
        if kind == "action":
            say(f"action {d['action_id']}  {d['action'] or '-'}  {_who(d['principal'])}  "
                f"{d['action_hash'] or '-'}")  # fmt: skip
            say(f"  arguments {_arguments(d['arguments'])}")
            for c in d["decisions"]:
                say(f"  {c['at']}  decided {c['decision']}  {c['reason'] or '-'}  "
                    f"policy {c['policy_hash'] or '-'}")  # fmt: skip
        elif kind == "request":
            say(f"request {d['request_id']}  {d['status'] or 'not stored'}"
                + (f"  expires {d['expires_at']}" if d.get("expires_at") else ""))  # fmt: skip
            for h in d["history"]:
                say(f"  {h['at']}  {h['what']}" + (f" by {h['by']}" if h["by"] else ""))
        elif kind == "effect":
            line = f"effect {d['effect_key']}  {d['state']}"
            if "attempt" in d:
                line += f"  attempt {d['attempt']}  {d['action_id']}  {d['updated_at']}"
                line += f"  resolved by {d['resolved_by']}" if d["resolved_by"] else ""
            say(line)
            for a in d["attempts"]:
                say(f"  attempt {a['attempt']}  {a['action_id']}  {a['decision']}/{a['result']}  "
                    f"{a['receipt_id']}")  # fmt: skip
        else:
            result = "UNREADABLE" if d.get("unreadable") else f"{d['decision']}/{d['result']}"
            say(f"receipt {d['receipt_id'] or '-'}  seq {d['seq']}  {d['hash'] or '-'}  {result}"
                + (f"  {d['finished_at']}" if d.get("finished_at") else ""))  # fmt: skip
