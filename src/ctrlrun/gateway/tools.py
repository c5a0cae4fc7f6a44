"""The tools the upstream lists: the listing filter, the schema cache, the schema pre-flight."""

from __future__ import annotations

from typing import Any

__all__ = ["Catalog"]


class Catalog:
    """What the gateway knows of the upstream's tools (cached from relayed ``tools/list``)."""

    def relay_result(self, method: str | None, message: dict[str, Any]) -> dict[str, Any]:
        """The upstream's answer to a relayed request of ``method``, as the client gets it:
        ``initialize`` loses the ``tasks`` capability, ``tools/list`` is filtered (and its
        schemas cached); anything else is returned unchanged."""
        raise NotImplementedError

    def relay_notification(self, message: dict[str, Any]) -> None:
        """Note a notification from the upstream (``notifications/tools/list_changed`` drops
        the cached schemas)."""
        raise NotImplementedError
