"""The action: one proposed call, its canonical form and its SHA-256 hash."""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from ._frozen import builder
from .errors import InvalidArgument

__all__ = [
    "ACTION_SCHEMA",
    "Action",
    "Principal",
    "action_from_dict",
    "action_hash",
    "action_to_dict",
    "canonical_bytes",
    "canonicalize",
    "check_value",
    "freeze",
    "new_id",
    "sha256_hex",
    "thaw",
]

ACTION_SCHEMA = "ctrlrun.action/v1"

_FLOAT_FIX = (
    "use integer minor units (amount=200000) or a decimal string (\"2000.00\"); "
    "binary floats are not portable between hosts"
)


def new_id(prefix: str) -> str:
    """A new ``<prefix>_`` + 32 lowercase hex id (128 random bits from ``os.urandom``)."""
    try:
        return prefix + "_" + _random_hex.popleft()
    except IndexError:
        pass
    # one system call for the next 64 ids; popleft is atomic, so no two threads share one
    pool = os.urandom(16 * 64).hex()
    _random_hex.extend([pool[i : i + 32] for i in range(32, len(pool), 32)])
    return prefix + "_" + pool[:32]


_random_hex: deque[str] = deque()  # 32-hex-digit ids drawn ahead from os.urandom
if hasattr(os, "register_at_fork"):  # a forked child never repeats its parent's
    os.register_at_fork(after_in_child=_random_hex.clear)


def sha256_hex(data: bytes) -> str:
    """``"sha256:" + hex`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


MAX_DEPTH = 64
"""Lists and mappings nest at most this deep inside an action's arguments."""
MAX_INT_BITS = 13_000
"""An int argument's magnitude is below ``2**13000`` (about 3,900 decimal digits)."""


def _surely_valid(value: Any, depth: int = 0) -> bool:
    """True when ``_check_value`` passes ``value`` for sure: exact ``dict``/``list``/``tuple``/
    ``str``/``int``/``bool``/``None`` all the way down, every string UTF-8, within the limits.
    False leaves the verdict (and the path it names) to ``_check_value``."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _utf8(value)
    if kind is int:
        return bool(value.bit_length() <= MAX_INT_BITS)
    if kind is bool or value is None:
        return True
    if depth > MAX_DEPTH:
        return False
    if kind is dict or kind is MappingProxyType:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _utf8(key)):
                return False
            if not _surely_valid(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if not _surely_valid(item, depth + 1):
                return False
        return True
    return False


def check_value(value: Any, path: str) -> None:
    """Refuse anything the canonical form cannot carry, naming ``path`` and the fix."""
    if not _surely_valid(value):  # the common case, without building a path per value
        _check_value(value, path)


def _check_value(value: Any, path: str, depth: int = 0) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise InvalidArgument(
                f"{path} is an int of {value.bit_length():,} bits; an action carries ints below "
                f"2**{MAX_INT_BITS} (about 3,900 digits): pass a larger number as a string"
            )
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"{path} holds a string UTF-8 cannot encode (a lone surrogate); "
                "pass valid Unicode text"
            ) from None
        return
    if isinstance(value, float):
        raise InvalidArgument(f"{path} is a float ({value!r}); {_FLOAT_FIX}")
    if isinstance(value, (Mapping, list, tuple)) and depth > MAX_DEPTH:
        where = path if len(path) <= 80 else path[:60] + "…"
        raise InvalidArgument(
            f"{where} nests lists and mappings more than {MAX_DEPTH} deep; flatten it (or pass "
            "the deep part as a JSON string)"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(
                    f"{path} has a {type(key).__name__} key {key!r}; mapping keys must be str"
                )
            _check_value(key, f"{path} key {key!r}", depth)
            _check_value(item, f"{path}.{key}", depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_value(item, f"{path}[{index}]", depth + 1)
        return
    raise InvalidArgument(
        f"{path} is a {type(value).__name__}, which an action cannot carry; "
        "use str, int, bool, None, lists and str-keyed mappings"
    )


def freeze(value: Any) -> Any:
    """A deep read-only copy: mappings become read-only proxies, lists become tuples."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict or isinstance(value, Mapping):
        return MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A deep plain copy (``dict`` and ``list``) of a frozen value."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict or kind is MappingProxyType:
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


class _Unplain(Exception):
    """Raised by ``_plain_checked`` where ``check_value`` may refuse (or the case is unusual)."""


_SCALARS = (str, int)
_CONTAINERS = (list, tuple)
_NOT_MAPPING = (str, int, float, list, tuple)


