"""The interceptor on its own: a tools/call in, a scripted upstream observation, the client's answer
and the store's record out (no transport, no SDK)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from ctrlrun import Control, InMemoryStateStore, Policy, Principal
from ctrlrun.approvals.answers import answer_events
from ctrlrun.operator.inspect import inspect_story
from ctrlrun.gateway.config import GatewayConfig
from ctrlrun.gateway.intercept import Interceptor
from ctrlrun.gateway.outcome import Answered, Broken, Cancelled, NeverConnected, Observation
from ctrlrun.gateway.tools import Catalog
from ctrlrun.receipt import verify_chain
from ctrlrun.transport import Transport

from ..clock import Clock

POLICY = """
schema: ctrlrun.policy/v2
actions:
  mcp.pay.refund:
    effect: "refund:{order_id}"
    rules:
      - when: { amount_cents_lte: 5000 }
        decision: allow
      - decision: approve
  mcp.pay.lookup:
    decision: allow
  mcp.pay.boom:
    effect: "boom:{n}"
    decision: allow
  mcp.pay.safe_boom:
    effect: "safe:{n}"
    decision: allow
    mcp: { not_executed_on_error: true }
  mcp.pay.nuke:
    decision: deny
"""

AGENT = Principal("agent-1", "alice")


class Upstream:
    """A scripted upstream: answers each forwarded request with the next observation."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.script: list[Callable[[dict[str, Any]], Observation]] = []

    def __call__(self, request: dict[str, Any]) -> Observation:
        self.received.append(request)
        step = self.script.pop(0) if self.script else ok
        return step(request)


