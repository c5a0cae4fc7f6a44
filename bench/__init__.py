"""ctrlrun's benchmark suite: the hot path measured against the raw cost of storage.

Run it from the repository root::

    python -m bench --quick                          # every benchmark, small sizes (~30 s)
    python -m bench --reference /tmp/ref/bin/python  # the full run (~1.5 min), A/B too
    python -m bench --write-docs                     # ... then rewrite docs/performance.md

``python -m bench --help`` lists the flags. Every figure is measured in the same run as the
baseline it is compared with; see docs/performance.md for what each line means.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _ensure_ctrlrun_importable() -> None:
    """Fall back to the source tree when ctrlrun is not installed (``pip install -e .`` is not
    required to run the benchmarks from a clone)."""
    try:
        import ctrlrun  # noqa: F401
    except ImportError:
        src = str(REPO / "src")
        if src not in sys.path:
            sys.path.insert(0, src)


_ensure_ctrlrun_importable()
