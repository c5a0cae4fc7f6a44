"""Grant patterns: validation, matching and containment, compared segment by segment.

A segment is a literal, or a literal followed by one ``*``; the last segment may be ``**``
when every earlier one is a literal. An empty separator makes the whole text one segment.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import InvalidArgument

__all__ = ["GLOBSTAR", "pattern_contains", "pattern_matches", "pattern_problem"]

GLOBSTAR = "**"
_FORBIDDEN = ("?", "[", "]")
_SHAPE = (
    "a segment is a literal or a literal followed by one '*', and only the last segment may be '**'"
)


def _split(text: str, sep: str) -> list[str]:
    return text.split(sep) if sep else [text]


def _is_wildcard(segment: str) -> bool:
    return segment[-1:] == "*"


def pattern_problem(pattern: object, sep: str) -> str | None:
    """What is wrong with ``pattern`` (a phrase to follow the pattern in a message), or ``None``."""
    if not isinstance(pattern, str):
        return f"is a {type(pattern).__name__}, not a string"
    if pattern == "":
        return "is empty"
    for char in _FORBIDDEN:
        if char in pattern:
            return f"contains {char!r}; {_SHAPE}"
    segments = _split(pattern, sep)
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment == "":
            return f"has an empty segment; join segments with a single {sep!r}"
        if segment == GLOBSTAR:
            if not sep:
                return "is '**', which is refused here; use '*' or a literal"
            if index != last:
                return "has '**' before the last segment; '**' may only end a pattern"
            if any("*" in earlier for earlier in segments[:index]):
                return (
                    "puts a wildcard before '**'; every segment before '**' must be a literal "
                    "(write 'stripe.**', not '*.**')"
                )
            continue
        stars = segment.count("*")
        if stars == 0:
            continue
        if stars > 1 or not _is_wildcard(segment):
            return f"has the segment {segment!r}; {_SHAPE}"
    return None


@lru_cache(maxsize=4096)
def _compiled(pattern: str, sep: str) -> tuple[tuple[str, ...], bool]:
    """The segments of a valid pattern, and whether it ends in ``**`` (then left out)."""
    problem = pattern_problem(pattern, sep)
    if problem is not None:
        raise InvalidArgument(f"pattern {pattern!r} {problem}")
    segments = _split(pattern, sep)
    if segments[-1] == GLOBSTAR:
        return tuple(segments[:-1]), True
    return tuple(segments), False


def _prefix_of(prefix: str, text: str) -> bool:
    return text[: len(prefix)] == prefix


def _segment_matches(segment: str, text: str) -> bool:
    if _is_wildcard(segment):
        return _prefix_of(segment[:-1], text)
    return segment == text


def pattern_matches(pattern: str, value: str, sep: str) -> bool:
    """Whether ``value`` matches ``pattern``; an invalid pattern raises ``InvalidArgument``."""
    if not isinstance(pattern, str):
        raise InvalidArgument(f"pattern {pattern!r} is not a string")
    segments, globstar = _compiled(pattern, sep)
    if not isinstance(value, str):
        return False
    parts = _split(value, sep)
    if globstar:
        if len(parts) <= len(segments):
            return False
        return all(segment == part for segment, part in zip(segments, parts))
    if len(parts) != len(segments):
        return False
    return all(_segment_matches(segment, part) for segment, part in zip(segments, parts))


def _full(pattern: str, sep: str) -> tuple[str, ...]:
    segments, globstar = _compiled(pattern, sep)
    return segments + (GLOBSTAR,) if globstar else segments


def _segment_contains(child: str, parent: str) -> bool:
    if not _is_wildcard(parent):
        return child == parent
    stem = child[:-1] if _is_wildcard(child) else child
    return _prefix_of(parent[:-1], stem)


def pattern_contains(child: str, parent: str, sep: str) -> bool:
    """Whether every value ``child`` matches is matched by ``parent`` (``**`` counts as one
    segment); invalid patterns raise ``InvalidArgument``."""
    if not isinstance(child, str) or not isinstance(parent, str):
        raise InvalidArgument(f"patterns must be strings, got {child!r} and {parent!r}")
    theirs = _full(child, sep)
    ours = _full(parent, sep)
    if ours[-1] == GLOBSTAR:
        stem = ours[:-1]
        return len(theirs) > len(stem) and theirs[: len(stem)] == stem
    if theirs[-1] == GLOBSTAR or len(theirs) != len(ours):
        return False
    return all(_segment_contains(c, p) for c, p in zip(theirs, ours))
