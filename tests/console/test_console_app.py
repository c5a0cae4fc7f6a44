"""The approver's console over HTTP: identity, CSRF, four eyes, single use, escaping, the answers'
events, and a real ``ctrlrun serve`` process answering a real agent process."""

from __future__ import annotations

import html
import json
import os
import re
import stat
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")

from ctrlrun import ActionDenied, ApprovalMismatch, ApprovalStatus, EffectState
from ctrlrun.evidence.receipt import EventType

from .._cli_helpers import invoke
from ..conftest import FakeClock
from ._serve import START, Project, cli_env, console_client, csrf_of, login, serve, token


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_CONSOLE_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    instance = Project(tmp_path, FakeClock(START))
    yield instance
    instance.store.close()


@pytest.fixture
def client(project: Project) -> Any:
    with console_client(project) as c:
        assert login(c, "ada").status_code == 303
        yield c


def _answers(project: Project) -> list[Any]:
    kinds = (EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED, EventType.APPROVAL_EDITED, EventType.EFFECT_RESOLVED)
    return [e for e in project.events() if e.type in kinds]


# identity and sessions


def test_without_a_session_nothing_is_shown_or_written(project: Project) -> None:
    request_id = project.request()
    with console_client(project) as c:
        for path in ("/", f"/requests/{request_id}", "/effects?state=ambiguous", "/receipts"):
            r = c.get(path, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == "/login"
            assert request_id not in r.text
        assert c.get("/api/pending").status_code == 401
        for verb in ("approve", "deny", "edit"):
            r = c.post(f"/requests/{request_id}/{verb}", data={"csrf_token": token(c, "/login")})
            assert r.status_code == 403
        assert c.get("/healthz").text == "ok"
        assert c.get("/static/console.css").status_code == 200
    assert project.store.get_approval(request_id).status is ApprovalStatus.PENDING
    assert _answers(project) == []


def test_login_and_logout(project: Project) -> None:
    with console_client(project) as c:
        assert login(c, "ada", "wrong").status_code == 401
        r = login(c, "ada")
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
        page = c.get("/")
        assert page.status_code == 200 and '<form method="post" action="/logout">' in page.text
        assert c.post("/logout", data={"csrf_token": csrf_of(page.text)}, follow_redirects=False).status_code == 303
        assert c.get("/", follow_redirects=False).status_code == 303


def test_login_without_the_form_token_is_refused(project: Project) -> None:
    with console_client(project) as c:
        r = c.post("/login", data={"username": "ada", "password": "ada-secret-1"}, follow_redirects=False)
        assert r.status_code == 403


def test_https_base_url_makes_the_cookie_secure(project: Project) -> None:
    with console_client(project, client_base="https://127.0.0.1", base_url="https://console.example") as c:
        assert "secure" in login(c, "ada").headers["set-cookie"].lower()


def test_five_failures_lock_the_name_for_fifteen_minutes(project: Project) -> None:
    with console_client(project) as c:
        for _ in range(5):
            assert login(c, "ada", "wrong").status_code == 401
        assert login(c, "ada").status_code == 429  # the right password too
        assert login(c, "bob").status_code == 303  # another name is not locked
        project.clock.advance(minutes=14, seconds=59)
        assert login(c, "ada").status_code == 429
        project.clock.advance(seconds=1)
        assert login(c, "ada").status_code == 303


def test_the_session_ends_after_eight_hours(project: Project, client: Any) -> None:
    assert client.get("/").status_code == 200
    project.clock.advance(hours=8, seconds=1)
    assert client.get("/", follow_redirects=False).status_code == 303


def test_security_headers_on_every_page(project: Project, client: Any) -> None:
    request_id = project.request()
    for path in ("/", f"/requests/{request_id}", "/effects?state=ambiguous", "/receipts", "/login", "/api/pending"):
        r = client.get(path)
        csp = r.headers["content-security-policy"]
        assert csp.startswith("default-src 'self'") and "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer"
        if r.headers["content-type"].startswith("text/html"):
            assert "<script" not in r.text and "style=" not in r.text


# the queue and the request page


def test_the_queue_shows_pending_requests_oldest_first(project: Project, client: Any) -> None:
    first = project.request(payment_id="txn_1")
    project.clock.advance(seconds=1)
    second = project.request(payment_id="txn_2", amount=200_000)
    page = client.get("/").text
    ids = re.findall(r'data-request-id="([^"]+)"', page)
    assert ids == [first, second]
    assert "refund:txn_2" in page and 'data-effect-state="new"' in page
    assert "{&#34;amount&#34;:200000,&#34;payment_id&#34;:&#34;txn_2&#34;}" in page


def test_a_committed_key_is_flagged(project: Project, client: Any) -> None:
    request_id = project.request(payment_id="txn_5")
    project.call(payment_id="txn_5", amount=100)  # the same key, committed by an allowed call
    page = client.get("/").text
    row = page[page.index(f'data-request-id="{request_id}"'):]
    assert 'data-effect-state="committed"' in row[:2000] and "data-blocked" in row[:2000]


def test_the_request_page(project: Project, client: Any) -> None:
    request_id = project.request()
    record = project.store.get_approval(request_id)
    page = client.get(f"/requests/{request_id}").text
    assert len(re.findall(r"<pre data-arguments>", page)) == 1
    assert record.request.action_hash in page and "rule[1]" in page and "refund:txn_1" in page
    for action, route in (("approve", "approve"), ("deny", "deny"), ("approve-with-edits", "edit")):
        form = re.search(rf'<form method="post" action="/requests/{request_id}/{route}">(.*?)</form>', page, re.S)
        assert form is not None and f'data-action="{action}"' in form.group(1) and 'name="csrf_token"' in form.group(1)
    assert "formaction" not in page
    assert client.get("/requests/apr_ffffffffffffffffffffffffffffffff").status_code == 404


# answers


def _post(client: Any, path: str, **data: str) -> Any:
    return client.post(path, data={"csrf_token": token(client), **data}, follow_redirects=False)


def test_approve_writes_the_cli_event_with_via_and_the_agent_runs_once(project: Project, client: Any) -> None:
    request_id = project.request()
    r = _post(client, f"/requests/{request_id}/approve")
    assert r.status_code == 303 and r.headers["location"] == f"/requests/{request_id}"
    record = project.store.get_approval(request_id)
    assert record.status is ApprovalStatus.GRANTED and record.approver == "console:ada"
    (event,) = _answers(project)
    assert event.type is EventType.APPROVAL_GRANTED and event.approval_id == request_id
    assert list(event.data) == ["approver", "action_hash", "via"]
    assert dict(event.data) == {"approver": "console:ada", "action_hash": record.action_hash, "via": "console"}
    assert project.call(payment_id="txn_1", amount=100_000, approval=request_id) == {"ok": "txn_1"}
    with pytest.raises(ApprovalMismatch):  # spent: the approval runs the action once
        project.call(payment_id="txn_1", amount=100_000, approval=request_id)
    assert len(project.runs) == 1


def test_a_second_answer_is_409_naming_who_decided(project: Project, client: Any) -> None:
    request_id = project.request()
    form_token = token(client, f"/requests/{request_id}")
    assert client.post(f"/requests/{request_id}/approve", data={"csrf_token": form_token}, follow_redirects=False).status_code == 303
    for verb in ("approve", "deny", "edit"):  # ada's own double submit: she is told it was her
        r = client.post(f"/requests/{request_id}/{verb}", data={"csrf_token": form_token, "arguments": "{}"})
        assert r.status_code == 409
        assert "you approved this at " in r.text and "already granted by console:ada" not in r.text
    assert len(_answers(project)) == 1


@pytest.mark.parametrize(("verb", "act", "status"), [("approve", "approved", "granted"), ("deny", "denied", "denied")])
def test_after_her_answer_the_page_tells_the_approver_it_was_hers(project: Project, client: Any, verb: str,
                                                                   act: str, status: str) -> None:  # fmt: skip
    request_id = project.request(user="carol")
    r = _post(client, f"/requests/{request_id}/{verb}")
    assert r.status_code == 303
    page = client.get(r.headers["location"]).text
    assert f"you {act} this at " in page and f"already {status} by" not in page
    again = _post(client, f"/requests/{request_id}/{verb}")  # a double submit
    assert again.status_code == 409 and f"you {act} this at " in again.text
    with console_client(project) as other:  # anyone else is told who decided
        assert login(other, "bob").status_code == 303
        page = other.get(f"/requests/{request_id}").text
        assert f"already {status} by console:ada at " in page and f"you {act}" not in page
        refused = other.post(f"/requests/{request_id}/approve", data={"csrf_token": token(other)})
        assert refused.status_code == 409
        assert f"already {status} by console:ada at " in refused.text and f"you {act}" not in refused.text
    assert len(_answers(project)) == 1


def test_csrf_token_missing_wrong_or_another_sessions(project: Project, client: Any) -> None:
    request_id = project.request()
    with console_client(project) as other:
        login(other, "ada")
        foreign = token(other)
    for data in ({}, {"csrf_token": ""}, {"csrf_token": "nope"}, {"csrf_token": foreign}):
        r = client.post(f"/requests/{request_id}/approve", data=data, follow_redirects=False)
        assert r.status_code == 403
    assert project.store.get_approval(request_id).status is ApprovalStatus.PENDING and _answers(project) == []
    # the token decides: Origin: null with the right token is accepted
    r = client.post(f"/requests/{request_id}/approve", data={"csrf_token": token(client)},
                    headers={"Origin": "null"}, follow_redirects=False)  # fmt: skip
    assert r.status_code == 303


def test_the_token_stays_valid_across_forms_for_the_session(project: Project, client: Any) -> None:
    first, second = project.request(payment_id="txn_1"), project.request(payment_id="txn_2")
    form_token = token(client)
    assert token(client, f"/requests/{first}") == form_token
    for request_id in (first, second):
        r = client.post(f"/requests/{request_id}/approve", data={"csrf_token": form_token}, follow_redirects=False)
        assert r.status_code == 303


def test_four_eyes_the_requester_cannot_answer(project: Project) -> None:
    request_id = project.request(user="bob")
    with console_client(project) as c:
        login(c, "bob")
        page = c.get(f"/requests/{request_id}").text
        assert 'data-action="approve"' not in page and "self_approval" in page
        for verb in ("approve", "deny", "edit"):
            r = c.post(f"/requests/{request_id}/{verb}", data={"csrf_token": token(c), "arguments": "{}"})
            assert r.status_code == 409 and "self_approval" in r.text
    assert project.store.get_approval(request_id).status is ApprovalStatus.PENDING and _answers(project) == []


def test_an_expired_request_is_not_pending_and_answering_it_is_409(project: Project, client: Any) -> None:
    request_id = project.request()
    record = project.store.get_approval(request_id)
    project.clock.set(record.expires_at + timedelta(seconds=1))
    assert request_id not in client.get("/").text
    assert client.get("/api/pending").json() == []
    r = _post(client, f"/requests/{request_id}/approve")
    assert r.status_code == 409 and "expired" in r.text
    assert project.store.get_approval(request_id).status is not ApprovalStatus.GRANTED
    assert not [e for e in _answers(project) if e.type is EventType.APPROVAL_GRANTED]


def test_deny_keeps_the_reason_and_the_agent_sees_approval_denied(project: Project, client: Any) -> None:
    request_id = project.request()
    assert _post(client, f"/requests/{request_id}/deny", reason="duplicate <refund>").status_code == 303
    (event,) = _answers(project)
    assert event.type is EventType.APPROVAL_DENIED
    assert dict(event.data) == {"approver": "console:ada", "reason": "duplicate <refund>", "via": "console"}
    with pytest.raises(ActionDenied) as denied:
        project.call(payment_id="txn_1", amount=100_000, approval=request_id)
    assert denied.value.reason == "approval_denied" and project.runs == []
    page = client.get(f"/requests/{request_id}").text
    assert "duplicate &lt;refund&gt;" in page and "console:ada" in page


def test_approve_with_edits_goes_through_the_policy_and_binds_the_edit(project: Project, client: Any) -> None:
    request_id = project.request(amount=400_000)
    r = _post(client, f"/requests/{request_id}/edit", arguments='{"payment_id": "txn_1", "amount": 300000}')
    assert r.status_code == 303
    record = project.store.get_approval(request_id)
    assert record.status is ApprovalStatus.GRANTED and record.approved_arguments == {"payment_id": "txn_1", "amount": 300000}
    (event,) = _answers(project)
    assert event.type is EventType.APPROVAL_EDITED and event.data["via"] == "console"
    assert event.data["edit_diff"] == {"amount": {"from": 400000, "to": 300000}}
    assert project.call(payment_id="txn_1", amount=300_000, approval=request_id) == {"ok": "txn_1"}
    assert project.runs == [{"payment_id": "txn_1", "amount": 300_000}]


@pytest.mark.parametrize(("text", "status"), [
    ('{"payment_id": "txn_1", "amount": 9000000}', 422),  # the policy denies it
    ('{"payment_id": "txn_1", "amount": 100000, "note": "x"}', 422),  # a name the request does not have
    ("[1, 2]", 400),
    ('"amount"', 400),
    ("{not json", 400),
])  # fmt: skip
def test_a_refused_edit_changes_nothing(project: Project, client: Any, text: str, status: int) -> None:
    request_id = project.request()
    r = _post(client, f"/requests/{request_id}/edit", arguments=text)
    assert r.status_code == status
    assert project.store.get_approval(request_id).status is ApprovalStatus.PENDING and _answers(project) == []


def test_resolve_an_ambiguous_effect(project: Project, client: Any) -> None:
    key = project.ambiguous("txn_9")
    page = client.get("/effects?state=ambiguous").text
    row = re.search(rf'<tr data-effect-key="{key}">(.*?)</tr>', page, re.S)
    assert row is not None
    assert 'data-action="resolve-committed"' in row.group(1) and 'data-action="resolve-failed"' in row.group(1)
    r = _post(client, "/effects/resolve", effect_key=key, state="failed")
    assert r.status_code == 303
    assert project.store.get_effect(key).state is EffectState.FAILED
    (event,) = _answers(project)
    assert event.type is EventType.EFFECT_RESOLVED and event.effect_key == key
    assert dict(event.data) == {"state": "failed", "resolver": "console:ada", "resolved_by": "human", "via": "console"}
    assert _post(client, "/effects/resolve", effect_key=key, state="committed").status_code == 409
    assert key not in client.get("/effects?state=ambiguous").text


def test_api_pending_is_the_pending_json_with_the_effect(project: Project, client: Any) -> None:
    request_id = project.request()
    (document,) = client.get("/api/pending").json()
    assert list(document) == ["request_id", "action_id", "action", "action_hash", "arguments", "resource",
                              "environment", "principal", "created_at", "expires_at", "effect_key", "effect_state"]  # fmt: skip
    assert document["request_id"] == request_id and document["arguments"] == {"amount": 100000, "payment_id": "txn_1"}
    assert document["principal"] == {"agent": "support-agent", "user": "bob"}
    assert (document["effect_key"], document["effect_state"]) == ("refund:txn_1", "new")


def test_receipts_and_the_chain_status(project: Project, client: Any) -> None:
    project.call(payment_id="txn_3", amount=100)
    page = client.get("/receipts").text
    assert 'data-chain="ok"' in page and "stripe.refund" in page


def test_the_receipts_page_checks_what_follows_the_verified_mark(project: Project, client: Any) -> None:
    import sqlite3

    from ctrlrun.store.verifymark import read_mark

    project.call(payment_id="txn_3", amount=100)
    assert "a full check" in client.get("/receipts").text  # no mark yet: everything, then the mark moves
    mark = read_mark(project.store)
    assert mark is not None and mark.seq == project.store.chain_head()[0]
    project.call(payment_id="txn_4", amount=100)
    page = client.get("/receipts").text
    assert 'data-chain="ok"' in page and f"after the verified mark at seq {mark.seq}" in page
    with sqlite3.connect(project.db) as conn:  # an edit after the mark is still caught
        conn.execute("UPDATE receipts SET json = replace(json, 'txn_4', 'txn_5') WHERE seq = ?", (mark.seq + 1,))
    assert 'data-chain="broken"' in client.get("/receipts").text


# escaping

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>\x1b[31m\u202egnp.exe \"q\" & 'a'"


def test_what_the_agent_wrote_is_shown_as_text(project: Project, client: Any) -> None:
    request_id = project.request(payment_id=HOSTILE)
    for page in (client.get("/").text, client.get(f"/requests/{request_id}").text):
        assert "<script>alert" not in page and "<img" not in page
        assert "\x1b" not in page and "\u202e" not in page
        assert "\\u003c" not in page.lower()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "onerror=alert(2)" in page
        assert "\\u202e" in page
    page = client.get(f"/requests/{request_id}").text
    shown = html.unescape(re.search(r"<pre data-arguments>(.*?)</pre>", page, re.S).group(1))
    assert '\\"q\\" & \'a\'' in shown and "\\u202e" in shown
    prefill = html.unescape(re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', page, re.S).group(1))
    assert json.loads(prefill) == project.store.get_approval(request_id).request.action.canonical_arguments
    assert "\\u001b" in prefill and "\\u202e" in prefill and "\u202e" not in prefill


def test_the_prefill_is_the_requested_action_exactly(project: Project, client: Any) -> None:
    request_id = project.request(payment_id=HOSTILE)
    page = client.get(f"/requests/{request_id}").text
    prefill = html.unescape(re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', page, re.S).group(1))
    r = _post(client, f"/requests/{request_id}/edit", arguments=prefill)  # the same hash: not an edit
    assert r.status_code == 422 and "the ones requested" in r.text
    assert project.store.get_approval(request_id).status is ApprovalStatus.PENDING


# the proxy header


@pytest.mark.parametrize(("headers", "status"), [
    ([("X-Remote-User", "ada")], 200),
    ([("X-Remote-User", "  ")], 403),
    ([("X-Remote-User", "ada"), ("X-Remote-User", "eve")], 403),
    ([], 403),
])  # fmt: skip
def test_the_proxy_header_from_a_trusted_peer(project: Project, headers: list[tuple[str, str]], status: int) -> None:
    with console_client(project, users_path=None, auth_header="X-Remote-User",
                        trusted_proxies=frozenset({"testclient"})) as c:  # fmt: skip
        assert c.get("/", headers=headers).status_code == status


def test_the_proxy_identity_answers_and_an_untrusted_peer_gets_403(project: Project) -> None:
    request_id = project.request()
    with console_client(project, users_path=None, auth_header="X-Remote-User",
                        trusted_proxies=frozenset({"10.0.0.1"})) as c:  # fmt: skip
        assert c.get("/", headers={"X-Remote-User": "ada"}).status_code == 403
    with console_client(project, users_path=None, auth_header="X-Remote-User",
                        trusted_proxies=frozenset({"testclient"})) as c:  # fmt: skip
        head = {"X-Remote-User": "ada"}
        form_token = csrf_of(c.get("/", headers=head).text)
        r = c.post(f"/requests/{request_id}/approve", data={"csrf_token": form_token, "approver": "bob"},
                   headers=head, follow_redirects=False)  # fmt: skip
        assert r.status_code == 303
    assert project.store.get_approval(request_id).approver == "proxy:ada"


# the command line


def _adduser(tmp_path: Path, stdin: str, name: str = "ada") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.run([sys.executable, "-m", "ctrlrun", "serve", "adduser", name, "--users",
                           str(tmp_path / "users.yaml")], input=stdin, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_adduser_reads_two_matching_lines_and_writes_a_private_file(tmp_path: Path) -> None:
    from ctrlrun.console.auth import check_login, load_users

    done = _adduser(tmp_path, "pa55 word\npa55 word\n")
    assert done.returncode == 0, done.stderr
    users_file = tmp_path / "users.yaml"
    assert stat.S_IMODE(users_file.stat().st_mode) == 0o600
    users = load_users(users_file)
    assert users["ada"].startswith("scrypt$") and "pa55" not in users_file.read_text()
    assert check_login(users, "ada", "pa55 word") and not check_login(users, "ada", "pa55")


def test_adduser_refuses_differing_passwords_and_writes_nothing(tmp_path: Path) -> None:
    done = _adduser(tmp_path, "one\ntwo\n")
    assert done.returncode == 1 and "differ" in done.stderr
    assert not (tmp_path / "users.yaml").exists()


@pytest.mark.parametrize(("args", "code", "words"), [
    ([], 2, "exactly one identity source"),
    (["--users", "u.yaml", "--auth-header", "X-User", "--trusted-proxy", "127.0.0.1"], 2, "exactly one"),
    (["--auth-header", "X-User"], 2, "--trusted-proxy"),
    (["--users", "u.yaml", "--listen", "0.0.0.0:0"], 2, "--allow-remote"),
    (["--users", "u.yaml", "--listen", "nowhere"], 1, "HOST:PORT"),
    (["--users", "u.yaml", "--escalate-after", "PT2S"], 2, "together"),
    (["--users", "u.yaml", "--escalate-after", "soon", "--escalate-webhook", "http://127.0.0.1:9/"], 2, "ISO 8601"),
    (["--users", "missing.yaml", "--store-url", "sqlite://state.db"], 1, "adduser"),
])  # fmt: skip
def test_startup_refusals(project: Project, args: list[str], code: int, words: str) -> None:
    result = invoke(["serve", *args])
    assert result.code == code, (result.out, result.err)
    assert words in result.err


def test_serve_never_creates_a_store(project: Project, tmp_path: Path) -> None:
    result = invoke(["serve", "--users", str(project.users), "--store-url", f"sqlite://{tmp_path / 'absent.db'}"])
    assert result.code == 1 and "never creates a store" in result.err
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.parametrize("module", ["starlette", "uvicorn"])
def test_a_missing_extra_names_only_the_clone_install_line(project: Project, monkeypatch: pytest.MonkeyPatch,
                                                            module: str) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    result = invoke(["serve", "--users", str(project.users), "--store-url", project.url])
    assert result.code == 1, (result.out, result.err)
    assert f"{module} is not installed" in result.err
    assert "pip install '.[console]' from the root of your ctrlrun clone" in result.err
    assert "ctrlrun[console]" not in result.err  # the public index's ctrlrun is another project


def test_import_ctrlrun_does_not_import_the_console() -> None:
    code = "import sys, ctrlrun; print([m for m in sys.modules if m.startswith(('ctrlrun.console', 'starlette', 'jinja2'))])"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


# a real server, a real agent


AGENT = '''
import sys, ctrlrun
from pathlib import Path
runs = Path(sys.argv[1])

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id, amount):
    with runs.open("a") as f:
        f.write(payment_id + "\\n")
    return {"ok": payment_id}

with ctrlrun.context(agent="support-agent", user="bob"):
    if len(sys.argv) > 2:
        with ctrlrun.with_approval(sys.argv[2]):
            print(refund(payment_id="txn_7", amount=100000))
    else:
        try:
            refund(payment_id="txn_7", amount=100000)
        except ctrlrun.ApprovalRequired as e:
            print(e.request_id)
'''


def _agent(project: Project, *args: str, ok: bool = True) -> str:
    script = project.directory / "agent.py"
    script.write_text(AGENT)
    done = subprocess.run([sys.executable, str(script), str(project.directory / "runs.txt"), *args],
                          env=cli_env(project), capture_output=True, text=True, timeout=120,
                          cwd=project.directory)  # fmt: skip
    if not ok:
        assert done.returncode != 0
        return done.stderr
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _http_login(base: str) -> Any:
    import httpx

    session = httpx.Client(base_url=base, timeout=60)
    page = session.get("/login")
    r = session.post("/login", data={"username": "ada", "password": "ada-secret-1", "csrf_token": csrf_of(page.text)})
    assert r.status_code == 303
    return session


def test_two_real_consoles_one_grant_and_the_agent_runs_once(project: Project) -> None:
    project.store.close()  # the processes below own the store from here
    request_id = _agent(project)
    assert request_id.startswith("apr_")
    with serve(project, "--store-url", project.url) as one, serve(project, "--store-url", project.url) as two:
        clients = [_http_login(one.url), _http_login(two.url)]
        assert request_id in clients[0].get("/").text
        assert clients[1].get("/healthz").text == "ok"
        tokens = [csrf_of(c.get(f"/requests/{request_id}").text) for c in clients]
        barrier = threading.Barrier(2)
        statuses: list[int] = []

        def approve(i: int) -> None:
            barrier.wait()
            r = clients[i].post(f"/requests/{request_id}/approve", data={"csrf_token": tokens[i]})
            statuses.append(r.status_code)

        threads = [threading.Thread(target=approve, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses) == [303, 409]
        for c in clients:
            c.close()
    assert _agent(project, request_id) == "{'ok': 'txn_7'}"
    assert "consumed" in _agent(project, request_id, ok=False)  # spent: a second retry is refused
    assert (project.directory / "runs.txt").read_text() == "txn_7\n"
    from ctrlrun import SQLiteStateStore

    store = SQLiteStateStore(project.db)
    try:
        grants = [e for e in store.events() if e.type is EventType.APPROVAL_GRANTED]
        assert len(grants) == 1 and grants[0].data["via"] == "console"
    finally:
        store.close()
