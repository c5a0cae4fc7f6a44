"""The pure rules: strict JSON, JSON-RPC shapes, revisions, float pointers and the outcome table."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun.gateway.outcome import Answered, Broken, Cancelled, Challenged, NeverConnected, classify
from ctrlrun.gateway.wire import HTTP_REVISIONS, REVISIONS, WireError, dumps, float_pointer, kind, loads, parse_message, revision_of
from ctrlrun.transport import Transport


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"a":2}', '{"x":{"b":1,"b":1}}', '[{"k":1,"k":1}]', "NaN", '{"a":Infinity}', '{"a":1e999}',
     '{"a":1} {"b":2}', "{", b"\xff\xfe"],
)
def test_not_strict_json_is_a_parse_error(text: Any) -> None:
    with pytest.raises(WireError) as caught:
        loads(text)
    assert caught.value.code == -32700 and caught.value.id is None


def test_our_serialization_is_compact_utf8() -> None:
    assert dumps(loads(' { "b" : "é", "a" : [1, 2] } ')) == '{"b":"é","a":[1,2]}'.encode()


@pytest.mark.parametrize(
    ("text", "code"),
    [("[]", -32600), ('[{"jsonrpc":"2.0","id":1,"method":"ping"}]', -32600), ('"ping"', -32600),
     ('{"jsonrpc":"1.0","id":1,"method":"ping"}', -32600), ('{"jsonrpc":"2.0","id":1.5,"method":"ping"}', -32600),
     ('{"jsonrpc":"2.0","id":1}', -32600), ('{"jsonrpc":"2.0","id":true,"method":"x"}', -32600)],
)
def test_one_json_rpc_object(text: str, code: int) -> None:
    with pytest.raises(WireError) as caught:
        parse_message(text)
    assert caught.value.code == code


def test_kinds() -> None:
    assert kind(parse_message('{"jsonrpc":"2.0","id":1,"method":"ping"}')) == "request"
    assert kind(parse_message('{"jsonrpc":"2.0","method":"notifications/initialized"}')) == "notification"
    assert kind(parse_message('{"jsonrpc":"2.0","id":1,"result":{}}')) == "response"


def test_revisions() -> None:
    assert "2024-11-05" in REVISIONS and "2024-11-05" not in HTTP_REVISIONS
    envelope = {"params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}
    assert revision_of(envelope, "2025-11-25") == "2026-07-28"
    assert revision_of({"params": {}}, "2025-06-18") == "2025-06-18"


def test_float_pointer() -> None:
    assert float_pointer({"a": [1, {"b/c": 2.0}]}) == "/a/1/b~1c"
    assert float_pointer({"a": [1, True, None, "1.5"]}) is None


def _answer(result: Any) -> Answered:
    return Answered({"jsonrpc": "2.0", "id": 1, "result": result})


@pytest.mark.parametrize(
    ("observation", "revision", "flag", "state", "relayed"),
    [
        (NeverConnected("refused"), None, False, "failed", False),
        (_answer({"content": []}), "2025-11-25", False, "committed", True),
        (_answer({"content": [], "resultType": "complete"}), "2026-07-28", False, "committed", True),
        (_answer({"content": []}), "2026-07-28", False, "ambiguous", True),
        (_answer({"content": [], "resultType": "task"}), "2026-07-28", False, "ambiguous", True),
        (_answer({"resultType": "input_required", "inputRequests": {}}), "2026-07-28", False, "waiting", True),
        (_answer({"content": [], "isError": True}), "2025-11-25", False, "ambiguous", True),
        (_answer({"content": [], "isError": True}), "2025-11-25", True, "failed", True),
        (Answered({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}), None, False, "ambiguous", True),
        (Answered({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}), None, True, "failed", True),
        (Challenged(401), None, False, "ambiguous", False),
        (Challenged(401), None, True, "failed", False),
        (Broken(Transport.UNREADABLE_RESPONSE, "HTML 500"), None, True, "ambiguous", False),
        (Broken(Transport.STREAM_ENDED_EARLY, "ended"), None, True, "ambiguous", False),
        (Cancelled(), None, True, "ambiguous", False),
    ],
)
def test_only_what_was_observed_decides(observation: Any, revision: str | None, flag: bool, state: str, relayed: bool) -> None:
    verdict = classify(observation, revision=revision, not_executed_on_error=flag)
    assert verdict.state == state
    assert (verdict.relay is not None) == relayed
