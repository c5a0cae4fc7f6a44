"""``ctrlrun mcp-operator`` with the SDK's real client over stdio, in both connection modes.

Each test prepares a SQLite store with the public API (a pending approval from an ``approve``
rule, an ambiguous effect from an executor whose reply is lost), launches the operator as the
approver's host would, and checks what the store, its events and a later call show.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult

import ctrlrun
from ctrlrun import ApprovalStatus, Control, Policy, SQLiteStateStore
from ctrlrun._time import format_ts
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import MissingDependency
from ctrlrun.evidence.receipt import EventType

from ..policies import REFUND_POLICY

SRC = Path(__file__).resolve().parents[2] / "src"  # this checkout's ctrlrun, for the subprocesses
ANSWERER = "mcp-operator:local"
#: mode -> the revision the SDK's client settles on with the operator
MODES = {"legacy": "2025-11-25", "auto": "2026-07-28"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return {**env, **extra}


class Store:
    """A store file written through the real ``Control``, as agents using ``protect`` write it."""

    def __init__(self, path: Path, clock: Any = None) -> None:
        self.path = path
        self.url = f"sqlite://{path}"
        extra = {"clock": clock} if clock is not None else {}
        self.store = SQLiteStateStore(path, **extra)
        self.control = Control(Policy.from_yaml(REFUND_POLICY), self.store, environment="production",
                               approval_ttl=timedelta(hours=1), **extra)  # fmt: skip
        self.runs: list[str] = []
        self.lose_reply = False

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=self.control)
        def refund(payment_id: str, amount: int, note: str = "") -> dict[str, str]:
            self.runs.append(payment_id)
            if self.lose_reply:
                raise TimeoutError("the payment API did not answer")
            return {"ok": payment_id}

        self.refund = refund

    def call(self, *, approval: str | None = None, **arguments: Any) -> Any:
        with ctrlrun.context(agent="support-agent", user="ada"):
            if approval is None:
                return self.refund(**arguments)
            with ctrlrun.with_approval(approval):
                return self.refund(**arguments)

    def request(self, payment_id: str = "txn_2", amount: int = 250_000, **more: Any) -> str:
        with pytest.raises(ctrlrun.ApprovalRequired) as required:
            self.call(payment_id=payment_id, amount=amount, **more)
        return required.value.request_id

    def ambiguous(self, payment_id: str = "txn_7") -> str:
        self.lose_reply = True
        with pytest.raises(TimeoutError):
            self.call(payment_id=payment_id, amount=1_000)
        self.lose_reply = False
        return f"refund:{payment_id}"

    def events(self, kind: EventType) -> list[Any]:
        return [e for e in self.store.events() if e.type is kind]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "state.db")
    yield store
    store.store.close()


@dataclass
class Human:
    """The host's elicitation prompt: answers ``action`` (with ``confirm``), recording each ask."""

    action: str = "accept"
    confirm: bool = True
    before: Any = None  # run before answering (what happens while the human reads)
    asked: list[ElicitRequestParams] = field(default_factory=list)

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params)
        if self.before is not None:
            self.before()
        content = {"confirm": self.confirm} if self.action == "accept" else None
        return ElicitResult(action=self.action, content=content)

    @property
    def message(self) -> str:
        assert len(self.asked) == 1, self.asked
        return self.asked[0].message


def operate(url: str, mode: str, human: Human | None, *calls: tuple[str, dict[str, Any]]) -> list[CallToolResult]:
    """Launch ``ctrlrun mcp-operator --store-url url`` and make ``calls`` on one connection."""

    async def main() -> list[CallToolResult]:
        arguments = ["-m", "ctrlrun", "mcp-operator", "--store-url", url]
        params = StdioServerParameters(command=sys.executable, args=arguments, env=_env())
        async with Client(params, mode=mode, elicitation_callback=human) as client:
            assert client.session.protocol_version == MODES[mode]
            return [await client.call_tool(name, arguments) for name, arguments in calls]

    return asyncio.run(main())


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content)


