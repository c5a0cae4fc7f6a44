"""Anchoring after every N receipts, off the hot path: the call path only counts, a daemon thread
anchors, and a failed anchor is logged and tried again after the next receipt."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument

__all__ = ["AnchorEvery"]

log = logging.getLogger("ctrlrun.anchors")


class AnchorEvery:
    """An event sink that anchors the store's heads with ``provider`` after every ``every``
    receipts; ``Control(anchor=provider, anchor_every=N)`` adds one."""

    def __init__(self, store: Any, provider: Any, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidArgument(f"Control(anchor_every=...) must be an int >= 1, got {every!r}")
        for name in ("make", "check", "latest", "since"):
            if not callable(getattr(provider, name, None)):
                raise InvalidArgument(f"Control(anchor=...) needs an anchor provider; {provider!r} has no {name}()")
        self.store, self.provider, self.every = store, provider, every
        self.made = 0  # anchor runs that succeeded
        self.failed = 0  # runs that failed (each logged)
        self._count = 0
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def on_event(self, event: Any) -> None:
        """Events are not counted: receipts are."""

    def on_receipt(self, receipt: Any) -> None:
        self.on_batch((), receipt)

    def on_batch(self, events: Sequence[Any], receipt: Any) -> None:
        if receipt is None:
            return
        self._count += 1
        if self._count >= self.every:
            self._count = 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ctrlrun-anchor", daemon=True)
                self._thread.start()
            self._wake.set()

    def wait(self, runs: int, timeout: float | None = None) -> bool:
        """Block until ``runs`` anchor runs (made or failed) have finished; for tests and shutdown."""
        with self._done:
            return self._done.wait_for(lambda: self.made + self.failed >= runs, timeout)

    def close(self) -> None:
        """Stop the thread after the run in progress."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        from .anchors import make_anchors

        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                make_anchors(self.store, self.provider)
                ok = True
            except Exception:  # never the protected call's failure: logged, tried again
                log.warning("anchoring the store's heads failed; trying again after the next receipt", exc_info=True)
                self._count = self.every - 1
                ok = False
            with self._done:
                if ok:
                    self.made += 1
                else:
                    self.failed += 1
                self._done.notify_all()
