"""Safe printing: model-written text cannot forge or hide a line; ``--json`` stays byte-identical."""

from __future__ import annotations

import json

import pytest

import ctrlrun
from ctrlrun.cli.text import safe

from ._cli_helpers import invoke, sql

HOSTILE = "txn\x1b[2J\u202eevil\r\nseq 9  ctr_forged  allow/committed\u0085\u2028\u2029\u200b\x9b"
RAW = ["\x1b", "\u202e", "\r", "\u0085", "\u2028", "\u2029", "\u200b", "\x9b"]


@pytest.mark.parametrize(
    "text, shown",
    [
        ("plain text, ünïcödé, 日本, 🙂", "plain text, ünïcödé, 日本, 🙂"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\u202eb", "a\\u202eb"),
        ("a\nb\tc\r", "a\\x0ab\\x09c\\x0d"),
        ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\u200b\ufeff\u2066", "\\u200b\\ufeff\\u2066"),
        ("\U000e0041", "\\U000e0041"),
        ("\ud800", "\\ud800"),
        ("a\u00a0b", "a\u00a0b"),  # a visible space separator stays
    ],
)
def test_safe(text, shown):
    assert safe(text) == shown


def _assert_clean(text):
    for char in RAW:
        assert char not in text, repr(char)
    assert len(text.splitlines()) == text.count("\n")


def test_hostile_arguments_are_escaped_in_pending_and_receipts(project):
    request_id = project.request(agent="agent\x1b]0;pwned\x07", payment_id=HOSTILE, amount=500_000)
    project.lose_reply = True
    with ctrlrun.context(agent="a\u202eb"), pytest.raises(TimeoutError):
        project.refund(payment_id=HOSTILE, amount=100)

    pending = invoke(["pending"], clock=project.clock)
    assert pending.code == 0
    _assert_clean(pending.out)
    assert len(pending.lines) == 1
    assert "\\u001b[2J" in pending.out  # canonical JSON already escapes C0 controls
    assert "\\u202e" in pending.out and "\\x85" in pending.out and "\\u2028" in pending.out
    assert "agent\\x1b]0;pwned\\x07" in pending.out and request_id in pending.out

    receipts = invoke(["receipts"], clock=project.clock)
    _assert_clean(receipts.out)
    assert len(receipts.lines) == 1
    assert "refund:txn\\x1b[2J\\u202eevil\\x0d\\x0aseq 9" in receipts.out
    assert receipts.lines[0].endswith("  a\\u202eb")

    effects = invoke(["effects"], clock=project.clock)
    _assert_clean(effects.out)
    assert len(effects.lines) == 1

    key = f"refund:{HOSTILE}"
    resolved = invoke(["resolve", key, "--committed"], clock=project.clock)
    assert resolved.code == 0
    _assert_clean(resolved.out)
    refused = invoke(["resolve", key, "--failed"], clock=project.clock)
    assert refused.code == 1
    _assert_clean(refused.err)
    assert refused.err.count("\n") == 1


def test_json_output_is_not_re_escaped(project):
    project.request(payment_id="p\u202e\x1b", amount=500_000)
    project.call(payment_id="q\u202e\x1b", amount=1)
    receipts = invoke(["receipts", "--json"])
    stored = [row[0] for row in sql(project.db, "SELECT json FROM receipts ORDER BY seq")]
    assert receipts.lines == stored
    assert "\u202e" in receipts.out and "\\u001b" in receipts.out
    pending = invoke(["pending", "--json"], clock=project.clock)
    assert "\u202e" in pending.out
    assert json.loads(pending.out)["arguments"]["payment_id"] == "p\u202e\x1b"


def test_errors_and_usage_errors_are_escaped(project):
    unknown = invoke(["approve", "apr_\x1b[2J\u202e"], clock=project.clock)
    assert unknown.code == 1
    assert "apr_\\x1b[2J\\u202e" in unknown.err
    _assert_clean(unknown.err)
    no_command = invoke(["\x1b[2Jnope"])
    assert no_command.code == 2
    _assert_clean(no_command.err)
    bad_value = invoke(["receipts", "--last", "\u202e1"])
    assert bad_value.code == 2
    _assert_clean(bad_value.err)
    bad_url = invoke(["receipts", "--store-url", "x\x1b://y"])
    assert bad_url.code == 1
    _assert_clean(bad_url.err)
