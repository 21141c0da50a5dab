"""Role rigside (Linux): ship rigkit's rig-side runtime, the package rigkit/rigside (standard
library only), to names.RUNTIME_DIR (/usr/local/lib/rigkit/rigside/). The rig's own scripts
(rigkit-stack, the watchdog, the gateway helper, the status probe) import it from there: it holds
the protocols they share once (the key file, the one-token probe, the rollout lock, atomic
replace, the rig's paths). Runs after base and before every role that installs such a script;
one operation puts only the modules that differ, so a second deploy changes nothing (and pays
pyinfra's per-operation cost once for the package).

Defaults: none; where it goes is rigkit.rigside.names.RUNTIME_DIR.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.api import deploy

import rigkit.rigside
from rigkit.config.schema import RigConfig
from rigkit.plumbing.facts_once import Read
from rigkit.plumbing.files import FileStates, put_all
from rigkit.plumbing.render import module_source
from rigkit.rigside.names import RUNTIME_DIR


def runtime_files() -> dict[str, bytes]:
    """{path on the rig: the module's source} for every module of the runtime package."""
    modules = sorted(p.stem for p in Path(rigkit.rigside.__file__).parent.glob("*.py"))
    return {f"{RUNTIME_DIR}/{name}.py": module_source("rigkit.rigside" if name == "__init__" else f"rigkit.rigside.{name}")
            for name in modules}


def rigside_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    return [(FileStates, {"paths": tuple(runtime_files())})] if rig.spec.os == "linux" else []


@deploy("Rig-side runtime")
def rigside(rig: RigConfig) -> list:
    """Returns the operations that changed the runtime."""
    files = runtime_files()
    return [put_all(name=f"Rig-side runtime: {len(files)} modules in {RUNTIME_DIR}", files=files, mode="644")]
