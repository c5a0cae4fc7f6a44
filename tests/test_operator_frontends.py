"""One table of answers (grant, deny, resolve) run through every operator front-end: the CLI
(``ctrlrun approve|deny|resolve``), the console (HTTP, after login) and the MCP operator (an
in-process client session whose human confirms each elicitation). They share
``ctrlrun.operator``; this checks that they agree on what it does: the store state after the
answer, the events written (or none), and a refusal reported as each front-end reports one (the
CLI exits 1 with an ``Error:`` line, the console answers 4xx, the MCP tool result has
``isError``).

A ``@protect(wait=True)`` call whose request is answered by each front-end while it waits behaves
the same too: it runs once after a grant and raises the denial after a deny. The waiting call
polls the store through a ``LocalApprovalProvider`` whose ``sleep`` is the human answering (and
the test clock moving on): no real sleeps, no threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import ctrlrun
from ctrlrun import ActionDenied, ApprovalStatus, Control, EffectState, LocalApprovalProvider, Policy
from ctrlrun.cli.stores import Settings, open_operator_store
from ctrlrun.evidence.receipt import EventType

from ._cli_helpers import invoke
from .conftest import FakeClock

UNKNOWN_REQUEST = "apr_ffffffffffffffffffffffffffffffff"
UNKNOWN_KEY = "refund:txn_404"
ANSWER_EVENTS = frozenset({EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED, EventType.APPROVAL_EDITED,
                           EventType.EFFECT_RESOLVED})  # fmt: skip


# --------------------------------------------------------------------------- the project


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The console tests' project: a SQLite store written by a real Control under the starter
    policy (requests are asked by the user ``bob``), and a users file with ``ada`` in it."""
    pytest.importorskip("starlette")  # the project helper lives with the console's tests
    from .console._serve import START, Project

    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_CONSOLE_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    ctrlrun.reset()
    instance = Project(tmp_path, FakeClock(START))
    yield instance
    instance.store.close()
    ctrlrun.reset()


# --------------------------------------------------------------------------- the front-ends


@dataclass(frozen=True)
class Reply:
    """What a front-end reported: ``done``, ``refused`` (in its own refusal form), or ``other``
    (anything else: a crash, a usage error, a 5xx); ``detail`` is what it said, for failures."""

    kind: str
    detail: str


class Frontend:
    """One way a human answers: ``approve``, ``deny`` and ``resolve`` as that front-end does it."""

    name: str
    answerer: str  # who the store records as the approver or resolver

    def approve(self, request_id: str) -> Reply:
        raise NotImplementedError

    def deny(self, request_id: str) -> Reply:
        raise NotImplementedError

    def resolve(self, effect_key: str, outcome: str) -> Reply:
        raise NotImplementedError

    def close(self) -> None:
        pass


class CLI(Frontend):
    """``ctrlrun approve|deny|resolve --store-url …`` in process, on the project's clock."""

    name, answerer = "cli", "cli:local"

    def __init__(self, project: Any) -> None:
        self.project = project

    def _run(self, *args: str) -> Reply:
        result = invoke([*args, "--store-url", self.project.url], clock=self.project.clock)
        detail = f"exit {result.code}; stdout {result.out!r}; stderr {result.err!r}; {result.exception!r}"
        if result.code == 0 and result.exception is None:
            return Reply("done", detail)
        if result.code == 1 and result.exception is None and result.err.startswith("Error: "):
            return Reply("refused", detail)
        return Reply("other", detail)

    def approve(self, request_id: str) -> Reply:
        return self._run("approve", request_id)

    def deny(self, request_id: str) -> Reply:
        return self._run("deny", request_id)

    def resolve(self, effect_key: str, outcome: str) -> Reply:
        return self._run("resolve", effect_key, f"--{outcome}")


class Console(Frontend):
    """The console's forms, posted by ``ada`` after she logged in (a Starlette test client)."""

    name, answerer = "console", "console:ada"

    def __init__(self, project: Any) -> None:
        from .console._serve import console_client, login, token

        self._token = token
        self._context = console_client(project)
        self.client = self._context.__enter__()
        assert login(self.client, "ada").status_code == 303

    def _post(self, path: str, **data: str) -> Reply:
        response = self.client.post(path, data={"csrf_token": self._token(self.client), **data},
                                    follow_redirects=False)  # fmt: skip
        detail = f"HTTP {response.status_code} {response.headers.get('location', '')} {response.text[:2000]!r}"
        if response.status_code == 303:
            return Reply("done", detail)
        if 400 <= response.status_code < 500:
            return Reply("refused", detail)
        return Reply("other", detail)

    def approve(self, request_id: str) -> Reply:
        return self._post(f"/requests/{request_id}/approve")

    def deny(self, request_id: str) -> Reply:
        return self._post(f"/requests/{request_id}/deny")

    def resolve(self, effect_key: str, outcome: str) -> Reply:
        return self._post("/effects/resolve", effect_key=effect_key, state=outcome)

    def close(self) -> None:
        self._context.__exit__(None, None, None)


