"""Grant patterns: matching, the refused forms and containment (08 §3)."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctrlrun.authority.containment
import ctrlrun.authority.delegations
import ctrlrun.policy.patterns
import ctrlrun.authority.resolve
from ctrlrun.policy.patterns import pattern_problem
from ctrlrun.authority.resolve import pattern_contains, pattern_matches
from ctrlrun.errors import InvalidArgument

MATCHES = [
    ("stripe.*", "stripe.refund", "."),
    ("stripe.**", "stripe.refund", "."),
    ("stripe.**", "stripe.refund.partial", "."),
    ("payment:EU-*", "payment:EU-42", ":"),
    ("payment:EU-*", "payment:EU-", ":"),
    ("*", "anything", "."),
    ("**", "stripe", "."),
    ("**", "stripe.refund.partial", "."),
    ("stripe.refund", "stripe.refund", "."),
    ("dana@example.com", "dana@example.com", ""),
    ("dana@*", "dana@example.com", ""),
    ("*", "any.agent:at all", ""),
]
NON_MATCHES = [
    ("stripe.*", "stripe.refund.partial", "."),
    ("stripe.*", "stripe", "."),
    ("stripe.**", "stripe", "."),
    ("payment:EU-*", "payment:EU-42:leg2", ":"),
    ("payment:EU-*", "payment:US-42", ":"),
    ("*", "stripe.refund", "."),
    ("stripe.refund", "Stripe.refund", "."),
    ("stripe.refund", "stripe.refund.x", "."),
    ("stripe.Refund*", "stripe.refund", "."),
    ("dana@*", "eve@example.com", ""),
]
REFUSED = [
    "stripe.?",
    "stripe.[ab]",
    "stripe.]",
    "",
    "stripe..refund",
    ".stripe",
    "stripe.",
    "*stripe",
    "stripe.*fund",
    "st*ripe.refund",
    "stripe.a**",
    "stripe.**a",
    "**.refund",
    "stripe.**.refund",
    "*.**",
    "stripe.re*.**",
    "stripe.***",
    "stripe.a*b*",
]


@pytest.mark.parametrize(("pattern", "value", "sep"), MATCHES)
def test_matches(pattern: str, value: str, sep: str) -> None:
    assert pattern_problem(pattern, sep) is None
    assert pattern_matches(pattern, value, sep)


@pytest.mark.parametrize(("pattern", "value", "sep"), NON_MATCHES)
def test_does_not_match(pattern: str, value: str, sep: str) -> None:
    assert not pattern_matches(pattern, value, sep)


@pytest.mark.parametrize("pattern", REFUSED)
def test_refused_forms(pattern: str) -> None:
    assert pattern_problem(pattern, ".") is not None
    with pytest.raises(InvalidArgument):
        pattern_matches(pattern, "stripe.refund", ".")
    with pytest.raises(InvalidArgument):
        pattern_contains(pattern, "**", ".")


def test_one_segment_subjects_refuse_globstar_and_keep_dots() -> None:
    assert pattern_problem("**", "") is not None
    assert pattern_problem("a.b.c", "") is None
    assert pattern_matches("a.*", "a.b.c", "")  # one segment: '.' is ordinary text
    assert not pattern_matches("a.*", "b.a.c", "")
    assert pattern_problem("*@example.com", "") is not None
    assert pattern_problem(5, ".") is not None


def test_a_non_string_value_never_matches() -> None:
    assert not pattern_matches("**", None, ".")  # type: ignore[arg-type]


CONTAINED = [
    ("stripe.refund", "**"),
    ("**", "**"),
    ("stripe.*", "**"),
    ("stripe.refund", "stripe.**"),
    ("stripe.refund.partial", "stripe.**"),
    ("stripe.*", "stripe.**"),
    ("stripe.**", "stripe.**"),
    ("stripe.refund.**", "stripe.**"),
    ("stripe.refund", "stripe.refund"),
    ("stripe.refund", "stripe.re*"),
    ("stripe.re", "stripe.re*"),
    ("stripe.ref*", "stripe.re*"),
    ("stripe.re*", "stripe.re*"),
    ("stripe.refund", "stripe.*"),
    ("payment:EU-4*", "payment:EU-*"),
    ("payment:EU-42", "payment:*"),
]
NOT_CONTAINED = [
    ("stripe", "stripe.**"),
    ("**", "stripe.**"),
    ("stripe*.x", "stripe.**"),
    ("other.refund", "stripe.**"),
    ("stripe.**", "stripe.*"),
    ("stripe.**", "stripe.refund"),
    ("stripe.refund", "stripe.payout"),
    ("stripe.*", "stripe.refund"),
    ("stripe.re*", "stripe.refund"),
    ("stripe.r*", "stripe.re*"),
    ("stripe.r", "stripe.re*"),
    ("stripe.refund.partial", "stripe.*"),
    ("stripe", "stripe.*"),
]


@pytest.mark.parametrize(("child", "parent"), CONTAINED)
def test_contained(child: str, parent: str) -> None:
    assert pattern_contains(child, parent, ".")


@pytest.mark.parametrize(("child", "parent"), NOT_CONTAINED)
def test_not_contained(child: str, parent: str) -> None:
    assert not pattern_contains(child, parent, ".")


def test_no_fnmatch_and_no_startswith_in_matching_or_containment() -> None:
    for module in (
        ctrlrun.policy.patterns,
        ctrlrun.authority.containment,
        ctrlrun.authority.delegations,
        ctrlrun.authority.resolve,
    ):
        source = inspect.getsource(module)
        assert "fnmatch" not in source, module.__name__
        assert "startswith" not in source, module.__name__


# -- properties -------------------------------------------------------------------------------

_TEXT = st.text(alphabet="ab", min_size=0, max_size=3)
_LITERAL = st.text(alphabet="ab", min_size=1, max_size=3)
_SEGMENT = st.one_of(_LITERAL, _TEXT.map(lambda stem: stem + "*"))


@st.composite
def patterns(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        segments = draw(st.lists(_SEGMENT, min_size=1, max_size=4))
    else:
        segments = draw(st.lists(_LITERAL, min_size=0, max_size=3)) + ["**"]
    return ".".join(segments)


@st.composite
def instances(draw: st.DrawFn, pattern: str, fill: st.SearchStrategy[str] = _TEXT) -> str:
    """A value the pattern matches (``fill`` makes the text its wildcards stand for)."""
    parts: list[str] = []
    for segment in pattern.split("."):
        if segment == "**":
            parts.extend(draw(st.lists(fill, min_size=1, max_size=3)))
        elif segment[-1:] == "*":
            parts.append(segment[:-1] + draw(fill if segment != "*" else _LITERAL))
        else:
            parts.append(segment)
    return ".".join(parts)


@settings(max_examples=300, deadline=None)
@given(patterns())
def test_generated_patterns_are_valid_and_containment_is_reflexive(pattern: str) -> None:
    assert pattern_problem(pattern, ".") is None
    assert pattern_contains(pattern, pattern, ".")


@settings(max_examples=300, deadline=None)
@given(st.data(), patterns(), patterns())
def test_containment_is_sound(data: st.DataObject, child: str, parent: str) -> None:
    value = data.draw(instances(child))
    assert pattern_matches(child, value, ".")
    if pattern_contains(child, parent, "."):
        assert pattern_matches(parent, value, ".")


@settings(max_examples=300, deadline=None)
@given(st.data(), patterns())
def test_containment_is_sound_for_narrowed_children(data: st.DataObject, parent: str) -> None:
    child = data.draw(instances(parent, _LITERAL))  # a literal child built from the parent
    assert pattern_contains(child, parent, ".")
    assert pattern_matches(parent, child, ".")
