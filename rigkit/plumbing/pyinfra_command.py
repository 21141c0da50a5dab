"""pyinfra's command line as rigkit's commands start it: in a process of its own (`PYINFRA`, for the
per-rig runs of `rigkit rollout` and the one run of `rigkit status`) or in this one (`run_here`, for
`rigkit deploy` and `verify`), both with rigkit's shorter start (rigkit/plumbing/pyinfra_start.py).
Light on purpose: the command line imports it before pyinfra is needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rigkit
from rigkit.config.errors import CONFIG_ERROR

PYINFRA = [sys.executable, "-m", "rigkit.plumbing.pyinfra_start"]


def run_here(argv: list[str], command: str) -> int:
    """pyinfra's command line, in this process when it can be (a second Python start is ~0.1 s
    of a ~1.5 s converged deploy); it ends this command, so it is the last thing `rigkit` does.
    `argv` ends with the entry point (deploy.py, verify.py), which must be in the current folder."""
    from rigkit.plumbing.pyinfra_start import main as pyinfra_main

    if not Path(argv[-1]).is_file():
        print(f"rigkit {command}: no {argv[-1]} in {Path.cwd()}: run `rigkit {command}` from the rigkit checkout "
              f"(its {argv[-1]} and roles/ are not in the installed package)", file=sys.stderr)
        return CONFIG_ERROR
    here = Path("rigkit")
    if here.is_dir() and here.resolve() != Path(rigkit.__file__).resolve().parent:
        # This folder has its own rigkit (another checkout): deploy.py and roles/ come from here,
        # so rigkit must too. `python -m` puts this folder first on the import path.
        return subprocess.run([*PYINFRA, *argv]).returncode
    try:
        pyinfra_main(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0
