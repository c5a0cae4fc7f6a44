"""ctrlrun_langgraph against real LangGraph (InMemorySaver) and ctrlrun's SQLite store, offline."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from ctrlrun_langgraph import CHANNEL, RESUME_SHAPE, LangGraphInterrupt
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from ctrlrun import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    Control,
    DuplicateEffect,
    InMemoryStateStore,
    InvalidArgument,
    Policy,
    SQLiteStateStore,
    context,
    protect,
    with_approval,
)
from ctrlrun.adapter import (
    ApprovalAnswer,
    FrameworkInterrupt,
    InterruptApprovalProvider,
)
from ctrlrun.identity import StaticIdentityProvider

# The starter policy's refund rules: up to 500.00 runs, up to 5,000.00 needs a human.
REFUND_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 500000 }
        decision: approve
      - decision: deny
"""

PAYLOAD_KEYS = {
    "request_id", "action_id", "action", "action_hash", "arguments", "resource",
    "environment", "agent", "user", "created_at", "expires_at",
}  # fmt: skip


def events(store) -> list[str]:
    return [str(e.type) for e in store.events()]


def statuses(store) -> list[str]:
    ids = [e.approval_id for e in store.events() if str(e.type) == "APPROVAL_REQUESTED"]
    return [str(store.get_approval(i).status) for i in ids]


# --------------------------------------------------------------------------- the must-show program


