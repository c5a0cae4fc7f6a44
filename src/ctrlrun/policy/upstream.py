"""Validation of an entry's ``upstream`` pin: certificate digests, certificate files, tool schema."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from typing import Any

from .context import LoadContext, type_name
from .model import UpstreamPin

__all__ = ["DIGEST_PATTERN", "validate_upstream"]

DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}\Z")
_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL)
_KEYS = ("tls_cert_sha256", "tls_cert_file", "tool_schema_sha256")
_DIGEST_FIX = "a digest is 'sha256:' followed by 64 lowercase hex characters"


def _digest(ctx: LoadContext, where: str, key: str, value: Any, node: Any) -> str:
    if not isinstance(value, str) or not DIGEST_PATTERN.match(value):
        raise ctx.error(
            where, f"{key} value {value!r} is not a certificate digest; {_DIGEST_FIX}", node
        )
    return value


def _one_or_many(ctx: LoadContext, where: str, key: str, value: Any, node: Any) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise ctx.error(where, f"{key} is an empty list; give at least one value", node)
        return value
    return [value]


def _certificate_digests(ctx: LoadContext, where: str, path: str, node: Any) -> set[str]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ctx.error(
            where, f"tls_cert_file {path!r} cannot be read ({exc.strerror or exc})", node
        ) from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ctx.error(where, f"tls_cert_file {path!r} is not a PEM file", node) from None
    digests: set[str] = set()
    for body in _PEM_CERT.findall(text):
        try:
            der = base64.b64decode("".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ctx.error(
                where, f"tls_cert_file {path!r} holds a certificate that is not valid base64", node
            ) from None
        digests.add("sha256:" + hashlib.sha256(der).hexdigest())
    if not digests:
        raise ctx.error(
            where, f"tls_cert_file {path!r} holds no PEM certificate (BEGIN CERTIFICATE)", node
        )
    return digests


def validate_upstream(ctx: LoadContext, where: str, value: Any) -> UpstreamPin:
    """Check an ``upstream`` mapping and return the pin it declares."""
    where = f"{where} upstream"
    if not isinstance(value, dict):
        raise ctx.error(where, f"upstream must be a mapping, got {type_name(value)}")
    unknown = [k for k in value if k not in _KEYS]
    if unknown:
        raise ctx.error(
            where,
            f"unknown key {unknown[0]!r}; upstream takes only {', '.join(_KEYS)}",
            value,
        )
    if not value:
        raise ctx.error(
            where, f"upstream pins nothing; give one of {', '.join(_KEYS)} or remove it", value
        )
    digests: list[str] = []
    if "tls_cert_sha256" in value:
        items = _one_or_many(ctx, where, "tls_cert_sha256", value["tls_cert_sha256"], value)
        digests = [_digest(ctx, where, "tls_cert_sha256", item, value) for item in items]
    files: list[str] = []
    if "tls_cert_file" in value:
        items = _one_or_many(ctx, where, "tls_cert_file", value["tls_cert_file"], value)
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise ctx.error(
                    where, f"tls_cert_file value {item!r} must be a non-empty path string", value
                )
            path = (
                item
                if os.path.isabs(item) or ctx.base_dir is None
                else os.path.join(ctx.base_dir, item)
            )
            found = _certificate_digests(ctx, where, path, value)
            if digests and found.isdisjoint(digests):
                raise ctx.error(
                    where,
                    f"no certificate in tls_cert_file {item!r} matches a tls_cert_sha256 digest; "
                    "update the digests or the file",
                    value,
                )
            files.append(os.path.abspath(path))
    tool: str | None = None
    if "tool_schema_sha256" in value:
        tool = _digest(ctx, where, "tool_schema_sha256", value["tool_schema_sha256"], value)
    return UpstreamPin(
        tls_cert_sha256=tuple(digests), tls_cert_file=tuple(files), tool_schema_sha256=tool
    )
