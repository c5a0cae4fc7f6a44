"""The loaded policy: evaluation, the policy hash and the per-action accessors."""

from __future__ import annotations

import copy
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..action import canonical_bytes, freeze, sha256_hex
from ..errors import CTRLRunError, InvalidArgument, PolicyError
from .context import LoadContext
from .loader import load_yaml
from .model import ControlDef, Decision, Evaluation
from .validate import Document, EntryPlan, validate_document

__all__ = ["DEFAULT_ENVIRONMENT", "Policy"]

logger = logging.getLogger("ctrlrun.policy")

DEFAULT_ENVIRONMENT = "production"
_UNKNOWN = Evaluation(Decision.DENY, "unknown_action", ())


class _Compiled:
    """The hot-path form of one entry: precomputed evaluations and compiled rules."""

    __slots__ = ("fixed", "no_match", "rules", "scope_labels")

    def __init__(self, plan: EntryPlan, order: Mapping[str, int]) -> None:
        def ordered(*groups: tuple[str, ...]) -> tuple[str, ...]:
            ids = {c for group in groups for c in group}
            return tuple(sorted(ids, key=order.__getitem__))

        base = plan.settings.controls
        self.fixed: Evaluation | None = None
        if plan.decision is not None:
            self.fixed = Evaluation(plan.decision, "decision", ordered(base))
        self.rules = tuple(
            (rule.conditions, Evaluation(rule.decision, f"rule[{i}]", ordered(base, rule.controls)))
            for i, rule in enumerate(plan.rules)
        )
        self.no_match = Evaluation(Decision.DENY, "no_matching_rule", ordered(base))
        uses_scope = any(rule.uses_data_scope for rule in plan.rules)
        self.scope_labels: tuple[tuple[str, str], ...] | None = (
            tuple(plan.settings.data.items()) if uses_scope else None
        )