def ok(request: dict[str, Any]) -> Observation:
    return Answered({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": "done"}]}})


def tool_error(request: dict[str, Any]) -> Observation:
    return Answered({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [], "isError": True}})


def input_required(request: dict[str, Any]) -> Observation:
    return Answered({"jsonrpc": "2.0", "id": request["id"], "result": {
        "resultType": "input_required", "inputRequests": {"confirm": {"method": "elicitation/create"}},
        "requestState": "s1"}})  # fmt: skip


def complete(request: dict[str, Any]) -> Observation:
    return Answered({"jsonrpc": "2.0", "id": request["id"], "result": {"resultType": "complete", "content": []}})


class Harness:
    """The interceptor over a Control on ``store`` (in memory unless given, with its ``clock``)."""

    def __init__(self, policy: str = POLICY, *, input_timeout: float = 30.0, store: Any = None,
                 clock: Any = None) -> None:  # fmt: skip
        self.clock = clock if clock is not None else Clock()
        self.store = store if store is not None else InMemoryStateStore(clock=self.clock)
        self.control = Control(Policy.from_yaml(policy), self.store, clock=self.clock)
        self.config = GatewayConfig(alias="pay", command=("x",), principal=("agent-1", "alice"), input_timeout=input_timeout)
        self.catalog = Catalog(self.control.policy, "pay")
        self.interceptor = Interceptor(self.config, self.control, self.catalog)
        self.upstream = Upstream()
        self.ids = 0

    def call(self, tool: str, arguments: Any = None, *, principal: Any = AGENT, revision: str | None = "2025-11-25",
             params: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
        self.ids += 1
        body: dict[str, Any] = {"name": tool}
        if arguments is not None:
            body["arguments"] = arguments
        body.update(params or {})
        replies: list[dict[str, Any]] = []
        message = {"jsonrpc": "2.0", "id": self.ids, "method": "tools/call", "params": body}
        self.interceptor.call(message, principal=principal, revision=revision, forward=self.upstream, reply=replies.append)
        return replies

    def one(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        replies = self.call(*args, **kwargs)
        assert len(replies) == 1, replies
        return replies[0]

    def receipts(self) -> list[Any]:
        return list(self.store.receipts())


def code(answer: dict[str, Any]) -> int | None:
    return answer.get("error", {}).get("code")


def test_an_allowed_call_is_forwarded_canonically_with_the_token_and_the_receipt_meta() -> None:
    h = Harness()
    answer = h.one("refund", {"order_id": "o1", "currency": "EUR", "amount_cents": 100},
                   params={"_meta": {"progressToken": 3}})  # fmt: skip
    sent = h.upstream.received[0]["params"]
    assert list(sent["arguments"]) == ["amount_cents", "currency", "order_id"]
    assert sent["_meta"]["progressToken"] == 3
    assert len(sent["_meta"]["com.ctrlrun/idempotency_token"]) == 36
    stamp = answer["result"]["_meta"]["com.ctrlrun/receipt"]
    (receipt,) = h.receipts()
    assert stamp == {"action_id": receipt.action_id, "receipt_id": receipt.receipt_id, "effect_key": "refund:o1",
                     "result": "committed", "attempt": 1}  # fmt: skip
    assert receipt.action == "mcp.pay.refund" and str(receipt.result) == "committed"
    again = h.one("refund", {"order_id": "o1", "currency": "EUR", "amount_cents": 100})
    assert code(again) == -41004 and again["error"]["data"]["state"] == "committed"
    assert len(h.upstream.received) == 1


def test_a_call_without_a_key_has_no_token() -> None:
    h = Harness()
    h.one("lookup", {"order_id": "o1"})
    assert "_meta" not in h.upstream.received[0]["params"]


@pytest.mark.parametrize(
    ("tool", "arguments", "principal", "params", "expected"),
    [
        ("bad name!", {}, AGENT, None, -32602),
        ("refund", [1], AGENT, None, -32602),
        ("refund", {"order_id": "o1"}, AGENT, {"task": {"ttl": 5}}, -32602),
        ("refund", {"order_id": "o1", "amount_cents": 1.5}, AGENT, None, -41008),
        ("refund", {"order_id": "o1", "amount_cents": 1}, None, None, -41007),
        ("refund", {"order_id": "o1", "amount_cents": 1}, "header X-Agent sent twice", None, -41007),
    ],
)
def test_refusals_before_anything_is_recorded(tool: str, arguments: Any, principal: Any, params: Any, expected: int) -> None:
    h = Harness()
    answer = h.one(tool, arguments, principal=principal, params=params)
    assert code(answer) == expected
    assert h.upstream.received == [] and h.receipts() == []


def test_a_float_names_its_pointer() -> None:
    answer = Harness().one("refund", {"order_id": "o1", "lines": [{"amount": 2.5}]})
    assert answer["error"]["data"]["pointer"] == "/lines/0/amount"
    assert answer["error"]["data"]["error"] == "ctrlrun.unrepresentable_argument"


def test_an_unknown_or_denied_tool_is_recorded_denied_and_never_forwarded() -> None:
    h = Harness()
    for tool in ("nuke", "unknown"):
        answer = h.one(tool, {})
        assert code(answer) == -41001
        assert answer["error"]["data"]["action"] == f"mcp.pay.{tool}"
    assert [str(r.result) for r in h.receipts()] == ["denied", "denied"]
    assert [r.decision_reason for r in h.receipts()][1] == "unknown_action"
    assert h.upstream.received == []


def test_an_effect_key_that_cannot_be_rendered_is_denied() -> None:
    h = Harness()
    answer = h.one("refund", {"amount_cents": 1})
    assert code(answer) == -41001 and answer["error"]["data"]["reason"] == "effect_key_error"
    assert [r.decision_reason for r in h.receipts()] == ["effect_key_error"]
    assert h.upstream.received == []


def test_the_approval_round_trip() -> None:
    h = Harness()
    arguments = {"order_id": "o9", "amount_cents": 9000}
    first = h.one("refund", arguments)
    assert code(first) == -41002
    request_id = first["error"]["data"]["request_id"]
    assert f"ctrlrun approve {request_id}" in first["error"]["message"]
    assert first["error"]["data"]["expires_at"].endswith("Z")
    repeat = h.one("refund", arguments)
    assert code(repeat) == -41002 and repeat["error"]["data"]["request_id"] == request_id
    assert len(h.store.pending_approvals()) == 1
    h.store.grant_approval(request_id, "cli:local", events=answer_events("cli:local"))
    ran = h.one("refund", arguments)
    assert ran["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    assert h.receipts()[-1].approver == "cli:local"
    assert code(h.one("refund", arguments)) == -41004
    changed = h.one("refund", {"order_id": "o10", "amount_cents": 9000})
    assert code(changed) == -41002 and changed["error"]["data"]["request_id"] != request_id
    assert len(h.upstream.received) == 1


def test_a_denied_request_is_not_asked_again() -> None:
    h = Harness()
    arguments = {"order_id": "o9", "amount_cents": 9000}
    request_id = h.one("refund", arguments)["error"]["data"]["request_id"]
    h.store.deny_approval(request_id, "cli:local", events=answer_events("cli:local"))
    answer = h.one("refund", arguments)
    assert code(answer) == -41003 and answer["error"]["data"]["request_id"] == request_id
    assert len(h.store.pending_approvals()) == 0 and h.upstream.received == []


def test_a_lost_reply_is_ambiguous_and_the_identical_retry_is_refused() -> None:
    h = Harness()
    h.upstream.script = [lambda r: Broken(Transport.AFTER_REQUEST_SENT, "connection reset")]
    answer = h.one("refund", {"order_id": "o1", "amount_cents": 1})
    assert code(answer) == -41010
    (receipt,) = h.receipts()
    assert answer["error"]["data"] == {"error": "ctrlrun.upstream_ambiguous", "action": "mcp.pay.refund",
                                       "action_id": receipt.action_id, "effect_key": "refund:o1",
                                       "receipt_id": receipt.receipt_id}  # fmt: skip
    assert str(receipt.result) == "ambiguous"
    retry = h.one("refund", {"order_id": "o1", "amount_cents": 1})
    assert code(retry) == -41005 and "ctrlrun resolve refund:o1" in retry["error"]["message"]
    assert len(h.upstream.received) == 1


def test_never_connected_is_failed_and_the_retry_runs() -> None:
    h = Harness()
    h.upstream.script = [lambda r: NeverConnected("connection refused")]
    answer = h.one("refund", {"order_id": "o1", "amount_cents": 1})
    assert code(answer) == -41011
    assert str(h.receipts()[0].result) == "failed"
    assert "result" in h.one("refund", {"order_id": "o1", "amount_cents": 1})
    assert [str(r.result) for r in h.receipts()] == ["failed", "committed"]


def test_an_is_error_result_is_relayed_and_ambiguous_unless_the_policy_says_not_executed() -> None:
    h = Harness()
    h.upstream.script = [tool_error, tool_error]
    relayed = h.one("boom", {"n": 1})
    assert relayed["result"]["isError"] is True
    assert relayed["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "ambiguous"
    flagged = h.one("safe_boom", {"n": 1})
    assert flagged["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "failed"
    assert [str(r.result) for r in h.receipts()] == ["ambiguous", "failed"]


def test_an_upstream_json_rpc_error_is_relayed_unchanged() -> None:
    h = Harness()
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "no back-channel"}}
    h.upstream.script = [lambda r: Answered(error)]
    assert h.one("boom", {"n": 2}) == error
    assert str(h.receipts()[0].result) == "ambiguous"


def test_a_cancelled_call_is_ambiguous_and_answers_nothing() -> None:
    h = Harness()
    h.upstream.script = [lambda r: Cancelled()]
    assert h.call("refund", {"order_id": "o1", "amount_cents": 1}) == []
    assert str(h.receipts()[0].result) == "ambiguous"


def test_the_schema_preflight_refuses_before_anything_is_recorded() -> None:
    h = Harness()
    listing = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [
        {"name": "refund", "inputSchema": {"type": "object", "properties": {"amount_cents": {"type": "integer"}},
                                           "required": ["order_id", "amount_cents"]}},
        {"name": "nuke", "inputSchema": {"type": "object"}},
        {"name": "bad name", "inputSchema": {"type": "object"}},
        {"name": "lookup", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}},
    ], "nextCursor": "c2"}}  # fmt: skip
    shown = h.catalog.relay_result("tools/list", listing)
    assert [t["name"] for t in shown["result"]["tools"]] == ["refund"]
    assert shown["result"]["nextCursor"] == "c2"
    answer = h.one("refund", {"order_id": "o1", "amount_cents": "12"})
    assert code(answer) == -32602 and "/amount_cents" in answer["error"]["message"]
    assert h.receipts() == [] and h.upstream.received == []
    h.catalog.relay_notification({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    assert code(h.one("refund", {"order_id": "o1", "amount_cents": "12"})) == -41002  # no schema: not pre-checked


def test_initialize_loses_the_tasks_capability() -> None:
    h = Harness()
    result = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}, "tasks": {"list": {}}}, "serverInfo": {"name": "s", "version": "1"}}}  # fmt: skip
    assert h.catalog.relay_result("initialize", result)["result"]["capabilities"] == {"tools": {}}


