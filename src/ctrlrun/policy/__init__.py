"""The policy engine: strict YAML loading, evaluation, templates and the policy hash."""

from __future__ import annotations

from .conditions import OPERATORS, RESERVED_SUBJECTS, strict_equal
from .context import SCHEMAS
from .engine import DEFAULT_ENVIRONMENT, Policy
from .model import ControlDef, Decision, Evaluation, UpstreamPin
from .templates import (
    Placeholder,
    TemplateSyntaxError,
    parse_template,
    render_effect_key,
    render_resource,
    template_placeholders,
)
from .validate import CHANGE_ACTION

__all__ = [
    "CHANGE_ACTION",
    "DEFAULT_ENVIRONMENT",
    "OPERATORS",
    "RESERVED_SUBJECTS",
    "SCHEMAS",
    "ControlDef",
    "Decision",
    "Evaluation",
    "Placeholder",
    "Policy",
    "TemplateSyntaxError",
    "UpstreamPin",
    "parse_template",
    "render_effect_key",
    "render_resource",
    "strict_equal",
    "template_placeholders",
]