def _read_policy_file(path: Path) -> str:
    shown = str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise PolicyError(
            f"{shown}: policy file not found; create it (ctrlrun init) or point CTRLRUN_CONFIG at it"
        ) from None
    except OSError as exc:
        raise PolicyError(f"{shown}: policy file cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise PolicyError(f"{shown}: is a directory, not a policy file")
    if not stat.S_ISREG(info.st_mode):
        raise PolicyError(f"{shown}: is not a regular file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"{shown}: policy file cannot be read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            f"{shown}: policy file is not UTF-8 text (invalid byte at offset {exc.start}); "
            "save it as UTF-8"
        ) from None


class Policy:
    """A validated policy document; ``evaluate`` decides actions and never raises."""

    __slots__ = (
        "_authority",
        "_compiled",
        "_doc",
        "_hash_base",
        "_policy_hash",
        "_registry_view",
        "_runtime_hashes",
        "_source",
    )

    def __init__(self, document: Document, source: str) -> None:
        """Build from a validated ``Document``; use ``from_yaml`` or ``from_file`` instead."""
        self._source = source
        self._doc = document
        order = {control_id: i for i, control_id in enumerate(document.registry)}
        self._compiled = {name: _Compiled(plan, order) for name, plan in document.entries.items()}
        self._hash_base = {
            "actions": copy.deepcopy(document.actions_raw),
            "authority": copy.deepcopy(document.authority_hash),
            "controls": copy.deepcopy(document.controls_raw),
            "mode": document.mode,
            "schema": document.schema,
        }
        self._runtime_hashes: dict[str, str] = {}
        try:
            self._policy_hash = self._hash_for(document.environment or DEFAULT_ENVIRONMENT)
        except CTRLRunError as exc:  # pragma: no cover - validation leaves only JSON values
            raise PolicyError(f"{source}: the policy cannot be hashed: {exc}") from None
        self._authority = (
            freeze(document.authority_raw) if document.authority_raw is not None else None
        )
        self._registry_view = (
            MappingProxyType(
                {cid: MappingProxyType(c.model_dump()) for cid, c in document.registry.items()}
            )
            if document.controls_raw is not None
            else None
        )

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "<string>") -> Policy:
        """Load a policy from YAML text; any fault raises ``PolicyError`` naming ``source``."""
        return cls._load(text, source, None)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None = None) -> Policy:
        """Load ``path``, else ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml``."""
        from ..settings import policy_path

        resolved = policy_path(path)
        text = _read_policy_file(resolved)
        return cls._load(text, str(resolved), str(resolved.parent))

    @classmethod
    def _load(cls, text: str, source: str, base_dir: str | None) -> Policy:
        if not isinstance(source, str) or source == "":
            raise PolicyError("a policy source must be a non-empty string")
        doc, lines = load_yaml(text, source)
        ctx = LoadContext(source=source, lines=lines, base_dir=base_dir)
        try:
            document = validate_document(ctx, doc)
        except RecursionError:
            raise PolicyError(f"{source}: the policy is nested too deeply") from None
        return cls(document, source)

    # -- deciding --------------------------------------------------------------------------

    def evaluate(self, action: Any) -> Evaluation:
        """Decide ``action`` from its name and (canonical forms of its) arguments; never raises."""
        try:
            name = action.name
            entry = self._compiled.get(name) if isinstance(name, str) else None
            if entry is None:
                return _UNKNOWN
            if entry.fixed is not None:
                return entry.fixed
            # The frozen arguments are read directly; each condition converts the one value it
            # reads to its canonical form, which avoids a JSON round trip per call.
            args = action.arguments
            scope = None
            if entry.scope_labels is not None:
                scope = frozenset(label for arg, label in entry.scope_labels if arg in args)
            # Every condition of a consulted rule runs (no short cut), so each absent or
            # mistyped argument it names is warned about, not only the first.
            for conditions, evaluation in entry.rules:
                holds = True
                for condition in conditions:
                    if not condition(args, scope, name):
                        holds = False
                if holds:
                    return evaluation
            return entry.no_match
        except Exception:  # evaluation must fail closed, never raise
            logger.exception("policy evaluation failed; denying")
            return Evaluation(Decision.DENY, "evaluation_error", ())

    # -- hashing ---------------------------------------------------------------------------

    def _hash_for(self, environment: str) -> str:
        cached = self._runtime_hashes.get(environment)
        if cached is None:
            document = dict(self._hash_base, environment=environment)
            cached = sha256_hex(canonical_bytes(document))
            if len(self._runtime_hashes) < 64:
                self._runtime_hashes[environment] = cached
        return cached

    @property
    def policy_hash(self) -> str:
        """``"sha256:" + hex`` over the canonical policy (environment as the document says)."""
        return self._policy_hash

    def runtime_hash(self, environment: str | None = None, *, authority: Mapping[str, Any] | None = None) -> str:
        """The hash with the effective environment substituted; ``policy_hash`` when it is the
        document's. ``authority``: the hashed form of an authority enforced instead of the
        document's own section (``Authority.hash_member()``)."""
        if authority is not None:
            document = dict(self._hash_base, authority=dict(authority))
            if environment is not None:
                document["environment"] = environment
            return sha256_hex(canonical_bytes(document))
        if environment is None:
            return self._policy_hash
        if not isinstance(environment, str) or not environment:
            raise InvalidArgument(
                f"runtime_hash environment must be a non-empty string, got {environment!r}"
            )
        return self._hash_for(environment)

    # -- document properties ---------------------------------------------------------------

    @property
    def source(self) -> str:
        """Where the policy came from: the file path or ``<string>``."""
        return self._source

    @property
    def schema(self) -> str:
        """The declared schema string."""
        return self._doc.schema

    @property
    def mode(self) -> str:
        """``"enforce"`` or ``"observe"``."""
        return self._doc.mode

    @property
    def environment(self) -> str | None:
        """The document's ``environment:``, or ``None`` when it declares none."""
        return self._doc.environment

    @property
    def version(self) -> str | None:
        """The document's ``version:`` label, or ``None``."""
        return self._doc.version

    @property
    def actions(self) -> tuple[str, ...]:
        """The declared action names, in document order."""
        return tuple(self._compiled)

    @property
    def controls_registry(self) -> Mapping[str, Mapping[str, Any]] | None:
        """The control registry (id → title/source/approver_role), or ``None`` when absent."""
        return self._registry_view

    @property
    def authority(self) -> Mapping[str, Any] | None:
        """The ``authority:`` section as loaded (read-only), or ``None``."""
        return self._authority

    # -- per-action settings ---------------------------------------------------------------

    def _settings(self, name: str) -> Any:
        plan = self._doc.entries.get(name) if isinstance(name, str) else None
        return plan.settings if plan is not None else None

    def effect_template(self, name: str) -> str | None:
        """The action's ``effect:`` template, or ``None``."""
        settings = self._settings(name)
        return settings.effect if settings else None

    def resource_template(self, name: str) -> str | None:
        """The action's ``resource:`` template, or ``None``."""
        settings = self._settings(name)
        return settings.resource if settings else None

    def mcp_options(self, name: str) -> dict[str, bool]:
        """The action's MCP options (``not_executed_on_error`` defaults to ``False``)."""
        settings = self._settings(name)
        return {"not_executed_on_error": bool(settings and settings.not_executed_on_error)}

    def max_attempts(self, name: str) -> int | None:
        """The attempt ceiling per effect key, or ``None`` for no ceiling."""
        settings = self._settings(name)
        return settings.max_attempts if settings else None

    def approvals_required(self, name: str) -> int:
        """How many distinct principals must approve (1 unless declared)."""
        settings = self._settings(name)
        return settings.approvals_required if settings else 1

    def upstream_pin(self, name: str) -> Mapping[str, Any] | None:
        """The action's upstream pin (digests, resolved certificate paths, tool schema), or ``None``."""
        settings = self._settings(name)
        if not settings or settings.upstream is None:
            return None
        return MappingProxyType(settings.upstream.model_dump())

    def data_labels(self, name: str) -> Mapping[str, str]:
        """The action's argument → label map (empty when none)."""
        settings = self._settings(name)
        return MappingProxyType(dict(settings.data) if settings else {})

    def action_controls(self, name: str) -> tuple[str, ...]:
        """The control ids the action entry itself cites, in registry order."""
        entry = self._compiled.get(name) if isinstance(name, str) else None
        return entry.no_match.controls if entry else ()

    def control(self, control_id: str) -> ControlDef | None:
        """The registry entry of ``control_id``, or ``None``."""
        return self._doc.registry.get(control_id)

    def reachable_decisions(self, name: str) -> frozenset[Decision]:
        """Every decision ``evaluate`` can return for ``name`` (``deny`` alone when unknown)."""
        entry = self._compiled.get(name) if isinstance(name, str) else None
        if entry is None:
            return frozenset({Decision.DENY})
        if entry.fixed is not None:
            return frozenset({entry.fixed.decision})
        reachable = {evaluation.decision for _, evaluation in entry.rules}
        if all(conditions for conditions, _ in entry.rules):
            reachable.add(Decision.DENY)
        return frozenset(reachable)

    def unenforced_features(self) -> list[str]:
        """Features the document uses that this version's runtime does not enforce yet."""
        features: list[str] = []

        def per_action(key: str, pick: Any) -> None:
            hits = []
            for name, plan in self._doc.entries.items():
                value = pick(plan.settings)
                if value is not None:
                    hits.append(f"{name}: {value}" if value != "" else name)
            if hits:
                features.append(f"{key}: ({', '.join(hits)})")

        per_action(
            "approvals_required",
            lambda s: s.approvals_required if s.approvals_required > 1 else None,
        )
        per_action("upstream", lambda s: "" if s.upstream is not None else None)
        return features

    def __repr__(self) -> str:
        return (
            f"Policy(source={self._source!r}, schema={self.schema!r}, mode={self.mode!r}, "
            f"actions={len(self._compiled)}, policy_hash={self._policy_hash!r})"
        )