class MCP(Frontend):
    """The MCP operator (``build_server``) over the store opened as ``ctrlrun mcp-operator`` opens
    it, driven by the SDK's client in process; the human confirms every elicitation."""

    name, answerer = "mcp", "mcp-operator:local"

    def __init__(self, project: Any, mode: str) -> None:
        pytest.importorskip("mcp")
        from ctrlrun.gateway.operator import build_server

        from .gateway.test_operator import Human

        self.mode = mode
        self.human = Human()
        self._context = open_operator_store(Settings(clock=project.clock), project.url)
        self.server = build_server(self._context.__enter__(), clock=project.clock)

    def _call(self, tool: str, arguments: dict[str, Any]) -> Reply:
        from mcp import Client

        async def main() -> Any:
            async with Client(self.server, mode=self.mode, elicitation_callback=self.human) as client:
                return await client.call_tool(tool, arguments)

        result = asyncio.run(main())
        said = "\n".join(getattr(block, "text", "") for block in result.content)
        detail = f"isError={result.is_error}; {said!r}; {result.structured_content!r}"
        if result.is_error:
            return Reply("refused", detail)
        if (result.structured_content or {}).get("changed") is True:
            return Reply("done", detail)
        return Reply("other", detail)

    def approve(self, request_id: str) -> Reply:
        return self._call("approve", {"request_id": request_id})

    def deny(self, request_id: str) -> Reply:
        return self._call("deny", {"request_id": request_id})

    def resolve(self, effect_key: str, outcome: str) -> Reply:
        return self._call("resolve", {"effect_key": effect_key, "outcome": outcome})

    def close(self) -> None:
        self._context.__exit__(None, None, None)


FRONTENDS: dict[str, Callable[[Any], Frontend]] = {
    "cli": CLI,
    "console": Console,
    "mcp-legacy": lambda project: MCP(project, "legacy"),
    "mcp-auto": lambda project: MCP(project, "auto"),
}


@pytest.fixture(params=list(FRONTENDS))
def frontend(request: pytest.FixtureRequest, project: Any) -> Iterator[Frontend]:
    instance = FRONTENDS[request.param](project)
    yield instance
    instance.close()


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Case:
    """One answer: ``setup`` prepares the store and returns the subject (request id or effect
    key); ``act`` is ``approve``, ``deny``, ``resolve-committed`` or ``resolve-failed``.

    ``status`` is the request's status after it (None: no such request) or, for a resolve, the
    effect's state (None: no such effect); ``events`` the event types the answer writes, in
    order (none for a refusal). ``answered_by``: the record and the event name the answerer
    (else the record keeps whoever answered before, if anyone)."""

    name: str
    setup: Callable[[Any], str]
    act: str
    reply: str
    status: str | None
    events: tuple[EventType, ...] = ()
    answered_by: bool = False


def _pending(project: Any) -> str:
    return project.request()


def _unknown_request(project: Any) -> str:
    return UNKNOWN_REQUEST


def _granted(project: Any) -> str:
    request_id = project.request()
    project.store.grant_approval(request_id, "setup:first")
    return request_id


def _denied(project: Any) -> str:
    request_id = project.request()
    project.store.deny_approval(request_id, "setup:first")
    return request_id


def _expired(project: Any) -> str:
    request_id = project.request()
    record = project.store.get_approval(request_id)
    project.clock.set(record.expires_at + timedelta(seconds=1))  # every front-end reads this clock
    return request_id


def _ambiguous(project: Any) -> str:
    return project.ambiguous("txn_9")


def _unknown_key(project: Any) -> str:
    return UNKNOWN_KEY


def _committed(project: Any) -> str:
    project.call(payment_id="txn_5", amount=100)  # allowed: it runs and commits
    return "refund:txn_5"


GRANTED, DENIED, EXPIRED = ApprovalStatus.GRANTED.value, ApprovalStatus.DENIED.value, ApprovalStatus.EXPIRED.value

