"""One CSRF token per session, valid in all of its forms for the session's life."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import MutableMapping
from typing import Any

__all__ = ["FIELD", "csrf_token", "csrf_valid"]

FIELD = "csrf_token"
_KEY = "csrf"


def csrf_token(session: MutableMapping[str, Any]) -> str:
    """The session's token, made on first use."""
    token = session.get(_KEY)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        session[_KEY] = token
    return token


def csrf_valid(session: MutableMapping[str, Any], submitted: object) -> bool:
    """Whether a form's token is this session's (missing, empty or another session's: no)."""
    token = session.get(_KEY)
    if not isinstance(token, str) or not token or not isinstance(submitted, str):
        return False
    return hmac.compare_digest(token.encode("utf-8"), submitted.encode("utf-8"))
