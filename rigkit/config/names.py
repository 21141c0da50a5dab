"""The one rule for names rigkit turns into things: rig and catalog names (file stems),
served model names. A catalog name becomes a Compose project (`rigkit-<name>`), a folder
on the rig, a Docker volume, a shell argument and a path in the Windows bundle; a rig
name becomes a results folder. Docker Compose allows project names of lowercase letters,
digits, '-' and '_' only, starting with a letter or digit; such a name is also a safe
file name on Linux and Windows and a single shell word, so one rule serves everywhere.
"""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
NAME_RULE = (
    "names may use lowercase letters, digits, '-' and '_', start with a letter or digit and "
    "have at most 63 characters (Docker Compose's rule for project names; such a name is also a "
    "safe file name and shell word)"
)


def name_problem(value: object) -> str | None:
    """Why `value` breaks the name rule, or None when it follows it."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        hint = ""
        if isinstance(value, str) and NAME_PATTERN.fullmatch(value.lower().replace(".", "-")):
            hint = f"; for example {value.lower().replace('.', '-')!r}"
        return f"{NAME_RULE}{hint}"
    return None


# Inventory host names are addresses as often as names (pyinfra connects to the name unless ssh_hostname
# says otherwise; rigkit's Windows connector is picked by an `@winssh/` prefix): the rule keeps them one
# safe word (no path separator, no "..", no space, control or non-ASCII character) without refusing an
# address. They reach messages, the gateway's env file and LiteLLM's config, never a path.
HOST_NAME_PATTERN = re.compile(r"(@[a-z][a-z0-9_]{0,31}/)?[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
HOST_NAME_RULE = (
    "inventory host names are a name or an address: ASCII letters, digits, '.', '-', '_' and ':', starting "
    "with a letter or digit, at most 253 characters, no '..', after a connector's prefix if any (@winssh/)"
)


def host_name_problem(value: object) -> str | None:
    """Why an inventory host name breaks HOST_NAME_RULE, or None when it follows it."""
    if not isinstance(value, str) or not HOST_NAME_PATTERN.fullmatch(value) or ".." in value:
        return HOST_NAME_RULE
    return None
