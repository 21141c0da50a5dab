"""What the `rigkit` command does for Windows rigs (the command line is the one module outside this
package that imports it): `rigkit windows-bundle RIG_FILE --out DIR`, the offline install folder, and
the task time limits `rigkit check` holds a Windows rig to."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rigkit.config.errors import CONFIG_ERROR, ConfigError
from rigkit.config.loader import default_catalog_dir, load_rig
from rigkit.config.schema import RigConfig
from rigkit.windows.bundle import is_bundle, write_bundle
from rigkit.windows.timing import timing_findings


def check_task_time_limits(rig: RigConfig) -> None:
    """A Windows rig's bootstrap must fit its task's time limit: raise ConfigError, or print warnings."""
    errors, warnings = timing_findings(rig)
    if errors:
        raise ConfigError(errors)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def windows_bundle(rig_file: str, out: str, catalog: str | None) -> int:
    """Write the install folder of the Windows rig `rig_file` to `out` and say what to do with it; the
    command's exit code (2 on bad input or a folder it cannot write)."""
    try:
        rig = load_rig(rig_file, catalog or default_catalog_dir(Path(rig_file)))
        if rig.spec.os != "windows":
            print(f"{rig_file}: os is {rig.spec.os}; the bundle is for Windows rigs", file=sys.stderr)
            return CONFIG_ERROR
        check_task_time_limits(rig)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return CONFIG_ERROR
    folder = Path(out)
    if problem := bundle_folder_problem(out):
        print(f"rigkit windows-bundle: --out {out!r}: {problem}", file=sys.stderr)
        return CONFIG_ERROR
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError("it is a file, not a folder")
        written = write_bundle(rig, folder)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(folder) else ""
        print(f"rigkit windows-bundle: cannot write the bundle to {folder}: {reason}{where}; "
              "give --out a folder you can write to", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    if rig.spec.gpu_policy == "remove":
        print(f"gpu_policy is remove: copy {out} to the rig and run uninstall.ps1 from an elevated PowerShell")
    else:
        print(f"copy {out} to the rig and run install.ps1 from an elevated PowerShell")
    return 0


def bundle_folder_problem(out: str) -> str | None:
    """Why `--out` cannot take a bundle, or None: it must be named, and be new, empty, or an earlier
    bundle (install.ps1 and scripts/ in it; write_bundle then replaces its stacks)."""
    if not out.strip() or re.search(r"[\x00-\x1f\x7f]", out):
        return "give the folder to write the bundle to (not empty, no control characters), e.g. --out bundle-win"
    folder = Path(out)
    if folder.is_dir() and any(folder.iterdir()) and not is_bundle(folder):
        return ("a folder with other files in it, not an earlier bundle (no install.ps1 and scripts/); give a new or "
                "empty folder")
    return None