@pytest.fixture
def refund_app(tmp_path, monkeypatch):
    """The issue's program, as written: SQLiteStateStore(".ctrlrun/state.db") and ctrlrun.yaml."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ctrlrun.yaml").write_text(REFUND_POLICY)
    opened = []

    def build(*, lose_reply: set[str] = frozenset()):
        lose_reply = set(lose_reply)
        stripe: list[tuple[str, int]] = []

        # --- as in the issue --------------------------------------------------------------
        store = SQLiteStateStore(".ctrlrun/state.db")
        control = Control(Policy.from_file("ctrlrun.yaml"), store,
            approvals=InterruptApprovalProvider(store, LangGraphInterrupt(carries_approved_arguments=True)))  # fmt: skip

        @protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
        def issue_refund(payment_id: str, amount: int) -> str:
            stripe.append((payment_id, amount))
            if payment_id in lose_reply:
                lose_reply.discard(payment_id)
                raise TimeoutError("stripe: the refund was sent, the reply was lost")
            return f"re_{payment_id}"

        def refund_node(state: dict) -> dict:
            with context(agent="refund-agent"):
                return {"status": issue_refund(payment_id=state["payment_id"], amount=state["amount"])}
        # ------------------------------------------------------------------------------------

        builder = StateGraph(dict)
        builder.add_node("refund", refund_node)
        builder.add_edge(START, "refund")
        builder.add_edge("refund", END)
        graph = builder.compile(checkpointer=InMemorySaver())
        opened.append(store)
        return SimpleNamespace(store=store, graph=graph, stripe=stripe, issue_refund=issue_refund)

    yield build
    for store in opened:
        store.close()


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def pause(app, name: str = "t-1", payment_id: str = "txn_2", amount: int = 250_000) -> dict:
    first = app.graph.invoke({"payment_id": payment_id, "amount": amount}, thread(name))
    (interrupt,) = first["__interrupt__"]
    return interrupt.value


def test_a_2500_refund_pauses_with_the_action_and_its_arguments(refund_app):
    app = refund_app()
    shown = pause(app)
    assert set(shown) == PAYLOAD_KEYS
    assert shown["action"] == "stripe.refund"
    assert shown["arguments"] == {"payment_id": "txn_2", "amount": 250_000}
    assert shown["agent"] == "refund-agent" and shown["user"] is None
    assert json.loads(json.dumps(shown)) == shown
    # left unanswered: nothing ran, nothing granted or reserved, no receipt
    assert app.stripe == [] and app.store.receipts() == ()
    assert app.store.get_effect("refund:txn_2") is None
    assert events(app.store) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]
    assert str(app.store.get_approval(shown["request_id"]).status) == "pending"
    # the checkpoint holds the same payload
    (held,) = app.graph.get_state(thread("t-1")).interrupts
    assert held.value == shown


def test_small_refunds_run_without_a_human(refund_app):
    app = refund_app()
    state = app.graph.invoke({"payment_id": "txn_1", "amount": 40_000}, thread("small"))
    assert state["status"] == "re_txn_1" and "__interrupt__" not in state
    assert app.store.receipts()[-1].decision == "allow"


def test_approving_with_the_arguments_shown_runs_once(refund_app):
    app = refund_app()
    shown = pause(app)
    done = app.graph.invoke(
        Command(resume={"approved": True, "approver": "ada@example.com",
                        "arguments": shown["arguments"]}), thread("t-1"))  # fmt: skip
    assert done["status"] == "re_txn_2"
    assert app.stripe == [("txn_2", 250_000)]
    (receipt,) = app.store.receipts()
    assert (receipt.decision, receipt.result) == ("approve", "committed")
    assert receipt.approver == "ada@example.com"
    # node replay: a second request, bound to the same content; the first is orphaned
    assert receipt.action_hash == shown["action_hash"]
    assert receipt.action_id != shown["action_id"]
    assert receipt.approval_id != shown["request_id"]
    assert statuses(app.store) == ["pending", "consumed"]
    assert str(app.store.get_effect("refund:txn_2").state) == "committed"

    # the agent tries again on another thread: refused at once, nobody is asked again
    with pytest.raises(DuplicateEffect) as duplicate:
        app.graph.invoke({"payment_id": "txn_2", "amount": 250_000}, thread("t-2"))
    assert duplicate.value.state == "committed"
    assert app.stripe == [("txn_2", 250_000)]
    assert statuses(app.store) == ["pending", "consumed"]  # no third request


def test_resuming_with_other_arguments_is_a_mismatch_and_runs_nothing(refund_app):
    app = refund_app()
    shown = pause(app)
    with pytest.raises(ApprovalMismatch) as mismatch:
        app.graph.invoke(
            Command(resume={"approved": True, "approver": "ada@example.com",
                            "arguments": {"payment_id": "txn_2", "amount": 25_000_000}}),
            thread("t-1"),
        )  # fmt: skip
    assert mismatch.value.reason == "mismatch"
    assert app.stripe == [] and app.store.receipts() == ()
    assert app.store.get_effect("refund:txn_2") is None
    assert statuses(app.store) == ["pending", "pending"]
    assert "APPROVAL_GRANTED" not in events(app.store)

    # LangGraph keeps the failed resume value for this thread: a corrected one is not seen
    with pytest.raises(ApprovalMismatch):
        app.graph.invoke(Command(resume={"approved": True, "arguments": shown["arguments"]}),
                         thread("t-1"))  # fmt: skip
    assert statuses(app.store) == ["pending", "pending", "pending"]

    # the approval is still grantable for exactly the action shown (as `ctrlrun approve` does)
    app.store.grant_approval(shown["request_id"], "ada@example.com")
    with context(agent="refund-agent"), with_approval(shown["request_id"]):
        assert app.issue_refund(payment_id="txn_2", amount=250_000) == "re_txn_2"
    assert app.stripe == [("txn_2", 250_000)]
    assert app.store.receipts()[-1].approver == "ada@example.com"


def test_refusing_records_who_said_no(refund_app):
    app = refund_app()
    pause(app)
    with pytest.raises(ActionDenied) as refused:
        app.graph.invoke(Command(resume={"approved": False, "approver": "bob@example.com"}),
                         thread("t-1"))  # fmt: skip
    assert refused.value.reason == "approval_denied"
    assert app.stripe == []
    (receipt,) = app.store.receipts()
    assert (receipt.decision, receipt.result, receipt.approver) == ("approve", "denied",
                                                                    "bob@example.com")  # fmt: skip
    denied = [e for e in app.store.events() if str(e.type) == "APPROVAL_DENIED"]
    # the answer's own event (written with the denial), then the presenting pass's
    assert [e.data["approver"] for e in denied] == ["bob@example.com", "bob@example.com"]
    assert statuses(app.store) == ["pending", "denied"]


def test_a_bare_false_refuses_on_the_channel(refund_app):
    app = refund_app()
    pause(app)
    with pytest.raises(ActionDenied):
        app.graph.invoke(Command(resume=False), thread("t-1"))
    assert app.store.receipts()[-1].approver == CHANNEL


@pytest.mark.parametrize(
    "resume",
    [
        "yes",
        "true",
        1,
        [],
        True,  # a bare grant carries no arguments: refused under prevention
        {"approved": "yes"},
        {"approved": 1},
        {"approver": "ada@example.com"},
        {"approved": True, "arguments": ["txn_2", 250_000]},
        {"approved": True, "approver": "ada", "args": {"payment_id": "txn_2"}},
    ],
    ids=repr,
)
def test_malformed_resume_values_are_refused_and_nothing_runs(refund_app, resume):
    app = refund_app()
    pause(app)
    with pytest.raises(InvalidArgument) as invalid:
        app.graph.invoke(Command(resume=resume), thread("t-1"))
    assert RESUME_SHAPE in str(invalid.value) and repr(resume) in str(invalid.value)
    assert app.stripe == [] and app.store.receipts() == ()
    assert app.store.get_effect("refund:txn_2") is None
    assert set(statuses(app.store)) == {"pending"}


def test_a_non_string_approver_passes_the_adapter_and_core_refuses_it(refund_app):
    app = refund_app()
    shown = pause(app)
    with pytest.raises(InvalidArgument):
        app.graph.invoke(Command(resume={"approved": True, "approver": 42,
                                         "arguments": shown["arguments"]}), thread("t-1"))  # fmt: skip
    assert app.stripe == [] and app.store.receipts() == ()


@pytest.mark.parametrize("resolution", ["committed", "failed"])
def test_a_lost_reply_is_ambiguous_and_a_rerun_is_refused_until_resolved(refund_app, resolution):
    app = refund_app(lose_reply={"txn_2"})
    shown = pause(app)
    with pytest.raises(TimeoutError):
        app.graph.invoke(Command(resume={"approved": True, "approver": "ada@example.com",
                                         "arguments": shown["arguments"]}), thread("t-1"))  # fmt: skip
    assert app.stripe == [("txn_2", 250_000)]
    assert str(app.store.get_effect("refund:txn_2").state) == "ambiguous"
    assert app.store.receipts()[-1].result == "ambiguous"

    # re-running the thread replays the answer; ctrlrun refuses a blind retry
    for _ in range(2):
        with pytest.raises(AmbiguousEffect):
            app.graph.invoke(None, thread("t-1"))
    assert app.stripe == [("txn_2", 250_000)]
    assert app.store.receipts()[-1].result == "blocked"

    # what `ctrlrun resolve refund:txn_2 --committed` / `--failed` does
    app.store.resolve_effect("refund:txn_2", resolution, "ops@example.com")
    if resolution == "committed":
        with pytest.raises(DuplicateEffect):
            app.graph.invoke(None, thread("t-1"))
        assert app.stripe == [("txn_2", 250_000)]
    else:  # it provably did not happen: the re-run refunds, attempt 2
        assert app.graph.invoke(None, thread("t-1"))["status"] == "re_txn_2"
        assert app.stripe == [("txn_2", 250_000)] * 2
        assert app.store.get_effect("refund:txn_2").attempt == 2


# --------------------------------------------------------------------------- replay facts

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  billing.credit: {decision: approve}\n"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def credit_app(*, effect: bool = True, carries: bool = True, interrupt: Any = None):
    clock = Clock()
    store = InMemoryStateStore(clock=clock)
    interrupt = interrupt or LangGraphInterrupt(carries_approved_arguments=carries)
    control = Control(Policy.from_yaml(POLICY), store,
                      InterruptApprovalProvider(store, interrupt, clock=clock), clock=clock,
                      identity=StaticIdentityProvider("billing-bot"), environment="dev")  # fmt: skip
    ran: list[tuple[str, int]] = []

    @protect("billing.credit", effect="credit:{invoice}" if effect else None, wait=True,
             control=control)  # fmt: skip
    def credit(invoice: str, cents: int) -> str:
        ran.append((invoice, cents))
        return f"credited {cents} on {invoice}"

    def graph_of(node):
        builder = StateGraph(dict)
        builder.add_node("node", node)
        builder.add_edge(START, "node")
        builder.add_edge("node", END)
        return builder.compile(checkpointer=InMemorySaver())

    single = graph_of(lambda s: {"result": credit(invoice=s["invoice"], cents=s["cents"])})
    double = graph_of(lambda s: {"result": [credit(invoice="i-1", cents=1),
                                            credit(invoice="i-2", cents=2)]})  # fmt: skip
    return SimpleNamespace(store=store, clock=clock, ran=ran, single=single, double=double)


def test_spec_example_runs(tmp_path):
    app = credit_app()
    cfg = thread("inv-42")
    first = app.single.invoke({"invoice": "inv-42", "cents": 1200}, cfg)
    shown = first["__interrupt__"][0].value
    assert app.store.receipts() == () and shown["agent"] == "billing-bot"
    done = app.single.invoke(Command(resume={"approved": True, "approver": "alice@ops",
                                             "arguments": shown["arguments"]}), cfg)  # fmt: skip
    assert done["result"] == "credited 1200 on inv-42"
    receipt = app.store.receipts()[-1]
    assert receipt.approver == "alice@ops"
    assert receipt.action_hash == shown["action_hash"]
    assert receipt.action_id != shown["action_id"]
    assert str(app.store.get_approval(shown["request_id"]).status) == "pending"
    assert events(app.store).count("APPROVAL_REQUESTED") == 2
    # the orphan is grantable by `ctrlrun approve` until its TTL; single use, same hash
    app.store.grant_approval(shown["request_id"], "cli:local")
    assert app.store.get_approval(shown["request_id"]).action_hash == receipt.action_hash


def test_the_request_ttl_does_not_bound_the_humans_answer():
    app = credit_app()
    cfg = thread("late")
    shown = app.single.invoke({"invoice": "inv-1", "cents": 5}, cfg)["__interrupt__"][0].value
    app.clock.now += timedelta(hours=3)  # R1 expired long ago
    done = app.single.invoke(Command(resume={"approved": True, "arguments": shown["arguments"]}),
                             cfg)  # fmt: skip
    assert done["result"] == "credited 5 on inv-1"
    receipt = app.store.receipts()[-1]
    assert receipt.approver == CHANNEL  # no approver in the resume value: the channel
    assert str(app.store.get_approval(receipt.approval_id).status) == "consumed"


def test_two_gated_calls_in_one_node_with_effect_keys_fail_on_the_second_resume():
    app = credit_app(effect=True)
    cfg = thread("two")
    first = app.double.invoke({}, cfg)["__interrupt__"][0].value
    second = app.double.invoke(Command(resume={"approved": True, "arguments": first["arguments"]}),
                               cfg)["__interrupt__"][0].value  # fmt: skip
    assert app.ran == [("i-1", 1)] and second["arguments"] == {"invoice": "i-2", "cents": 2}
    with pytest.raises(DuplicateEffect):
        app.double.invoke(Command(resume={"approved": True, "arguments": second["arguments"]}), cfg)
    assert app.ran == [("i-1", 1)]


def test_two_gated_calls_in_one_node_without_effect_keys_run_the_first_again():
    app = credit_app(effect=False)
    cfg = thread("two")
    first = app.double.invoke({}, cfg)["__interrupt__"][0].value
    second = app.double.invoke(Command(resume={"approved": True, "arguments": first["arguments"]}),
                               cfg)["__interrupt__"][0].value  # fmt: skip
    done = app.double.invoke(Command(resume={"approved": True, "arguments": second["arguments"]}),
                             cfg)  # fmt: skip
    assert done["result"] == ["credited 1 on i-1", "credited 2 on i-2"]
    assert app.ran == [("i-1", 1), ("i-1", 1), ("i-2", 2)]  # the documented hazard


class SpyInterrupt(LangGraphInterrupt):
    def __init__(self) -> None:
        super().__init__(carries_approved_arguments=True)
        self.answered: list[Any] = []

    def answer(self, resume: Any) -> ApprovalAnswer:
        self.answered.append(resume)
        return super().answer(resume)


def test_empty_and_none_resume_values_never_reach_the_adapter():
    spy = SpyInterrupt()
    app = credit_app(interrupt=spy)
    cfg = thread("odd")
    app.single.invoke({"invoice": "inv-1", "cents": 5}, cfg)
    again = app.single.invoke(Command(resume={}), cfg)  # an empty interrupt-id map
    assert "__interrupt__" in again
    with pytest.raises(Exception):  # noqa: B017 - LangGraph's own, version-dependent error
        app.single.invoke(Command(resume=None), cfg)  # fails inside LangGraph
    assert spy.answered == [] and app.ran == [] and app.store.receipts() == ()


def test_attribution_ignores_the_resume_arguments():
    app = credit_app(carries=False)
    cfg = thread("attr")
    app.single.invoke({"invoice": "inv-1", "cents": 5}, cfg)
    done = app.single.invoke(Command(resume={"approved": True, "approver": "ada",
                                             "arguments": {"invoice": "other"}}), cfg)  # fmt: skip
    assert done["result"] == "credited 5 on inv-1"
    app.single.invoke({"invoice": "inv-2", "cents": 5}, thread("bare"))
    assert app.single.invoke(Command(resume=True), thread("bare"))["result"] == "credited 5 on inv-2"
    assert app.store.receipts()[-1].approver == CHANNEL


# --------------------------------------------------------------------------- the interrupt itself


def test_constructor_requires_a_keyword_bool():
    with pytest.raises(TypeError):
        LangGraphInterrupt()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        LangGraphInterrupt(True)  # type: ignore[misc]
    for value in ("yes", 1, None):
        with pytest.raises(InvalidArgument):
            LangGraphInterrupt(carries_approved_arguments=value)  # type: ignore[arg-type]
    interrupt = LangGraphInterrupt(carries_approved_arguments=True)
    assert interrupt.framework == "langgraph" and interrupt.carries_approved_arguments is True
    assert isinstance(interrupt, FrameworkInterrupt)
    provider = InterruptApprovalProvider(InMemoryStateStore(), interrupt)
    assert (provider.framework, provider.carries_approved_arguments) == ("langgraph", True)


ARGS = {"payment_id": "txn_2", "amount": 250_000}


@pytest.mark.parametrize(
    ("carries", "resume", "expected"),
    [
        (False, True, (True, CHANNEL, None)),
        (False, False, (False, CHANNEL, None)),
        (True, False, (False, CHANNEL, None)),
        (True, {"approved": True, "approver": "ada", "arguments": ARGS}, (True, "ada", ARGS)),
        (True, {"approved": True, "arguments": ARGS}, (True, CHANNEL, ARGS)),
        (True, {"approved": True, "approver": "", "arguments": ARGS}, (True, CHANNEL, ARGS)),
        (True, {"approved": True}, (True, CHANNEL, None)),  # core: mismatch (no arguments)
        (True, {"approved": False, "approver": "bob"}, (False, "bob", None)),
        (False, {"approved": True, "approver": "ada", "arguments": ARGS}, (True, "ada", None)),
    ],
)
def test_answer_maps_accepted_resume_values(carries, resume, expected):
    answer = LangGraphInterrupt(carries_approved_arguments=carries).answer(resume)
    assert (answer.granted, answer.approver, answer.approved_arguments) == expected


@pytest.mark.parametrize("carries", [True, False])
@pytest.mark.parametrize(
    "resume",
    ["yes", "", 1, 0, 1.0, [], [True], None, {}, {"approved": "yes"}, {"approved": 1},
     {"approved": None}, {"approved": True, "arguments": "txn_2"}, {"approved": True, "extra": 1}],
    ids=repr,
)  # fmt: skip
def test_answer_refuses_everything_else(carries, resume):
    with pytest.raises(InvalidArgument) as invalid:
        LangGraphInterrupt(carries_approved_arguments=carries).answer(resume)
    assert RESUME_SHAPE in str(invalid.value)


def test_answer_refuses_a_bare_grant_under_prevention():
    with pytest.raises(InvalidArgument):
        LangGraphInterrupt(carries_approved_arguments=True).answer(True)


def test_a_truthy_non_string_approver_is_refused_by_core_not_the_adapter():
    with pytest.raises(InvalidArgument) as invalid:
        LangGraphInterrupt(carries_approved_arguments=False).answer({"approved": True, "approver": 42})
    assert "ApprovalAnswer approver" in str(invalid.value)