CASES = [
    Case("grant-pending", _pending, "approve", "done", GRANTED, (EventType.APPROVAL_GRANTED,), answered_by=True),
    Case("deny-pending", _pending, "deny", "done", DENIED, (EventType.APPROVAL_DENIED,), answered_by=True),
    Case("grant-unknown", _unknown_request, "approve", "refused", None),
    Case("deny-unknown", _unknown_request, "deny", "refused", None),
    Case("grant-granted", _granted, "approve", "refused", GRANTED),
    Case("deny-granted", _granted, "deny", "refused", GRANTED),
    Case("grant-denied", _denied, "approve", "refused", DENIED),
    # Answering a request past its expiry marks it expired, as the store's own rule does (and as
    # `ctrlrun approve` is tested to do); nothing is granted and no event is written.
    Case("grant-expired", _expired, "approve", "refused", EXPIRED),
    Case("deny-expired", _expired, "deny", "refused", EXPIRED),
    Case("resolve-ambiguous-committed", _ambiguous, "resolve-committed", "done", EffectState.COMMITTED.value,
         (EventType.EFFECT_RESOLVED,), answered_by=True),
    Case("resolve-ambiguous-failed", _ambiguous, "resolve-failed", "done", EffectState.FAILED.value,
         (EventType.EFFECT_RESOLVED,), answered_by=True),
    Case("resolve-unknown", _unknown_key, "resolve-committed", "refused", None),
    Case("resolve-not-ambiguous", _committed, "resolve-committed", "refused", EffectState.COMMITTED.value),
]

#: (case, front-end) pairs whose stored status differs, on purpose, and why. The MCP operator
#: refuses an expired request before its human is asked anything and writes nothing without a
#: confirmed answer, so the request keeps the status it has in the store (pending, past its expiry:
#: no listing shows it, no answer can grant it); every other outcome is the same as elsewhere.
UNWRITTEN = {
    (case, frontend): ApprovalStatus.PENDING.value
    for case in ("grant-expired", "deny-expired")
    for frontend in ("mcp-legacy", "mcp-auto")
}


def _params() -> list[Any]:
    params = []
    for case in CASES:
        for name in FRONTENDS:
            params.append(pytest.param(case, name, id=f"{case.name}-{name}"))
    return params


def _act(frontend: Frontend, act: str, subject: str) -> Reply:
    if act == "approve":
        return frontend.approve(subject)
    if act == "deny":
        return frontend.deny(subject)
    verb, _, outcome = act.partition("-")
    assert verb == "resolve"
    return frontend.resolve(subject, outcome)


@dataclass
class Snapshot:
    """What the store holds about one subject, and everything else that could have been written."""

    record: Any
    events: list[Any] = field(default_factory=list)
    receipts: int = 0
    approvals: dict[str, Any] = field(default_factory=dict)
    effects: dict[str, Any] = field(default_factory=dict)


def _snapshot(project: Any, case: Case, subject: str) -> Snapshot:
    store = project.store
    resolving = case.act.startswith("resolve")
    record = store.get_effect(subject) if resolving else store.get_approval(subject)
    pending = {r.approval_id: r for r in store.pending_approvals()}
    effects = {r.effect_key: r for r in store.iter_effects()}
    return Snapshot(record, list(store.events()), len(store.receipts()), pending, effects)


@pytest.mark.parametrize(("case", "frontend_name"), _params())
def test_every_frontend_answers_the_same(project: Any, case: Case, frontend_name: str) -> None:
    subject = case.setup(project)
    frontend = FRONTENDS[frontend_name](project)
    try:
        before = _snapshot(project, case, subject)
        reply = _act(frontend, case.act, subject)
    finally:
        frontend.close()
    after = _snapshot(project, case, subject)
    where = f"{case.name} through {frontend_name}"

    assert reply.kind == case.reply, f"{where}: expected {case.reply}, got {reply.kind}: {reply.detail}"

    # the events it wrote, exactly (a refusal writes none), and never a receipt
    assert after.events[: len(before.events)] == before.events, f"{where}: an earlier event changed"
    written = after.events[len(before.events):]
    assert tuple(e.type for e in written) == case.events, f"{where}: wrote {[e.type for e in written]}"
    assert after.receipts == before.receipts, f"{where}: a receipt was written"

    record = after.record
    if case.status is None:
        assert record is None, f"{where}: {record!r} was created"
    else:
        assert record is not None, f"{where}: the record is gone"

    if case.answered_by:
        (event,) = written
        if case.act.startswith("resolve"):
            assert record.resolved_by == frontend.answerer, where
            assert event.effect_key == subject and event.action_id == record.action_id, where
            assert event.data["resolver"] == frontend.answerer and event.data["state"] == case.status, where
            assert event.data["resolved_by"] == "human", where
        else:
            assert record.approver == frontend.answerer, where
            assert event.approval_id == subject and event.action_id == record.request.action.action_id, where
            assert event.data["approver"] == frontend.answerer, where
            if case.act == "approve":
                assert event.data["action_hash"] == record.action_hash, where
    elif before.record is not None:
        # refused: whoever answered before still did; apart from an expiry nothing in it moved
        if case.act.startswith("resolve"):
            assert record == before.record, f"{where}: the effect record changed"
        else:
            assert record.approver == before.record.approver, where
            assert record.approvers == before.record.approvers, where
            if case.status == before.record.status.value:
                assert record == before.record, f"{where}: the request changed"

    # nothing else in the store moved: other requests, other effects
    def others(table: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in table.items() if k != subject}

    assert others(after.approvals) == others(before.approvals), where
    assert others(after.effects) == others(before.effects), where

    # last, the subject's state
    if record is not None:
        state = record.state.value if case.act.startswith("resolve") else record.status.value
        expected = UNWRITTEN.get((case.name, frontend_name), case.status)
        assert state == expected, f"{where}: {state}, expected {expected}"