def _plain_checked(value: Any) -> Any:
    """``_plain(value)``, checking on the way what ``check_value`` checks except UTF-8.

    Raises ``_Unplain`` at a float, a non-``str`` key, an unknown type, or any object whose kind
    is ambiguous (say an ``int`` that is also a ``Mapping``); the caller then takes the checked
    path, which decides. Exact ``dict``/``list``/``tuple``/``str``/``int`` are taken first.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict or kind is MappingProxyType:
        plain = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unplain
            plain[key] = _plain_checked(item)
        return plain
    if kind is list or kind is tuple:
        return [_plain_checked(item) for item in value]
    if kind is float:
        raise _Unplain
    # subclasses and other mappings, each only when it is one kind of thing
    mapping = isinstance(value, Mapping)
    if mapping and not isinstance(value, _NOT_MAPPING):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Unplain
            plain[key] = _plain_checked(item)
        return plain
    if mapping or isinstance(value, float):
        raise _Unplain
    if isinstance(value, _SCALARS) and not isinstance(value, _CONTAINERS):
        return value
    if isinstance(value, _CONTAINERS) and not isinstance(value, _SCALARS):
        return [_plain_checked(item) for item in value]
    raise _Unplain


_json_str = json.encoder.encode_basestring  # a str as JSON text, non-ASCII kept (as the encoders)


def _json_opt(value: str | None) -> str:
    return "null" if value is None else _json_str(value)


# what json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False) builds on every call, built once
_CANONICAL_JSON = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def encoder_of(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` without its Python layers: the C encoder it would build, built
    directly, fresh per call (so a circular value is still refused). Same text, same errors;
    ``encoder.encode`` itself where there is no C encoder or it would not use it."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:
        return encoder.encode
    codec = json.encoder
    quote = codec.encode_basestring_ascii if encoder.ensure_ascii else codec.encode_basestring
    options = (encoder.key_separator, encoder.item_separator, encoder.sort_keys,
               encoder.skipkeys, encoder.allow_nan)  # fmt: skip
    default, circular, join = encoder.default, encoder.check_circular, "".join

    def encode(value: Any) -> str:
        return join(make({} if circular else None, default, quote, None, *options)(value, 0))

    return encode


_canonical_text = encoder_of(_CANONICAL_JSON)


def _canonical_checked(obj: Any) -> bytes:
    check_value(obj, "value")
    return _CANONICAL_JSON.encode(_plain(obj)).encode("utf-8")


def canonical_bytes(obj: Any) -> bytes:
    """The one canonical encoder: sorted keys, no whitespace, UTF-8, floats refused."""
    try:
        plain = _plain_checked(obj)
        # A lone surrogate survives ``ensure_ascii=False`` and fails the encode: one UTF-8 check
        # of the whole text instead of one per string.
        return _canonical_text(plain).encode("utf-8")
    except (_Unplain, UnicodeEncodeError):
        pass
    # Something is refused: the checked path raises the refusal naming where it is.
    return _canonical_checked(obj)


def _require_text(value: Any, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is str and value and value.isascii():
        return  # ASCII text: nothing to refuse
    if not isinstance(value, str) or value == "":
        kind = "a non-empty string or None" if optional else "a non-empty string"
        raise InvalidArgument(f"{what} must be {kind}, got {value!r}")
    check_value(value, what)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who proposes an action; only ``agent`` and ``user`` enter the action hash."""

    agent: str
    user: str | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)
    issuer: str | None = None
    expires_at: datetime | None = None

    def __post_init__(self) -> None:
        _require_text(self.agent, "principal agent")
        _require_text(self.user, "principal user", optional=True)
        _require_text(self.issuer, "principal issuer", optional=True)
        if self.expires_at is not None and (
            not isinstance(self.expires_at, datetime) or self.expires_at.utcoffset() is None
        ):
            raise InvalidArgument("principal expires_at must be a timezone-aware datetime or None")
        if not isinstance(self.claims, Mapping):
            raise InvalidArgument("principal claims must be a mapping")
        for key, item in self.claims.items():
            if not isinstance(key, str):
                raise InvalidArgument(f"principal claims key {key!r} must be a str")
            ok = isinstance(item, (str, int, bool)) and not isinstance(item, float)
            ok = ok or (isinstance(item, (list, tuple)) and all(isinstance(i, str) for i in item))
            if not ok:
                raise InvalidArgument(
                    f"principal claims.{key} must be str, int, bool or a list of str, got {item!r}"
                )
            check_value(item, f"principal claims.{key}")
        object.__setattr__(self, "claims", freeze(self.claims))

    def to_dict(self) -> dict[str, Any]:
        """The receipt form of the principal."""
        from ._time import format_ts

        return {
            "agent": self.agent,
            "user": self.user,
            "claims": thaw(self.claims),
            "issuer": self.issuer,
            "expires_at": format_ts(self.expires_at) if self.expires_at else None,
        }


