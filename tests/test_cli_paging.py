"""``receipts --last/--since/--from-seq`` and ``effects --state/--key-prefix/--limit/--all``: a
page is the matching slice of the full listing, in its line format, and nothing else."""

from __future__ import annotations

import json

import pytest

from ._cli_helpers import invoke


@pytest.fixture
def busy(project):
    for i in range(6):
        project.clock.advance(seconds=1)
        project.call(payment_id=f"txn_{i}", amount=1_000 + i)
    project.ambiguous("txn_x")
    return project


def test_last_n_is_the_tail_of_the_full_listing(busy):
    full = invoke(["receipts"], clock=busy.clock).lines
    assert len(full) == 7
    for n in (1, 3, 7, 20):
        result = invoke(["receipts", "--last", str(n)], clock=busy.clock)
        assert result.code == 0 and result.lines == full[-n:]
    as_json = invoke(["receipts", "--json", "--last", "2"], clock=busy.clock).lines
    assert [json.loads(line)["seq"] for line in as_json] == [6, 7]


def test_from_seq_lists_to_the_head_and_since_takes_an_offset_time(busy):
    full = invoke(["receipts"], clock=busy.clock).lines
    assert invoke(["receipts", "--from-seq", "3"], clock=busy.clock).lines == full[2:]
    assert invoke(["receipts", "--from-seq", "99"], clock=busy.clock).out == ""
    since = full[4].split()[0]  # that receipt's finished_at
    assert invoke(["receipts", "--since", since], clock=busy.clock).lines == full[4:]
    plus_one = since.replace("Z", "").replace("T09:", "T10:") + "+01:00"
    assert invoke(["receipts", "--since", plus_one], clock=busy.clock).lines == full[4:]


@pytest.mark.parametrize("args", (
    ["--last", "2", "--from-seq", "1"], ["--since", "2026-11-30T09:00:00Z", "--last", "1"],
    ["--since", "2026-11-30T09:00:00"], ["--since", "yesterday"], ["--from-seq", "0"],
))  # fmt: skip
def test_bad_or_conflicting_listing_options_are_usage_errors(busy, args):
    result = invoke(["receipts", *args], clock=busy.clock)
    assert result.code == 2 and "Error:" in result.err


def test_effects_limit_is_the_head_of_all_with_the_same_filters(busy):
    for filters in ([], ["--state", "committed"], ["--key-prefix", "refund:txn_"],
                    ["--key-prefix", "refund:txn_%"], ["--key-prefix", "refund:txn_x"]):  # fmt: skip
        every = invoke(["effects", "--all", *filters], clock=busy.clock)
        assert every.code == 0
        lines = every.lines if every.out else []
        for n in (1, 2, 100):
            page = invoke(["effects", "--limit", str(n), *filters], clock=busy.clock)
            assert (page.lines if page.out else []) == lines[:n]
        assert (invoke(["effects", *filters], clock=busy.clock).lines if lines else []) == lines[:100]
    assert len(invoke(["effects", "--key-prefix", "refund:txn_"], clock=busy.clock).lines) == 7
    assert invoke(["effects", "--key-prefix", "refund:txn_%"], clock=busy.clock).lines == [
        "no effects with keys starting 'refund:txn_%'"
    ]


def test_effects_limit_and_all_conflict(busy):
    assert invoke(["effects", "--limit", "2", "--all"], clock=busy.clock).code == 2


def test_effects_default_page_is_100(project):
    for i in range(103):
        project.call(payment_id=f"t{i:03d}", amount=1)
    assert len(invoke(["effects"], clock=project.clock).lines) == 100
    assert len(invoke(["effects", "--all"], clock=project.clock).lines) == 103
    assert len(invoke(["effects", "--all", "--json"], clock=project.clock).lines) == 103


# one convention for every listing: --limit N and --all, --json said to be JSON Lines


@pytest.mark.parametrize("command", [["receipts"], ["effects"], ["pending"]])
def test_every_listing_takes_limit_and_all(busy, command):
    busy.request(payment_id="txn_big1", amount=200_000)
    busy.request(payment_id="txn_big2", amount=200_000)
    every = invoke([*command, "--all"], clock=busy.clock)
    assert every.code == 0, every.err
    assert len(every.lines) >= 2
    for n in (1, 2):
        page = invoke([*command, "--limit", str(n)], clock=busy.clock)
        assert page.code == 0 and page.lines == every.lines[:n], page.err
    both = invoke([*command, "--limit", "1", "--all"], clock=busy.clock)
    assert both.code == 2 and "--limit N or --all" in both.err


def test_receipts_limit_pages_a_since_listing_but_not_last(busy):
    full = invoke(["receipts"], clock=busy.clock).lines
    assert invoke(["receipts", "--from-seq", "3", "--limit", "2"], clock=busy.clock).lines == full[2:4]
    assert invoke(["receipts", "--last", "2", "--limit", "1"], clock=busy.clock).code == 2


def test_a_full_default_page_of_effects_says_so_on_stderr(project):
    from ctrlrun.cli.commands_effects import DEFAULT_LIMIT

    for i in range(DEFAULT_LIMIT + 1):
        project.call(payment_id=f"p{i:03}", amount=100)
    page = invoke(["effects"], clock=project.clock)
    assert len(page.lines) == DEFAULT_LIMIT and "--all" in page.err and "100" in page.err
    assert invoke(["effects", "--all"], clock=project.clock).err == ""
    assert invoke(["effects", "--limit", str(DEFAULT_LIMIT)], clock=project.clock).err == ""


@pytest.mark.parametrize("command", [["receipts"], ["effects"], ["pending"], ["inspect"], ["hold", "list"]])
def test_json_is_said_to_be_json_lines(command):
    text = " ".join(invoke([*command, "--help"]).out.split())
    assert "JSON Lines" in text and "not one JSON array" in text, text
