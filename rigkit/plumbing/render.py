"""Render files from templates/ with values from validated config objects only, and find
the scripts rigkit ships to rigs as they are.

`template_path` is the one way to a file under templates/: a checkout (or an editable
install) reads the repository's templates/ folder; an installed wheel carries the same
folder as `rigkit/_templates` (pyproject.toml maps it), so both behave the same.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import jinja2

_CHECKOUT_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
_INSTALLED_TEMPLATES = Path(__file__).resolve().parents[1] / "_templates"
TEMPLATES = _INSTALLED_TEMPLATES if _INSTALLED_TEMPLATES.is_dir() else _CHECKOUT_TEMPLATES

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty string
    keep_trailing_newline=True,
    autoescape=lambda name: bool(name) and name.endswith(".xml.j2"),  # XML templates escape every value
)


# A JSON surrogate pair (\ud83d\ude00) not preceded by an escaped backslash.
_SURROGATE_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def _yaml_escape(match: re.Match) -> str:
    high, low = int(match.group(2), 16), int(match.group(3), 16)
    return f"{match.group(1)}\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"


def _compose_json(value) -> str:
    """JSON (valid YAML) with `$` doubled, so Compose interpolates nothing from the catalog.
    Everything outside ASCII is escaped (raw U+2028 or U+0085 would be folded as line breaks
    by YAML); a JSON surrogate pair, which YAML refuses, becomes YAML's \\U escape."""
    return _SURROGATE_PAIR.sub(_yaml_escape, json.dumps(value)).replace("$", "$$")


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


def template_path(name: str) -> Path:
    """A file under templates/ (`serving/rigkit-stack`); an error names it if it is missing."""
    path = TEMPLATES / name
    if not path.is_file():
        raise FileNotFoundError(f"rigkit's template {name} is missing from {TEMPLATES}: a broken install?")
    return path


def template_text(name: str) -> str:
    """A file under templates/ that is shipped as it is (a script, not a template)."""
    return template_path(name).read_text()


def module_source(name: str) -> bytes:
    """An installed Python module's file, shipped to rigs as it is (pynvml, rigkit's telemetry
    sampler), found without running the module: importing pynvml costs every deploy ~20 ms."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"the Python module {name} is not installed as a .py file here: a broken install?")
    return Path(spec.origin).read_bytes()
