"""Typed results of a policy load: decisions, evaluations and per-action settings."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .decision import Decision, Evaluation

__all__ = [
    "ActionSettings",
    "ControlDef",
    "Decision",
    "Evaluation",
    "UpstreamPin",
]


_STRICT = ConfigDict(frozen=True, strict=True, extra="forbid")


class ControlDef(BaseModel):
    """One entry of the control registry."""

    model_config = _STRICT

    title: str = Field(min_length=1)
    source: str | None = None
    approver_role: str | None = None


class UpstreamPin(BaseModel):
    """What an action's upstream must present: certificate digests, files, a tool schema digest."""

    model_config = _STRICT

    tls_cert_sha256: tuple[str, ...] = ()
    tls_cert_file: tuple[str, ...] = ()
    tool_schema_sha256: str | None = None


class ActionSettings(BaseModel):
    """The runtime settings of one action entry (everything ``evaluate`` does not read)."""

    model_config = _STRICT

    effect: str | None = None
    resource: str | None = None
    not_executed_on_error: bool = False
    max_attempts: int | None = Field(default=None, ge=1)
    approvals_required: int = Field(default=1, ge=1)
    upstream: UpstreamPin | None = None
    data: dict[str, str] = Field(default_factory=dict)
    controls: tuple[str, ...] = ()
