"""The console in a real browser: what an approver sees and does, against a real ``ctrlrun serve``
and real agent processes, checked in the store and in the agent's own runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ._browser import (
    Console, Project, action_button, add_user, form_fields, hidden_fields, left_the_document, login,
    logout_form, path_of, post_as, require_browser, start_driver, submit, wait_until,
)  # fmt: skip

PASSWORD = "correct horse battery staple"
ADA = "ada"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    require_browser()
    return Project(tmp_path_factory.mktemp("console-browser"))


@pytest.fixture(scope="module")
def console(project: Project) -> Iterator[Console]:
    users = project.directory / "users.yaml"
    add_user(users, ADA, PASSWORD)
    add_user(users, "bob", PASSWORD)  # a second approver, so ada is not the only one
    running = Console(project, users)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def driver(project: Project) -> Iterator[Any]:
    browser = start_driver(project.directory / "chromium-profile")
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def second_driver(project: Project) -> Iterator[Any]:
    browser = start_driver(project.directory / "chromium-profile-2")
    yield browser
    browser.quit()


@pytest.fixture
def bob(second_driver: Any, console: Console) -> Any:
    """A second browser, signed in as bob: another approver at the same time."""
    login(second_driver, console, "bob", PASSWORD)
    assert path_of(second_driver) == "/"
    return second_driver


@pytest.fixture
def ada(driver: Any, console: Console) -> Any:
    """The browser, signed in as ada on a fresh session, on one tab."""
    for handle in driver.window_handles[1:]:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(driver.window_handles[0])
    login(driver, console, ADA, PASSWORD)
    assert path_of(driver) == "/"
    return driver


def _by(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def _row(driver: Any, attribute: str, value: str) -> Any | None:
    """The ``<tr>`` whose ``attribute`` is exactly ``value`` (compared in Python, not CSS)."""
    rows = [r for r in _by(driver, f"tr[{attribute}]") if r.get_attribute(attribute) == value]
    assert len(rows) <= 1
    return rows[0] if rows else None


def _no_dialog(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018


def _status(project: Project, request_id: str) -> str:
    with project.store() as store:
        record = store.get_approval(request_id)
    assert record is not None
    return str(record.status.value)


def _approve_in_page(driver: Any, console: Console, request_id: str) -> None:
    driver.get(console.url(f"/requests/{request_id}"))
    submit(driver, action_button(driver, "approve"))


def test_sign_in_see_the_request_approve_and_the_retry_runs_once(driver, console, project):
    driver.delete_all_cookies()
    driver.get(console.url("/"))
    assert path_of(driver) == "/login"  # no session: the queue is not shown
    login(driver, console, ADA, "not the password")
    assert path_of(driver) == "/login" and not _by(driver, "tr[data-request-id]")
    login(driver, console, ADA, PASSWORD)
    assert path_of(driver) == "/"

    arguments = {"payment_id": "txn_approve", "amount": 250_000, "note": "damaged in transit"}
    request_id = project.request(arguments, user="customer-7")
    driver.get(console.url("/"))
    row = _row(driver, "data-request-id", request_id)
    assert row is not None, "the pending request is not in the queue"
    assert "stripe.refund" in row.text and "support-agent" in row.text and "refund:txn_approve" in row.text

    driver.get(console.url(f"/requests/{request_id}"))
    shown = _by(driver, "pre[data-arguments]")
    assert len(shown) == 1 and json.loads(shown[0].text) == arguments
    submit(driver, action_button(driver, "approve"))

    assert _status(project, request_id) == "granted"
    [granted] = project.events("APPROVAL_GRANTED", request_id)
    assert granted.data["approver"] == "console:ada" and granted.data["via"] == "console"
    driver.get(console.url("/"))
    assert _row(driver, "data-request-id", request_id) is None  # answered: no longer pending

    assert project.runs("txn_approve") == []
    assert project.agent(arguments, user="customer-7", approval=request_id)["outcome"] == "ran"
    again = project.agent(arguments, user="customer-7", approval=request_id)
    assert again["outcome"] == "refused", again
    assert project.runs("txn_approve") == [arguments]  # ran once, on the exact arguments

    submit(driver, logout_form(driver).find_element("css selector", '[type="submit"], button'))
    driver.get(console.url("/"))
    assert path_of(driver) == "/login"


HOSTILE_NOTE = "<script>alert(1)</script><img src=x onerror=alert(1)> \x1b[31mred \u202eevil & \"quoted\""
HOSTILE_PAYMENT = "txn_\x1b[31m_\u202e_hostile"


def _assert_shown_as_text(driver: Any) -> str:
    _no_dialog(driver)
    assert not _by(driver, 'img[src="x"]') and not _by(driver, "img[onerror]")
    for script in _by(driver, "script"):
        assert "alert" not in (script.get_attribute("textContent") or "")
    text: str = driver.find_element("tag name", "body").text
    assert "\x1b" not in text and "\u202e" not in text
    assert "<script>alert(1)</script>" in text and "<img src=x onerror=alert(1)>" in text
    assert "\\u202e" in text
    return text


def test_hostile_arguments_show_as_text(ada, console, project):
    arguments = {"payment_id": HOSTILE_PAYMENT, "amount": 300_000, "note": HOSTILE_NOTE}
    request_id = project.request(arguments, agent="bot<img src=x onerror=alert(2)>")

    ada.get(console.url("/"))
    text = _assert_shown_as_text(ada)
    row = _row(ada, "data-request-id", request_id)
    assert row is not None
    assert "refund:txn_\\x1b[31m_\\u202e_hostile" in row.text  # the effect key, escaped like the CLI
    assert "bot<img src=x onerror=alert(2)>" in row.text
    assert "\\x1b[31m" in text

    ada.get(console.url(f"/requests/{request_id}"))
    text = _assert_shown_as_text(ada)
    [pre] = _by(ada, "pre[data-arguments]")
    assert "<script>alert(1)</script>" in pre.text and "\\u003c" not in pre.text
    assert "\\u001b[31m" in pre.text or "\\x1b[31m" in pre.text
    [field] = _by(ada, '[name="arguments"]')
    prefill = field.get_attribute("value")
    assert "\x1b" not in prefill and "\u202e" not in prefill
    assert json.loads(prefill) == arguments  # parses back to the canonical arguments exactly

    submit(ada, action_button(ada, "deny"))  # the hostile request is not left in the queue
    _assert_shown_as_text(ada)
    assert _status(project, request_id) == "denied"


def test_a_double_submit_grants_once(ada, bob, console, project):
    arguments = {"payment_id": "txn_double", "amount": 120_000}
    request_id = project.request(arguments)
    bob.get(console.url(f"/requests/{request_id}"))  # a second approver, on the same request
    ada.get(console.url(f"/requests/{request_id}"))
    ada.switch_to.new_window("tab")  # the same form, open in a second tab of the same session
    replay = ada.current_window_handle
    ada.get(console.url(f"/requests/{request_id}"))
    ada.switch_to.window(ada.window_handles[0])

    page = ada.find_element("tag name", "html")
    ada.execute_script("const b = arguments[0]; b.click(); b.click();", action_button(ada, "approve"))
    wait_until(ada, left_the_document(page), "the approval's page")
    ada.switch_to.window(replay)
    submit(ada, action_button(ada, "approve"))
    assert "you approved this at " in ada.find_element("tag name", "body").text  # her own act, said so
    submit(bob, action_button(bob, "deny"))
    assert "already granted by console:ada" in bob.find_element("tag name", "body").text

    assert project.events("APPROVAL_DENIED", request_id) == []
    assert _status(project, request_id) == "granted"
    assert len(project.events("APPROVAL_GRANTED", request_id)) == 1
    assert project.agent(arguments, approval=request_id)["outcome"] == "ran"
    assert len(project.runs("txn_double")) == 1


def test_a_post_without_the_csrf_token_is_refused_and_writes_nothing(ada, bob, console, project):
    request_id = project.request({"payment_id": "txn_csrf", "amount": 130_000})
    before = len(project.events())
    ada.get(console.url(f"/requests/{request_id}"))
    approve = action_button(ada, "approve")
    form = approve.find_element("xpath", "./ancestor::form")
    fields = form_fields(form)
    token = hidden_fields(form)
    assert token, "the approve form carries no hidden CSRF input"
    ada.execute_script(
        "arguments[0].querySelectorAll('input[type=hidden]').forEach(e => e.remove());", form)
    submit(ada, approve)  # the browser's own form post, without its token
    assert _status(project, request_id) == "pending" and len(project.events()) == before

    url = console.url(f"/requests/{request_id}/approve")
    bare = {k: v for k, v in fields.items() if k not in token}
    assert post_as(ada, url, bare)[0] == 403
    assert post_as(ada, url, {**bare, **{k: "0" * len(v) for k, v in token.items()}})[0] == 403
    bob.get(console.url(f"/requests/{request_id}"))
    assert post_as(ada, url, {**bare, **hidden_fields(logout_form(bob))})[0] == 403  # bob's token
    assert _status(project, request_id) == "pending" and len(project.events()) == before

    status, _ = post_as(ada, url, fields)  # the same POST with the session's token is answered
    assert status in (200, 303)
    assert _status(project, request_id) == "granted"


def test_self_approval_is_refused(ada, console, project):
    request_id = project.request({"payment_id": "txn_self", "amount": 140_000}, user=ADA)
    before = len(project.events())
    ada.get(console.url(f"/requests/{request_id}"))
    if _by(ada, '[data-action="approve"]'):
        submit(ada, action_button(ada, "approve"))
        assert "self_approval" in ada.find_element("tag name", "body").text
    token = hidden_fields(logout_form(ada))  # one token per session, valid in all its forms
    status, body = post_as(ada, console.url(f"/requests/{request_id}/approve"), token)
    assert status == 409 and "self_approval" in body
    assert _status(project, request_id) == "pending" and len(project.events()) == before


def test_a_denial_with_a_reason_reaches_the_agent(ada, console, project):
    arguments = {"payment_id": "txn_deny", "amount": 150_000}
    request_id = project.request(arguments)
    ada.get(console.url(f"/requests/{request_id}"))
    deny = action_button(ada, "deny")
    deny.find_element("xpath", "./ancestor::form").find_element("name", "reason").send_keys(
        "the customer already got a replacement")
    submit(ada, deny)

    [denied] = project.events("APPROVAL_DENIED", request_id)
    assert denied.data["approver"] == "console:ada" and denied.data["via"] == "console"
    assert denied.data["reason"] == "the customer already got a replacement"
    outcome = project.agent(arguments, approval=request_id)
    assert outcome["error"] == "ActionDenied" and outcome["reason"] == "approval_denied", outcome
    assert project.runs("txn_deny") == []


def test_approve_with_edits_runs_the_edited_call_once(ada, console, project):
    arguments = {"payment_id": "txn_edit", "amount": 400_000, "note": "full refund"}
    request_id = project.request(arguments)
    ada.get(console.url(f"/requests/{request_id}"))
    edit = action_button(ada, "approve-with-edits")
    field = edit.find_element("xpath", "./ancestor::form").find_element("name", "arguments")
    edited = {**json.loads(field.get_attribute("value")), "amount": 200_000}
    field.clear()
    field.send_keys(json.dumps(edited))
    submit(ada, edit)

    [event] = project.events("APPROVAL_EDITED", request_id)
    assert event.data["approver"] == "console:ada" and event.data["via"] == "console"
    assert event.data["edit_diff"] == {"amount": {"from": 400_000, "to": 200_000}}
    outcome = project.agent(arguments, approval=request_id)  # the agent retries its original call
    assert outcome["outcome"] == "ran" and outcome["edited"] == edited, outcome
    assert project.agent(edited, approval=request_id)["outcome"] == "refused"
    assert project.runs("txn_edit") == [edited]


def test_an_edit_the_policy_denies_changes_nothing(ada, console, project):
    request_id = project.request({"payment_id": "txn_edit_denied", "amount": 160_000})
    ada.get(console.url(f"/requests/{request_id}"))
    edit = action_button(ada, "approve-with-edits")
    field = edit.find_element("xpath", "./ancestor::form").find_element("name", "arguments")
    field.clear()
    field.send_keys(json.dumps({"payment_id": "txn_edit_denied", "amount": 9_000_000}))
    submit(ada, edit)
    assert _status(project, request_id) == "pending"
    assert project.events("APPROVAL_EDITED", request_id) == []


def test_resolve_an_ambiguous_effect(ada, console, project):
    arguments = {"payment_id": "txn_lost", "amount": 4_000}
    assert project.agent(arguments, lose_reply=True)["outcome"] == "lost_reply"
    key = "refund:txn_lost"
    ada.get(console.url("/effects?state=ambiguous"))
    row = _row(ada, "data-effect-key", key)
    assert row is not None and key in row.text
    submit(ada, row.find_element("css selector", '[data-action="resolve-committed"]'))

    with project.store() as store:
        effect = store.get_effect(key)
    assert effect is not None and effect.state.value == "committed"
    [resolved] = [e for e in project.events("EFFECT_RESOLVED") if e.effect_key == key]
    assert resolved.data["resolver"] == "console:ada" and resolved.data["via"] == "console"
    ada.get(console.url("/effects?state=ambiguous"))
    assert _row(ada, "data-effect-key", key) is None
    assert project.agent(arguments)["outcome"] == "refused"  # committed: the retry does not run
    assert len(project.runs("txn_lost")) == 1