def test_the_table_covers_each_case_on_each_frontend() -> None:
    names = [case.name for case in CASES]
    assert len(set(names)) == len(names)
    assert {"cli", "console"} < set(FRONTENDS) and any(name.startswith("mcp") for name in FRONTENDS)
    assert set(UNWRITTEN) <= {(c, f) for c in names for f in FRONTENDS}


# --------------------------------------------------------------------------- wait=True


class _Human:
    """The waiting call's ``sleep``: the first pause is the human answering through the front-end;
    every pause moves the test clock on by its length."""

    def __init__(self, project: Any, frontend: Frontend, verb: str) -> None:
        self.project = project
        self.frontend = frontend
        self.verb = verb
        self.replies: list[Reply] = []
        self.pauses = 0

    def __call__(self, seconds: float) -> None:
        self.pauses += 1
        if not self.replies:
            (request,) = self.project.store.pending_approvals()
            answer = self.frontend.approve if self.verb == "approve" else self.frontend.deny
            self.replies.append(answer(request.approval_id))
        self.project.clock.advance(seconds=seconds)


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_a_waiting_call_answered_by_each_frontend(project: Any, frontend: Frontend, verb: str) -> None:
    human = _Human(project, frontend, verb)
    provider = LocalApprovalProvider(project.store, clock=project.clock, poll_interval=timedelta(seconds=2),
                                     sleep=human)  # fmt: skip
    control = Control(Policy.from_file(project.policy), project.store, provider, clock=project.clock,
                      environment="production")  # fmt: skip
    runs: list[str] = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    def refund(payment_id: str, amount: int) -> str:
        runs.append(payment_id)
        return "re_" + payment_id

    where = f"wait=True, {verb} through {frontend.name}"
    with ctrlrun.context(agent="support-agent", user="bob"):
        if verb == "approve":
            assert refund(payment_id="txn_w", amount=100_000) == "re_txn_w", where
        else:
            with pytest.raises(ActionDenied) as denied:
                refund(payment_id="txn_w", amount=100_000)
            assert denied.value.reason == "approval_denied", (where, denied.value.reason)

    assert [r.kind for r in human.replies] == ["done"], (where, human.replies)
    assert human.pauses == 1, where  # answered while it waited; seen on the next poll
    [request] = [project.store.get_approval(e.approval_id) for e in project.store.events()
                 if e.type is EventType.APPROVAL_REQUESTED]  # fmt: skip
    answers = [e for e in project.store.events() if e.type in ANSWER_EVENTS]
    if verb == "approve":
        assert runs == ["txn_w"], where
        assert request.status is ApprovalStatus.CONSUMED and request.approver == frontend.answerer, where
        assert [e.type for e in answers] == [EventType.APPROVAL_GRANTED], where
        receipt = project.store.receipts()[-1]
        assert receipt.approval_id == request.approval_id and receipt.approver == frontend.answerer, where
        with (ctrlrun.context(agent="support-agent", user="bob"), ctrlrun.with_approval(request.approval_id),
              pytest.raises(ctrlrun.ApprovalMismatch)):  # spent: the approval ran the action once
            refund(payment_id="txn_w", amount=100_000)
        assert runs == ["txn_w"], where
    else:
        assert runs == [], where
        assert request.status is ApprovalStatus.DENIED and request.approver == frontend.answerer, where
        # the human's answer, then the call's own refusal (an attempt's event naming the denier)
        assert [e.type for e in answers] == [EventType.APPROVAL_DENIED] * 2, where
        assert [e.data["approver"] for e in answers] == [frontend.answerer] * 2, where
        assert project.store.receipts()[-1].approval_id == request.approval_id, where
