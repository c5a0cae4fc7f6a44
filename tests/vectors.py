"""Locate the normative vectors (never edited; read from ../shared/vectors)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def vectors_dir() -> Path:
    override = os.environ.get("CTRLRUN_VECTORS")
    if override:
        return Path(override)
    for candidate in (ROOT.parent / "shared" / "vectors", ROOT / "tests" / "data"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("vectors not found: set CTRLRUN_VECTORS to ../shared/vectors")


def load(name: str) -> Any:
    return json.loads((vectors_dir() / name).read_text(encoding="utf-8"))
