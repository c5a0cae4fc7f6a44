"""Effect and resource templates: literal text plus ``{name}`` placeholders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, NamedTuple

from ..errors import EffectKeyError, InvalidArgument

__all__ = [
    "Placeholder",
    "TemplateSyntaxError",
    "parse_template",
    "plain_effect_key",
    "render_effect_key",
    "render_resource",
    "template_placeholders",
]


class TemplateSyntaxError(ValueError):
    """A template that is not literal text plus ``{identifier}`` placeholders."""


class Placeholder(NamedTuple):
    """One ``{name}`` in a parsed template."""

    name: str


_GRAMMAR = (
    "a template is literal text plus {name} placeholders, where name is a letter or '_' "
    "followed by letters, digits or '_' (no '{{' escapes, format specs, spaces, "
    "attributes, indexes, or unmatched braces)"
)


def _is_start(ch: str) -> bool:
    return ch == "_" or ch.isalpha()


def _is_continue(ch: str) -> bool:
    return ch == "_" or ch.isalpha() or ch.isdecimal()


@lru_cache(maxsize=1024)
def _parse(text: str) -> tuple[str | Placeholder, ...]:
    if text == "":
        raise TemplateSyntaxError("the template is empty; " + _GRAMMAR)
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "}":
            raise TemplateSyntaxError(f"unmatched '}}' at position {i} in {text!r}; " + _GRAMMAR)
        if ch != "{":
            literal.append(ch)
            i += 1
            continue
        close = text.find("}", i + 1)
        if close < 0:
            raise TemplateSyntaxError(f"unmatched '{{' at position {i} in {text!r}; " + _GRAMMAR)
        name = text[i + 1 : close]
        if "{" in name:
            raise TemplateSyntaxError(
                f"'{{' inside a placeholder at position {i} in {text!r}; " + _GRAMMAR
            )
        if name == "":
            raise TemplateSyntaxError(f"empty placeholder '{{}}' in {text!r}; " + _GRAMMAR)
        if not (_is_start(name[0]) and all(_is_continue(c) for c in name[1:])):
            raise TemplateSyntaxError(
                f"placeholder {{{name}}} in {text!r} is not an identifier; " + _GRAMMAR
            )
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(Placeholder(name))
        i = close + 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def parse_template(text: Any) -> tuple[str | Placeholder, ...]:
    """Parse ``text`` into literal strings and ``Placeholder`` items; ``TemplateSyntaxError`` if invalid."""
    if not isinstance(text, str):
        raise TemplateSyntaxError(
            f"a template must be a string, got {type(text).__name__} ({text!r}); " + _GRAMMAR
        )
    return _parse(str.__str__(text))


def template_placeholders(text: Any) -> tuple[str, ...]:
    """The distinct placeholder names of ``text``, in order of first appearance."""
    seen: dict[str, None] = {}
    for part in parse_template(text):
        if isinstance(part, Placeholder):
            seen.setdefault(part.name, None)
    return tuple(seen)


def _render_value(value: Any) -> str | None:
    """The text a placeholder value renders as, or ``None`` if it may not render."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, str) and value != "":
        return str.__str__(value)
    return None


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"a bool ({value})"
    if isinstance(value, str):
        return "an empty string"
    return f"a {type(value).__name__}"


_VALUE_RULE = "a placeholder value must be a non-empty string or an integer (not a bool)"


@lru_cache(maxsize=1024)
def _plain_plan(template: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """``(literals, names)`` of a valid template naming only arguments (one literal more than
    names, possibly empty), or ``None``."""
    try:
        parts = _parse(template)
    except TemplateSyntaxError:
        return None
    literals, names = [""], []
    for part in parts:
        if isinstance(part, Placeholder):
            if part.name == "resource":
                return None
            names.append(part.name)
            literals.append("")
        else:
            literals[-1] += part
    return tuple(literals), tuple(names)


def plain_effect_key(template: str, arguments: Mapping[str, Any]) -> str | None:
    """The effect key when every placeholder names an argument whose value is exactly a
    non-empty ``str`` or an ``int`` (what a checked value's canonical form gives back unchanged),
    else ``None``: then ``render_effect_key`` decides, and explains a refusal."""
    plan = _plain_plan(template) if type(template) is str else None
    if plan is None:
        return None
    literals, names = plan
    out = literals[0]
    for name, literal in zip(names, literals[1:]):
        value = arguments.get(name)
        kind = type(value)
        if kind is str and value:
            out += value + literal
        elif kind is int:
            out += int.__repr__(value) + literal
        else:
            return None
    return out


def render_effect_key(
    template: str, canonical_arguments: Mapping[str, Any], resource: str | None
) -> str:
    """Render an effect-key template from canonical arguments; ``EffectKeyError`` if it cannot.

    ``{resource}`` names the action's resource field (an argument also called ``resource`` makes
    it ambiguous, and is refused).
    """

    def value_of(name: str) -> Any:
        if name != "resource":
            return _argument(template, "effect", EffectKeyError, canonical_arguments, name)
        if "resource" in canonical_arguments:
            raise EffectKeyError(
                f"effect template {template!r}: placeholder {{resource}} is ambiguous, the "
                "call has an argument named 'resource' and {resource} names the action's "
                "resource; rename the argument or the placeholder"
            )
        if resource is None:
            raise EffectKeyError(
                f"effect template {template!r}: placeholder {{resource}} names the action's "
                "resource, but this action has none; give the action a resource template "
                "or remove {resource}"
            )
        return resource

    return _render(template, "effect", EffectKeyError, value_of)


def render_resource(template: str, arguments: Mapping[str, Any]) -> str:
    """Render a resource template from the call's arguments; ``InvalidArgument`` if it cannot."""
    return _render(
        template,
        "resource",
        InvalidArgument,
        lambda name: _argument(template, "resource", InvalidArgument, arguments, name),
    )


def _argument(
    template: str, kind: str, error: type[Exception], arguments: Mapping[str, Any], name: str
) -> Any:
    if name not in arguments:
        names = ", ".join(sorted(str(k) for k in arguments)) or "none"
        raise error(
            f"{kind} template {template!r}: placeholder {{{name}}} names no argument of "
            f"this call (it has: {names}); pass {name} or fix the template"
        )
    return arguments[name]


def _render(
    template: str, kind: str, error: type[Exception], value_of: Callable[[str], Any]
) -> str:
    """Literal text plus each placeholder's value, rendered by the one value rule."""
    try:
        parts = parse_template(template)
    except TemplateSyntaxError as exc:
        raise error(f"{kind} template {template!r} is invalid: {exc}") from None
    out: list[str] = []
    for part in parts:
        if not isinstance(part, Placeholder):
            out.append(part)
            continue
        value = value_of(part.name)
        text = _render_value(value)
        if text is None:
            raise error(
                f"{kind} template {template!r}: placeholder {{{part.name}}} is {_describe(value)}; "
                f"{_VALUE_RULE}, so pass one for {part.name} or fix the template"
            )
        out.append(text)
    return "".join(out)