_FLAT = frozenset((str, int, bool, type(None)))  # exact types the JSON round trip keeps as they are


def _flat_text(arguments: dict[Any, Any], *, sort: bool = True) -> str | None:
    """The canonical JSON of ``arguments`` when every key is ASCII ``str`` and every value an
    ASCII ``str``, ``int``, ``bool`` or ``None`` (exact types): the arguments most calls pass,
    written as the canonical encoder writes them (``sort=False``: as the compact encoder does,
    keys in their order). ``None`` for anything else."""
    parts = []
    try:
        # the encoder's order: keys are unique, so values never compare
        keys = sorted(arguments) if sort else arguments
    except TypeError:  # keys of different types
        return None
    for key in keys:
        if type(key) is not str or not key.isascii():
            return None
        value = arguments[key]
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return None
            text = _json_str(value)
        elif kind is int:
            if value.bit_length() > MAX_INT_BITS:
                return None
            text = int.__repr__(value)
        elif value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        else:
            return None
        parts.append(_json_str(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


def _plain_copy(value: Any) -> Any:
    """A deep copy of parsed JSON (dicts, lists and atoms): what parsing it again would give."""
    if type(value) is dict:
        return {k: v if type(v) not in _NESTED else _plain_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [v if type(v) not in _NESTED else _plain_copy(v) for v in value]
    return value


_NESTED = frozenset((dict, list))  # what a JSON parse gives that holds other values


@dataclass(frozen=True, slots=True, eq=False)
class Action:
    """One proposed call. Equality follows ``action_id`` (the proposal), not the content."""

    name: str
    arguments: Mapping[str, Any]
    principal: Principal
    resource: str | None = None
    environment: str = "production"
    action_id: str = field(default_factory=lambda: new_id("act"))
    _canonical: bytes = field(default=b"", repr=False, compare=False)
    _hash: str = field(default="", repr=False, compare=False)
    _parsed: Any = field(default=None, init=False, repr=False, compare=False)
    _arguments_json: str = field(default="", init=False, repr=False, compare=False)
    #: every argument an ASCII ``str`` key with an ASCII ``str``, ``int``, ``bool`` or ``None``
    _flat: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        principal = self.principal
        if type(principal) is not Principal and not isinstance(principal, Principal):
            raise InvalidArgument(f"action {self.name!r}: principal must be a Principal")
        # the canonical text around the arguments and the resource, per name, environment
        # and who: kept once those texts are checked (most calls repeat them)
        name, environment = self.name, self.environment
        around = None
        if type(name) is str and type(environment) is str:  # else unhashable, perhaps: refused
            around = _AROUND.get((name, environment, principal.agent, principal.user))
        if around is None:
            _require_text(self.name, "action name")
            _require_text(self.environment, "action environment")
            around = _around(name, environment, principal)
        _require_text(self.resource, "action resource", optional=True)
        if type(self.arguments) is not dict and not isinstance(self.arguments, Mapping):
            raise InvalidArgument(
                f"action {self.name!r}: arguments must be a mapping, "
                f"got {type(self.arguments).__name__}"
            )
        if not isinstance(self.action_id, str) or not self.action_id:
            raise InvalidArgument(f"action {self.name!r}: action_id must be a non-empty string")
        given = self.arguments
        flat = _flat_text(given) if type(given) is dict else None
        if flat is not None:
            # str keys and str/int/bool/None values, all text ASCII: nothing to refuse, nothing
            # nested to freeze, and the dict is its own plain form
            object.__setattr__(self, "arguments", MappingProxyType(dict(given)))
            object.__setattr__(self, "_flat", True)
            arguments = flat
        else:
            check_value(given, "arguments")
            object.__setattr__(self, "arguments", freeze(given))
            arguments = _CANONICAL_JSON.encode(_plain(self.arguments))
        canonical = (
            '{"arguments":' + arguments + around + _json_opt(self.resource) + _SCHEMA_TAIL
        ).encode("utf-8")
        object.__setattr__(self, "_arguments_json", arguments)
        object.__setattr__(self, "_canonical", canonical)
        object.__setattr__(self, "_hash", sha256_hex(canonical))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Action):
            return NotImplemented
        return self.action_id == other.action_id

    def __hash__(self) -> int:
        return hash(self.action_id)

    @property
    def action_hash(self) -> str:
        """``"sha256:" + 64 hex`` over the canonical form."""
        return self._hash

    @property
    def canonical_arguments(self) -> dict[str, Any]:
        """A fresh plain dict parsed back from the canonical form (what the function receives)."""
        if self._flat:  # what parsing the canonical form gives: the values, keys sorted
            arguments = self.arguments
            return {key: arguments[key] for key in sorted(arguments)}
        copy: dict[str, Any] = _plain_copy(self._arguments_view())
        return copy

    def _arguments_view(self) -> dict[str, Any]:
        """The canonical arguments parsed once and shared: read them, never change them."""
        parsed = self._parsed
        if parsed is None:
            arguments = self.arguments
            if self._flat:  # parsing the canonical form gives the same values, keys sorted
                parsed = {key: arguments[key] for key in sorted(arguments)}
            else:
                for value in arguments.values():
                    if type(value) not in _FLAT:
                        parsed = json.loads(self._canonical)["arguments"]
                        break
                else:
                    parsed = {key: arguments[key] for key in sorted(arguments)}
            object.__setattr__(self, "_parsed", parsed)
        view: dict[str, Any] = parsed
        return view

    def replace(self, **changes: Any) -> Action:
        """A new proposal with some fields changed (a new ``action_id`` unless given)."""
        values: dict[str, Any] = {
            "name": self.name,
            "arguments": self.arguments,
            "principal": self.principal,
            "resource": self.resource,
            "environment": self.environment,
        }
        values.update(changes)
        return Action(**values)


_build_action = builder(Action)

# The canonical document, keys sorted: {"arguments", "environment", "name", "principal":
# {"agent", "user"}, "resource", "schema"}, written around the arguments' own canonical text
# (which the receipt reuses); every string is checked text.
_AROUND: dict[tuple[str, str, str, str | None], str] = {}
_SCHEMA_TAIL = ',"schema":"' + ACTION_SCHEMA + '"}'


def _around(name: str, environment: str, principal: Principal) -> str:
    """The canonical text from after the arguments to the resource's value, kept."""
    text = (
        ',"environment":' + _json_str(environment) + ',"name":' + _json_str(name)
        + ',"principal":{"agent":' + _json_str(principal.agent) + ',"user":'
        + _json_opt(principal.user) + '},"resource":'
    )  # fmt: skip
    if len(_AROUND) >= 1024:
        _AROUND.clear()
    _AROUND[(name, environment, principal.agent, principal.user)] = text
    return text


def new_action(
    name: str, arguments: Mapping[str, Any], principal: Principal, resource: str | None,
    environment: str,
) -> Action:  # fmt: skip
    """``Action(name, arguments, principal, resource, environment=environment)``, built at a
    third of a frozen dataclass's cost (the call path makes one per call)."""
    action = _build_action(name, arguments, principal, resource, environment)
    action.__post_init__()
    return action


def canonicalize(action: Action) -> bytes:
    """The canonical bytes (``ctrlrun.action/v1``) of ``action``."""
    return action._canonical


def action_hash(action: Action) -> str:
    """The action hash of ``action``."""
    return action.action_hash


def action_to_dict(action: Action) -> dict[str, Any]:
    """A JSON-safe dict that rebuilds ``action`` exactly (id, claims, issuer, expiry included)."""
    from ._time import format_precise

    principal = action.principal
    return {
        "action_id": action.action_id,
        "name": action.name,
        "arguments": thaw(action.arguments),
        "resource": action.resource,
        "environment": action.environment,
        "principal": {
            "agent": principal.agent,
            "user": principal.user,
            "claims": thaw(principal.claims),
            "issuer": principal.issuer,
            "expires_at": format_precise(principal.expires_at) if principal.expires_at else None,
        },
    }


def action_from_dict(document: Mapping[str, Any]) -> Action:
    """The inverse of ``action_to_dict``."""
    from ._time import parse_ts

    p = document["principal"]
    principal = Principal(
        agent=p["agent"],
        user=p.get("user"),
        claims=p.get("claims") or {},
        issuer=p.get("issuer"),
        expires_at=parse_ts(p["expires_at"]) if p.get("expires_at") else None,
    )
    return Action(
        name=document["name"],
        arguments=document["arguments"],
        principal=principal,
        resource=document.get("resource"),
        environment=document["environment"],
        action_id=document["action_id"],
    )
