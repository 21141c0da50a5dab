"""Render files from templates/ with values from validated config objects only."""

from __future__ import annotations

from pathlib import Path

import json

import jinja2

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty string
    keep_trailing_newline=True,
    autoescape=lambda name: bool(name) and name.endswith(".xml.j2"),  # XML templates escape every value
)


def _compose_json(value) -> str:
    """JSON (valid YAML) with `$` doubled, so Compose interpolates nothing from the catalog."""
    return json.dumps(value).replace("$", "$$")


def ps_quote(value) -> str:
    """A PowerShell single-quoted literal: nothing inside is expanded. PowerShell also takes the
    typographic quotes U+2018-U+201B as single quotes, so those are doubled too."""
    text = str(value)
    for quote in ("'", "\u2018", "\u2019", "\u201a", "\u201b"):
        text = text.replace(quote, quote * 2)
    return f"'{text}'"


_env.filters["compose_json"] = _compose_json
_env.filters["ps"] = ps_quote


def render(template: str, **values) -> str:
    return _env.get_template(template).render(**values)


def template_text(name: str) -> str:
    """A file under templates/ that is shipped as it is (a script, not a template)."""
    return (TEMPLATES / name).read_text()