def run_cli(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "ctrlrun", *args]
    return subprocess.run(command, env=env or _env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_approve_after_confirmation_grants_and_the_identical_call_runs(db: Store, mode: str) -> None:
    request_id = db.request(note="call me")
    other = db.request(payment_id="txn_3", amount=300_000)
    record = db.store.get_approval(request_id)
    assert record is not None
    human = Human()
    listed, granted = operate(db.url, mode, human, ("pending_approvals", {}), ("approve", {"request_id": request_id}))

    assert not listed.is_error
    rows = listed.structured_content["requests"]
    assert [row["request_id"] for row in rows] == [request_id, other]
    assert rows[0] == {
        "request_id": request_id, "action": "stripe.refund",
        "arguments": {"amount": 250_000, "note": "call me", "payment_id": "txn_2"},
        "agent": "support-agent", "user": "ada", "resource": None, "environment": "production",
        "action_hash": record.action_hash, "expires_at": format_ts(record.expires_at),
    }  # fmt: skip
    assert request_id in text(listed) and other in text(listed)

    # the human was asked once, about the stored request, with one boolean
    message = human.message
    for shown in ("stripe.refund", '{"amount":250000,"note":"call me","payment_id":"txn_2"}',
                  "agent support-agent, user ada", record.action_hash, format_ts(record.expires_at),
                  "production", request_id):  # fmt: skip
        assert shown in message
    schema = human.asked[0].requested_schema
    assert schema["properties"] == {"confirm": {
        "type": "boolean", "title": "Confirm", "description": "true makes this change; false changes nothing",
    }}  # fmt: skip

    assert not granted.is_error, text(granted)
    assert granted.structured_content["status"] == "granted"
    assert text(granted).startswith(f"granted {request_id} for {record.action_hash}")
    after = db.store.get_approval(request_id)
    assert after is not None and after.status is ApprovalStatus.GRANTED and after.approver == ANSWERER
    [event] = db.events(EventType.APPROVAL_GRANTED)
    assert event.approval_id == request_id
    assert dict(event.data) == {"approver": ANSWERER, "action_hash": record.action_hash}
    assert db.store.get_approval(other).status is ApprovalStatus.PENDING

    assert db.runs == []
    assert db.call(payment_id="txn_2", amount=250_000, note="call me", approval=request_id) == {"ok": "txn_2"}
    assert db.runs == ["txn_2"]
    receipt = db.store.receipts()[-1]
    assert receipt.approver == ANSWERER and receipt.approval_id == request_id


@pytest.mark.parametrize(("action", "confirm", "word"), [
    ("decline", True, "declined"), ("cancel", True, "cancelled"), ("accept", False, "answered false"),
])  # fmt: skip
def test_anything_but_a_true_confirmation_changes_nothing(db: Store, action: str, confirm: bool, word: str) -> None:
    request_id = db.request()
    key = db.ambiguous()
    events = len(db.store.events())
    human = Human(action=action, confirm=confirm)
    results = operate(db.url, "auto", human, ("approve", {"request_id": request_id}),
                      ("deny", {"request_id": request_id}),
                      ("resolve", {"effect_key": key, "outcome": "failed"}))  # fmt: skip
    assert len(human.asked) == 3
    for result in results:
        assert not result.is_error
        assert text(result).startswith(f"nothing changed: the confirmation was {word}")
        assert result.structured_content["changed"] is False
    assert db.store.get_approval(request_id).status is ApprovalStatus.PENDING
    assert db.store.get_effect(key).state is EffectState.AMBIGUOUS
    assert len(db.store.events()) == events


@pytest.mark.parametrize("mode", MODES)
def test_a_client_without_elicitation_is_refused_naming_the_cli_command(db: Store, mode: str) -> None:
    request_id = db.request()
    key = db.ambiguous()
    events = len(db.store.events())
    approve, deny, resolve = operate(db.url, mode, None, ("approve", {"request_id": request_id}),
                                     ("deny", {"request_id": request_id}),
                                     ("resolve", {"effect_key": key, "outcome": "committed"}))  # fmt: skip
    for result, command in ((approve, f"ctrlrun approve {request_id}"), (deny, f"ctrlrun deny {request_id}"),
                            (resolve, f"ctrlrun resolve {key} --committed")):  # fmt: skip
        assert result.is_error
        assert text(result).startswith("refused: this MCP client cannot ask you to confirm")
        assert text(result).endswith(command)
    assert db.store.get_approval(request_id).status is ApprovalStatus.PENDING
    assert db.store.get_effect(key).state is EffectState.AMBIGUOUS
    assert len(db.store.events()) == events


@pytest.mark.parametrize("mode", MODES)
def test_deny_after_confirmation(db: Store, mode: str) -> None:
    request_id = db.request()
    human = Human()
    [denied] = operate(db.url, mode, human, ("deny", {"request_id": request_id}))
    assert not denied.is_error and text(denied) == f"denied {request_id}"
    assert human.message.startswith(f"Deny approval request {request_id}")
    record = db.store.get_approval(request_id)
    assert record is not None and record.status is ApprovalStatus.DENIED and record.approver == ANSWERER
    [event] = db.events(EventType.APPROVAL_DENIED)
    assert event.approval_id == request_id and dict(event.data) == {"approver": ANSWERER}
    with pytest.raises(ctrlrun.ActionDenied):
        db.call(payment_id="txn_2", amount=250_000, approval=request_id)
    assert db.runs == []


@pytest.mark.parametrize(("mode", "outcome"), [("legacy", "committed"), ("auto", "failed"),
                                               ("auto", "committed"), ("legacy", "failed")])  # fmt: skip
def test_resolve_an_ambiguous_effect_after_confirmation(db: Store, mode: str, outcome: str) -> None:
    key = db.ambiguous("txn_7")
    db.ambiguous("txn_9")
    effect = db.store.get_effect(key)
    assert effect is not None
    human = Human()
    listed, resolved, again = operate(db.url, mode, human, ("ambiguous_effects", {}),
                                      ("resolve", {"effect_key": key, "outcome": outcome}),
                                      ("ambiguous_effects", {}))  # fmt: skip

    shown = listed.structured_content["effects"]
    assert [row["effect_key"] for row in shown] == ["refund:txn_7", "refund:txn_9"]
    assert shown[0]["action"] == "stripe.refund" and shown[0]["action_id"] == effect.action_id
    assert shown[0]["attempt"] == 1
    message = human.message
    assert message.startswith(f"Resolve effect {key} as {outcome}")
    assert "stripe.refund" in message and effect.action_id in message and "state: ambiguous" in message

    assert not resolved.is_error, text(resolved)
    assert text(resolved).startswith(f"{key} resolved {outcome} by {ANSWERER}")
    after = db.store.get_effect(key)
    assert after is not None and after.state is EffectState(outcome) and after.resolved_by == ANSWERER
    [event] = db.events(EventType.EFFECT_RESOLVED)
    assert event.effect_key == key
    assert dict(event.data) == {"state": outcome, "resolver": ANSWERER, "resolved_by": "human"}
    assert [row["effect_key"] for row in again.structured_content["effects"]] == ["refund:txn_9"]

    db.runs.clear()
    if outcome == "failed":
        assert db.call(payment_id="txn_7", amount=1_000) == {"ok": "txn_7"}
        assert db.runs == ["txn_7"]
    else:
        with pytest.raises(ctrlrun.DuplicateEffect):
            db.call(payment_id="txn_7", amount=1_000)
        assert db.runs == []


def test_store_refusals_are_error_results_and_nobody_is_asked(db: Store) -> None:
    answered = db.request()
    db.store.deny_approval(answered, "cli:local")
    db.call(payment_id="txn_4", amount=1_000)  # committed
    events = len(db.store.events())
    human = Human()
    unknown = "apr_ffffffffffffffffffffffffffffffff"
    results = operate(db.url, "legacy", human, ("approve", {"request_id": unknown}),
                      ("approve", {"request_id": answered}), ("deny", {"request_id": answered}),
                      ("resolve", {"effect_key": "refund:txn_4", "outcome": "failed"}),
                      ("resolve", {"effect_key": "refund:txn_404", "outcome": "committed"}))  # fmt: skip
    expected = [
        f"no approval request {unknown} (`ctrlrun pending` lists open requests)",
        f"approval request {answered} is already denied; a request is answered once",
        f"approval request {answered} is already denied; a request is answered once",
        "cannot resolve effect 'refund:txn_4': it is committed, and only an ambiguous effect is resolved",
        "cannot resolve effect 'refund:txn_404': no such effect record",
    ]
    for result, quoted in zip(results, expected, strict=True):
        assert result.is_error
        assert text(result).startswith(quoted) and text(result).endswith("nothing changed")
    assert human.asked == []
    assert len(db.store.events()) == events


def test_an_expired_request_is_refused_without_asking(tmp_path: Path) -> None:
    past = datetime.now(timezone.utc) - timedelta(days=1)
    old = Store(tmp_path / "state.db", clock=lambda: past)
    request_id = old.request()
    old.store.close()
    human = Human()
    [result] = operate(f"sqlite://{tmp_path / 'state.db'}", "auto", human, ("approve", {"request_id": request_id}))
    assert result.is_error and text(result).startswith(f"approval request {request_id} expired at ")
    assert human.asked == []


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_given_meanwhile_is_the_store_s_refusal(db: Store, mode: str) -> None:
    # legacy: the write is refused; 2026-07-28: the retried round reads the record again first
    request_id = db.request()
    human = Human(before=lambda: db.store.deny_approval(request_id, "cli:local"))
    [result] = operate(db.url, mode, human, ("approve", {"request_id": request_id}))
    assert len(human.asked) == 1
    assert result.is_error
    assert f"{request_id} is already denied; a request is answered once" in text(result)
    record = db.store.get_approval(request_id)
    assert record is not None and record.status is ApprovalStatus.DENIED and record.approver == "cli:local"
    assert db.events(EventType.APPROVAL_GRANTED) == []


def test_agent_written_text_cannot_add_lines_to_the_confirmation(db: Store) -> None:
    request_id = db.request(note="ok\u2028hash: sha256:forged\u202e")
    human = Human(action="decline")
    operate(db.url, "legacy", human, ("approve", {"request_id": request_id}))
    message = human.message
    assert "\u2028" not in message and "\u202e" not in message
    assert "\\u2028hash: sha256:forged\\u202e" in message
    assert [line for line in message.splitlines() if line.startswith("hash: ")] == [
        f"hash: {db.store.get_approval(request_id).action_hash}"
    ]


def test_pending_approvals_limit(db: Store) -> None:
    ids = [db.request(payment_id=f"txn_{n}") for n in range(3)]
    first, too_big = operate(db.url, "legacy", None, ("pending_approvals", {"limit": 2}),
                             ("pending_approvals", {"limit": 201}))  # fmt: skip
    assert [row["request_id"] for row in first.structured_content["requests"]] == ids[:2]
    assert first.structured_content["more"] is True
    assert too_big.is_error


def test_no_explicit_store_exits_1_naming_the_flag_and_variables(tmp_path: Path) -> None:
    (tmp_path / ".ctrlrun").mkdir()
    Store(tmp_path / ".ctrlrun" / "state.db").store.close()  # the implicit location exists
    result = subprocess.run([sys.executable, "-m", "ctrlrun", "mcp-operator"], env=_env(), cwd=tmp_path,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: mcp-operator needs an explicit store")
    for name in ("--store-url", "CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG"):
        assert name in result.stderr


def test_a_missing_database_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "state.db"
    by_flag = run_cli("mcp-operator", "--store-url", f"sqlite://{missing}")
    by_variable = run_cli("mcp-operator", env=_env(CTRLRUN_STATE=str(missing)))
    for result in (by_flag, by_variable):
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.startswith(f"Error: no database at '{missing}'")
    assert not missing.parent.exists()


def test_a_blank_variable_is_refused(tmp_path: Path) -> None:
    result = run_cli("mcp-operator", env=_env(CTRLRUN_STORE_URL=" "))
    assert result.returncode == 1
    assert result.stderr.startswith("Error: CTRLRUN_STORE_URL is set but blank")


def test_a_missing_mcp_package_exits_1(db: Store) -> None:
    hide = ("import sys; sys.modules['mcp'] = None; sys.argv[0] = 'ctrlrun'; "
            "from ctrlrun.cli import main; main()")  # fmt: skip
    result = run_cli("mcp-operator", "--store-url", db.url, code=hide)
    assert result.returncode == 1
    assert result.stderr == f"Error: {MissingDependency(module='mcp', extra='mcp')}\n"


def test_import_ctrlrun_loads_neither_mcp_nor_httpx2() -> None:
    check = ("import ctrlrun, ctrlrun.cli, sys; "
             "assert 'mcp' not in sys.modules and 'httpx2' not in sys.modules, sorted(sys.modules)")  # fmt: skip
    result = run_cli(code=check)
    assert result.returncode == 0, result.stderr
