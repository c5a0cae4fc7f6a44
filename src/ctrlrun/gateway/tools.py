"""The tools the upstream lists: the listing filter, the schema cache, the schema pre-flight.

Hiding a tool is courtesy, not control: a hidden tool called anyway is decided as usual. The
listed descriptions and annotations are the server's claims and decide nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, TextIO

from ..policy import Decision, Policy
from .wire import TOOL_NAME

__all__ = ["Catalog", "SchemaRefusal"]

log = logging.getLogger("ctrlrun.gateway")


class SchemaRefusal(Exception):
    """The canonical arguments do not satisfy the tool's listed ``inputSchema``."""

    def __init__(self, tool: str, pointer: str, detail: str) -> None:
        super().__init__(f"arguments of tool {tool!r} do not match its inputSchema at {pointer or '/'}: {detail}")
        self.tool = tool
        self.pointer = pointer


class Catalog:
    """What the gateway knows of the upstream's tools (cached from relayed ``tools/list``)."""

    def __init__(self, policy: Policy, alias: str, *, stderr: TextIO | None = None) -> None:
        self._policy = policy
        self._alias = alias
        self._stderr = stderr
        self._lock = threading.Lock()
        self._schemas: dict[str, dict[str, Any]] = {}
        self._validators: dict[str, Any] = {}
        self._warned: set[str] = set()

    def action_name(self, tool: str) -> str:
        """The policy's name for a tool of this upstream."""
        return f"mcp.{self._alias}.{tool}"

    def hidden(self, tool: Any) -> bool:
        """Whether a listed tool is left out of ``tools/list``: a bad name, a tool the policy can
        only deny, or one that requires task-augmented calls (which the gateway refuses)."""
        if not isinstance(tool, dict):
            return True
        name = tool.get("name")
        if not isinstance(name, str) or TOOL_NAME.fullmatch(name) is None:
            return True
        execution = tool.get("execution")
        if isinstance(execution, dict) and execution.get("taskSupport") == "required":
            return True
        return self._policy.reachable_decisions(self.action_name(name)) == frozenset({Decision.DENY})

    def relay_result(self, method: str | None, message: dict[str, Any]) -> dict[str, Any]:
        """The upstream's answer to a relayed request of ``method``, as the client gets it:
        ``initialize`` (and ``server/discover``) lose the ``tasks`` capability, ``tools/list``
        is filtered (its schemas cached); anything else is returned unchanged."""
        result = message.get("result")
        if not isinstance(result, dict):
            return message
        if method in ("initialize", "server/discover"):
            capabilities = result.get("capabilities")
            if isinstance(capabilities, dict) and "tasks" in capabilities:
                kept = {k: v for k, v in capabilities.items() if k != "tasks"}
                return {**message, "result": {**result, "capabilities": kept}}
            return message
        if method == "tools/list" and isinstance(result.get("tools"), list):
            listed = result["tools"]
            self._remember(listed)
            shown = [tool for tool in listed if not self.hidden(tool)]
            return {**message, "result": {**result, "tools": shown}}
        return message

    def relay_notification(self, message: dict[str, Any]) -> None:
        """Note a notification from the upstream: ``notifications/tools/list_changed`` drops
        the cached schemas."""
        if message.get("method") == "notifications/tools/list_changed":
            with self._lock:
                self._schemas.clear()
                self._validators.clear()

    def schema(self, tool: str) -> dict[str, Any] | None:
        """The tool's ``inputSchema`` as last relayed, or ``None`` if unseen."""
        with self._lock:
            return self._schemas.get(tool)

    def preflight(self, tool: str, arguments: dict[str, Any]) -> None:
        """Check canonical arguments against the tool's listed schema; ``SchemaRefusal`` names
        the failing path. An unseen or uncompilable schema is skipped (logged once)."""
        validator = self._validator(tool)
        if validator is None:
            return
        errors = sorted(validator.iter_errors(arguments), key=lambda e: (list(e.absolute_path), e.message))
        if errors:
            first = errors[0]
            pointer = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in first.absolute_path)
            raise SchemaRefusal(tool, pointer, first.message[:200])

    def _remember(self, tools: list[Any]) -> None:
        with self._lock:
            for tool in tools:
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    schema = tool.get("inputSchema")
                    name = tool["name"]
                    if isinstance(schema, dict):
                        self._schemas[name] = schema
                    else:
                        self._schemas.pop(name, None)
                    self._validators.pop(name, None)

    def _validator(self, tool: str) -> Any:
        with self._lock:
            if tool in self._validators:
                return self._validators[tool]
            schema = self._schemas.get(tool)
        if schema is None:
            self._once(tool, f"tool {tool!r} was not listed; its arguments are not pre-checked")
            return None
        try:
            import jsonschema

            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            validator: Any = cls(schema)
        except Exception as exc:  # any schema the library cannot compile is skipped
            self._once(tool, f"the inputSchema of tool {tool!r} cannot be compiled ({type(exc).__name__}); "
                             "its arguments are not pre-checked")  # fmt: skip
            validator = None
        with self._lock:
            self._validators[tool] = validator
        return validator

    def _once(self, tool: str, text: str) -> None:
        with self._lock:
            if tool in self._warned:
                return
            self._warned.add(tool)
        log.warning("%s", text)
