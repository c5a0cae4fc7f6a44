"""``ctrlrun.anchors``, the import path the docs name: anchor providers and checks (they live in
``ctrlrun.evidence.anchors``)."""

from __future__ import annotations

from .evidence.anchors import (  # noqa: F401
    Anchor,
    AnchorBreak,
    AnchorProvider,
    AnchorReport,
    AnchorUnavailable,
    DirectoryAnchors,
    RFC3161Anchors,
    anchor_checkpoint,
    anchored_message,
    make_anchors,
    verify_anchors,
)

__all__ = [
    "Anchor",
    "AnchorBreak",
    "AnchorProvider",
    "AnchorReport",
    "AnchorUnavailable",
    "DirectoryAnchors",
    "RFC3161Anchors",
    "anchor_checkpoint",
    "anchored_message",
    "make_anchors",
    "verify_anchors",
]
