"""A settable clock for tests: no sleeps, time moves when the test says so.

It is ``ctrlrun.testing.Clock``, the clock ctrlrun ships for its users' tests.
"""

from __future__ import annotations

from ctrlrun.testing import Clock

__all__ = ["Clock"]
