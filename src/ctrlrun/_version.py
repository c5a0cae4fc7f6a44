"""The installed distribution's version, apart because ``importlib.metadata`` is slow to import."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("ctrlrun")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"
