"""The normative vectors: ``../shared/vectors`` when the specification sits beside the repository,
else the verbatim copies in ``tests/data`` (a test keeps the two identical)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "vectors"
COPIES = ROOT / "tests" / "data"


def vectors_dir() -> Path:
    override = os.environ.get("CTRLRUN_VECTORS")
    if override:
        return Path(override)
    return SHARED if SHARED.is_dir() else COPIES


def load(name: str) -> Any:
    return json.loads((vectors_dir() / name).read_text(encoding="utf-8"))
