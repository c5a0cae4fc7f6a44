"""The strict YAML reader: PyYAML's SafeLoader semantics with duplicate keys, merge keys,
bare ``=``, unknown tags and multiple documents refused."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, SequenceNode

from ..errors import PolicyError

__all__ = ["MAX_VALUES", "load_yaml"]

#: Upper bound on the number of values a document may expand to through aliases.
MAX_VALUES = 1_000_000

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses what a policy must never contain and remembers container lines."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.lines: dict[int, int] = {}

    def flatten_mapping(self, node: MappingNode) -> None:
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                raise ConstructorError(
                    None,
                    None,
                    "merge keys ('<<') are not supported; write the keys out, or reuse a whole "
                    "value with an alias (*name)",
                    key_node.start_mark,
                )

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):
            raise ConstructorError(
                None, None, f"expected a mapping node, but found {node.id}", node.start_mark
            )
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        first_line: dict[tuple[type, Any], int] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found an unhashable key (a list or mapping used as a key)",
                    key_node.start_mark,
                )
            marker = (type(key), key)
            if marker in first_line:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} on line {key_node.start_mark.line + 1} "
                    f"(first defined on line {first_line[marker]}); "
                    "each key may appear once per mapping, remove or merge the repeats",
                    key_node.start_mark,
                )
            first_line[marker] = key_node.start_mark.line + 1
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_strict_map(self, node: MappingNode) -> Any:
        data: dict[Any, Any] = {}
        self.lines[id(data)] = node.start_mark.line + 1
        yield data
        data.update(self.construct_mapping(node))

    def construct_strict_seq(self, node: SequenceNode) -> Any:
        data: list[Any] = []
        self.lines[id(data)] = node.start_mark.line + 1
        yield data
        data.extend(self.construct_sequence(node))

    def construct_checked_timestamp(self, node: Any) -> Any:
        try:
            return self.construct_yaml_timestamp(node)
        except ValueError as exc:
            raise ConstructorError(
                None,
                None,
                f"{node.value!r} looks like a date or time but is not a valid one ({exc}); "
                "quote it if it is meant as text",
                node.start_mark,
            ) from None

    def construct_bare_value(self, node: Any) -> Any:
        raise ConstructorError(
            None,
            None,
            "a bare '=' is the YAML 1.1 value key, not text; quote it ('=') if you mean the string",
            node.start_mark,
        )


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_strict_map)
_StrictLoader.add_constructor("tag:yaml.org,2002:seq", _StrictLoader.construct_strict_seq)
_StrictLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", _StrictLoader.construct_checked_timestamp
)
_StrictLoader.add_constructor(_VALUE_TAG, _StrictLoader.construct_bare_value)


def _check_shape(doc: Any, source: str) -> None:
    """Refuse recursive aliases and documents that expand past ``MAX_VALUES`` values."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        key = id(obj)
        if done:
            active.discard(key)
            children = obj.items() if isinstance(obj, dict) else enumerate(obj)
            total = 1
            for _, child in children:
                total += sizes.get(id(child), 1) if isinstance(child, (dict, list)) else 1
            if isinstance(obj, dict):
                total += len(obj)
            sizes[key] = total
            if total > MAX_VALUES:
                raise PolicyError(
                    f"{source}: not valid YAML: the document expands to more than {MAX_VALUES} "
                    "values through aliases; write it without nesting aliases"
                )
            continue
        if key in sizes:
            continue
        if key in active:
            raise PolicyError(
                f"{source}: not valid YAML: an alias refers to a value that contains it "
                "(a recursive structure); policies must be finite trees"
            )
        active.add(key)
        stack.append((obj, True))
        values = obj.values() if isinstance(obj, dict) else obj
        for child in values:
            if isinstance(child, (dict, list)) and id(child) not in sizes:
                stack.append((child, False))


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    """A one-line description of a PyYAML error with its line and column."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    parts: list[str] = []
    if exc.context:
        where = ""
        if exc.context_mark is not None:
            where = f" (line {exc.context_mark.line + 1})"
        parts.append(f"{exc.context}{where}")
    if exc.problem:
        where = ""
        if exc.problem_mark is not None:
            mark = exc.problem_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        parts.append(f"{exc.problem}{where}")
    return " ".join("; ".join(parts).split()) or " ".join(str(exc).split())


def load_yaml(text: str | bytes, source: str) -> tuple[Any, dict[int, int]]:
    """Load one YAML document strictly; returns the data and a map of container id to line."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError(
                f"{source}: not valid YAML: the text is not UTF-8 (byte {exc.start}); "
                "save the file as UTF-8"
            ) from None
    if not isinstance(text, str):
        raise PolicyError(
            f"{source}: a policy must be given as text (str), got {type(text).__name__}"
        )
    loader = _StrictLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {_describe_yaml_error(exc)}") from None
    except RecursionError:
        raise PolicyError(f"{source}: not valid YAML: the document is nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - a converter refusing a scalar
        raise PolicyError(
            f"{source}: not valid YAML: a value cannot be converted ({type(exc).__name__}: "
            f"{exc}); quote it if it is meant as text"
        ) from None
    finally:
        loader.dispose()
    _check_shape(data, source)
    return data, loader.lines
