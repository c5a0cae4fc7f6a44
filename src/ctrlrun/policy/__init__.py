"""The policy engine: strict YAML loading, evaluation, templates and the policy hash.

Names load from their submodule on first use, so a decision or a template never pulls in the
YAML loader or pydantic; those load with ``Policy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .conditions import OPERATORS, RESERVED_SUBJECTS, strict_equal
    from .context import SCHEMAS
    from .decision import Decision, Evaluation
    from .engine import DEFAULT_ENVIRONMENT, Policy
    from .model import ControlDef, UpstreamPin
    from .templates import (
        Placeholder,
        TemplateSyntaxError,
        parse_template,
        render_effect_key,
        render_resource,
        template_placeholders,
    )
    from .validate import CHANGE_ACTION

# Public name -> the submodule that defines it; read by ``__getattr__`` on first use.
_LAZY: dict[str, str] = {
    "OPERATORS": "conditions",
    "RESERVED_SUBJECTS": "conditions",
    "strict_equal": "conditions",
    "SCHEMAS": "context",
    "Decision": "decision",
    "Evaluation": "decision",
    "DEFAULT_ENVIRONMENT": "engine",
    "Policy": "engine",
    "ControlDef": "model",
    "UpstreamPin": "model",
    "Placeholder": "templates",
    "TemplateSyntaxError": "templates",
    "parse_template": "templates",
    "render_effect_key": "templates",
    "render_resource": "templates",
    "template_placeholders": "templates",
    "CHANGE_ACTION": "validate",
}


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

if not TYPE_CHECKING:  # type checkers see the imports above, never a catch-all __getattr__
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