def _continue(h: Harness, arguments: dict[str, Any], state: str = "s1") -> list[dict[str, Any]]:
    return h.call("refund", arguments, revision="2026-07-28",
                  params={"inputResponses": {"confirm": {"action": "accept"}}, "requestState": state})  # fmt: skip


def test_input_required_keeps_one_reservation_across_rounds() -> None:
    h = Harness()
    arguments = {"order_id": "o1", "amount_cents": 1}
    h.upstream.script = [input_required, complete]
    first: list[dict[str, Any]] = []
    waiting = threading.Event()

    def reply(message: dict[str, Any]) -> None:
        first.append(message)
        waiting.set()

    message = {"jsonrpc": "2.0", "id": 100, "method": "tools/call", "params": {"name": "refund", "arguments": arguments}}
    worker = threading.Thread(target=h.interceptor.call, args=(message,),
                              kwargs={"principal": AGENT, "revision": "2026-07-28", "forward": h.upstream, "reply": reply})  # fmt: skip
    worker.start()
    assert waiting.wait(10)
    assert first[0]["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "waiting"
    assert h.store.get_effect("refund:o1").state.value == "executing"
    assert code(_continue(h, arguments, state="forged")[0]) == -41009
    final = _continue(h, arguments)
    worker.join(10)
    assert final[0]["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    assert "inputResponses" in h.upstream.received[1]["params"]
    assert [str(r.result) for r in h.receipts()] == ["committed"]
    assert len(first) == 1


def test_input_required_without_a_continuation_turns_ambiguous() -> None:
    h = Harness(input_timeout=0.05)
    h.upstream.script = [input_required]
    replies = h.call("refund", {"order_id": "o1", "amount_cents": 1}, revision="2026-07-28")
    assert len(replies) == 1 and replies[0]["result"]["resultType"] == "input_required"
    assert str(h.receipts()[0].result) == "ambiguous"
    assert code(_continue(h, {"order_id": "o1", "amount_cents": 1})[0]) == -41009


def test_observe_mode_refuses_nothing_about_the_action() -> None:
    h = Harness(POLICY.replace("schema: ctrlrun.policy/v2", "schema: ctrlrun.policy/v3\nmode: observe"))
    answer = h.one("nuke", {})
    assert "result" in answer
    assert len(h.upstream.received) == 1


# -- every refusal of a decided call leaves a receipt (issue 43) ---------------------------------

BIG = {"order_id": "o9", "amount_cents": 9000}  # approve
SMALL = {"order_id": "o9", "amount_cents": 1}  # allow, the same key


def _attempt(h: Harness, answer: dict[str, Any]) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """The one receipt and the events of the attempt ``answer`` names, after checking that
    ``ctrlrun inspect <action_id>`` tells it and that the chain still verifies."""
    action_id = answer["error"]["data"]["action_id"]
    (receipt,) = h.store.receipts_for(action_id=action_id)
    events = [(e.type.value, dict(e.data)) for e in h.store.events_for(action_id=action_id)]
    story = inspect_story(h.store, action_id)
    assert story[0]["kind"] == "action" and story[0]["action_id"] == action_id
    assert receipt.receipt_id in [d["receipt_id"] for d in story if d["kind"] == "receipt"]
    assert verify_chain(h.store).ok
    return receipt, events


def _types(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [kind for kind, _ in events]


def test_an_approved_call_repeated_is_a_duplicate_with_a_blocked_receipt(store: Any, clock: Any) -> None:
    h = Harness(store=store, clock=clock)
    request_id = h.one("refund", BIG)["error"]["data"]["request_id"]
    h.store.grant_approval(request_id, "cli:local", events=answer_events("cli:local"))
    assert "result" in h.one("refund", BIG)
    again = h.one("refund", BIG)
    assert code(again) == -41004
    receipt, events = _attempt(h, again)
    assert again["error"]["data"] == {"error": "ctrlrun.duplicate_effect", "action": "mcp.pay.refund",
                                      "action_id": receipt.action_id, "effect_key": "refund:o9",
                                      "state": "committed"}  # fmt: skip
    assert str(receipt.result) == "blocked" and receipt.effect_key == "refund:o9"
    assert _types(events) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVATION_REFUSED"]
    assert events[-1][1] == {"reason": "duplicate", "state": "committed"}
    assert h.store.pending_approvals() == () and len(h.upstream.received) == 1


def test_a_key_committed_while_a_request_waits_is_a_duplicate_with_a_blocked_receipt(store: Any, clock: Any) -> None:
    h = Harness(store=store, clock=clock)
    request_id = h.one("refund", BIG)["error"]["data"]["request_id"]
    assert "result" in h.one("refund", SMALL)  # allowed: the key is committed
    answer = h.one("refund", BIG)
    assert code(answer) == -41004 and answer["error"]["data"]["state"] == "committed"
    receipt, _ = _attempt(h, answer)
    assert str(receipt.result) == "blocked"
    assert [r.approval_id for r in h.store.pending_approvals()] == [request_id]  # nobody else asked


def test_an_ambiguous_key_refuses_an_approve_call_with_a_blocked_receipt(store: Any, clock: Any) -> None:
    h = Harness(store=store, clock=clock)
    h.upstream.script = [lambda r: Broken(Transport.AFTER_REQUEST_SENT, "connection reset")]
    assert code(h.one("refund", SMALL)) == -41010
    answer = h.one("refund", BIG)
    assert code(answer) == -41005
    receipt, events = _attempt(h, answer)
    assert answer["error"]["data"] == {"error": "ctrlrun.ambiguous_effect", "action": "mcp.pay.refund",
                                       "action_id": receipt.action_id, "effect_key": "refund:o9"}  # fmt: skip
    assert str(receipt.result) == "blocked"
    assert events[-1] == ("EFFECT_RESERVATION_REFUSED", {"reason": "ambiguous"})
    assert h.store.pending_approvals() == () and len(h.upstream.received) == 1


def test_a_denied_request_repeated_leaves_a_denied_receipt_each_time(store: Any, clock: Any) -> None:
    h = Harness(store=store, clock=clock)
    request_id = h.one("refund", BIG)["error"]["data"]["request_id"]
    h.store.deny_approval(request_id, "cli:local", events=answer_events("cli:local"))
    answers = [h.one("refund", BIG), h.one("refund", BIG)]
    for answer in answers:
        receipt, events = _attempt(h, answer)
        assert answer["error"]["data"] == {"error": "ctrlrun.approval_denied", "action": "mcp.pay.refund",
                                           "action_id": receipt.action_id, "request_id": request_id}  # fmt: skip
        assert code(answer) == -41003
        assert (str(receipt.result), str(receipt.decision)) == ("denied", "approve")
        assert (receipt.approval_id, receipt.approver) == (request_id, "cli:local")
        assert _types(events) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_DENIED", "ACTION_DENIED"]
        assert events[-1][1] == {"reason": "approval_denied"}
    told = [d["action_id"] for d in inspect_story(h.store, request_id) if d["kind"] == "action"]
    assert all(a["error"]["data"]["action_id"] in told for a in answers)
    assert h.store.pending_approvals() == () and h.upstream.received == []


def test_an_identical_request_still_pending_is_named_again_and_leaves_no_trace() -> None:
    h = Harness()
    request_id = h.one("refund", BIG)["error"]["data"]["request_id"]
    again = h.one("refund", BIG)
    assert code(again) == -41002 and again["error"]["data"]["request_id"] == request_id
    assert h.store.events_for(action_id=again["error"]["data"]["action_id"]) == ()
    assert h.receipts() == []
