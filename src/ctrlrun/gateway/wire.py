"""The gateway's wire rules: strict JSON in, our own serialization out, JSON-RPC shapes and codes.

Pure functions only; nothing here does I/O or knows about transports.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ALIAS",
    "CODES",
    "ENVELOPE_REVISION",
    "HTTP_REVISIONS",
    "LEGACY_REVISIONS",
    "META_REVISION",
    "REVISIONS",
    "TOOL_NAME",
    "WireError",
    "dumps",
    "error",
    "float_pointer",
    "kind",
    "loads",
    "parse_message",
    "revision_of",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_REVISION = -32022

#: ctrlrun's answers: JSON-RPC error code -> ``data.error``.
CODES: dict[int, str] = {
    -41001: "ctrlrun.denied",
    -41002: "ctrlrun.approval_required",
    -41003: "ctrlrun.approval_denied",
    -41004: "ctrlrun.duplicate_effect",
    -41005: "ctrlrun.ambiguous_effect",
    -41006: "ctrlrun.blocked",
    -41007: "ctrlrun.no_principal",
    -41008: "ctrlrun.unrepresentable_argument",
    -41009: "ctrlrun.unknown_continuation",
    -41010: "ctrlrun.upstream_ambiguous",
    -41011: "ctrlrun.upstream_not_executed",
    -41012: "ctrlrun.unauthorized",
}

#: Revisions with the ``initialize`` handshake, oldest first; ``2024-11-05`` is served on stdio only.
LEGACY_REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
ENVELOPE_REVISION = "2026-07-28"
REVISIONS = (*LEGACY_REVISIONS, ENVELOPE_REVISION)
HTTP_REVISIONS = REVISIONS[1:]
META_REVISION = "io.modelcontextprotocol/protocolVersion"

TOOL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
ALIAS = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class WireError(Exception):
    """A message the gateway refuses before anything else looks at it: a JSON-RPC error to send."""

    def __init__(self, code: int, message: str, *, id: Any = None, data: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id
        self.data = dict(data) if data is not None else None

    def answer(self) -> dict[str, Any]:
        """The JSON-RPC error response carrying this refusal."""
        return error(self.id, self.code, self.message, self.data)


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range")
    return number


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite)


def loads(data: bytes | str) -> Any:
    """Strict JSON: UTF-8, one value, no duplicate member names at any depth, no NaN/Infinity.
    Raises ``WireError(-32700)`` otherwise."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError:
        raise WireError(PARSE_ERROR, "Parse error: the message is not UTF-8") from None
    try:
        value, end = _DECODER.raw_decode(text.lstrip(" \t\r\n"))
    except _Duplicate as exc:
        raise WireError(PARSE_ERROR, f"Parse error: duplicate member name {str(exc)!r}") from None
    except (ValueError, RecursionError) as exc:
        raise WireError(PARSE_ERROR, f"Parse error: not strict JSON ({str(exc).split(':')[0]})") from None
    rest = text.lstrip(" \t\r\n")[end:]
    if rest.strip(" \t\r\n"):
        raise WireError(PARSE_ERROR, "Parse error: more than one JSON value in the message")
    return value


def dumps(value: Any) -> bytes:
    """The gateway's own serialization: compact UTF-8 JSON, never NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def parse_message(data: bytes | str) -> dict[str, Any]:
    """One strict JSON-RPC 2.0 object (request, notification or response); else ``WireError``."""
    value = loads(data)
    if isinstance(value, list):
        raise WireError(INVALID_REQUEST, "Invalid Request: batches are not accepted")
    if not isinstance(value, dict):
        raise WireError(INVALID_REQUEST, "Invalid Request: a JSON-RPC message is an object")
    ident = value.get("id")
    if "id" in value and not (ident is None or isinstance(ident, str) or (isinstance(ident, int) and not isinstance(ident, bool))):
        raise WireError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    safe_id = ident if "id" in value else None
    if value.get("jsonrpc") != "2.0":
        raise WireError(INVALID_REQUEST, 'Invalid Request: jsonrpc must be "2.0"', id=safe_id)
    if "method" in value:
        if not isinstance(value["method"], str):
            raise WireError(INVALID_REQUEST, "Invalid Request: method must be a string", id=safe_id)
        if "params" in value and not isinstance(value["params"], (dict, list)):
            raise WireError(INVALID_REQUEST, "Invalid Request: params must be an object", id=safe_id)
        if "result" in value or "error" in value:
            raise WireError(INVALID_REQUEST, "Invalid Request: a request carries no result", id=safe_id)
        if "id" in value and ident is None:
            raise WireError(INVALID_REQUEST, "Invalid Request: a request id is not null", id=None)
        return value
    if "id" not in value or ("result" in value) == ("error" in value):
        raise WireError(INVALID_REQUEST, "Invalid Request: neither a request nor a response", id=safe_id)
    if "error" in value:
        err = value["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int) or isinstance(err.get("code"), bool):
            raise WireError(INVALID_REQUEST, "Invalid Request: error must be an object with an integer code", id=safe_id)
    return value


def kind(message: Mapping[str, Any]) -> str:
    """``request``, ``notification`` or ``response`` of a message ``parse_message`` accepted."""
    if "method" in message:
        return "request" if "id" in message else "notification"
    return "response"


def error(id: Any, code: int, message: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-RPC error response."""
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = dict(data)
    return {"jsonrpc": "2.0", "id": id, "error": body}


def float_pointer(value: Any, pointer: str = "") -> str | None:
    """The JSON pointer of the first float in ``value`` (RFC 6901), or ``None``."""
    if isinstance(value, float):
        return pointer
    if isinstance(value, dict):
        for key, item in value.items():
            found = float_pointer(item, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = float_pointer(item, f"{pointer}/{index}")
            if found is not None:
                return found
    return None


def revision_of(message: Mapping[str, Any], settled: str | None) -> str | None:
    """The message's revision: its envelope's, else the transport's settled one."""
    params = message.get("params")
    if isinstance(params, dict):
        meta = params.get("_meta")
        if isinstance(meta, dict) and META_REVISION in meta:
            version = meta[META_REVISION]
            return version if isinstance(version, str) else ""
    return settled
