"""`rigkit check RIG_FILE`: everything that can be known of a rig file without reaching the rig: the
files, the PSU budget at the reference boards' defaults, the API key file, the preflight's offline
part (each GPU model's architecture in each image; the driver minimum against base.driver_version)
and, given a saved topology fact output, each multi-GPU model's verdict. Prints for the person:
warnings and problems on stderr, one `ok` line on stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.config.schema import RigConfig
from rigkit.fit.check import rig_fits, shared_gpu_problems, variant_findings
from rigkit.gpu.policy import reference_budget_problems
from rigkit.preflight.checks import offline_findings
from rigkit.serving.api_key import SecretFileError, read_api_key
from rigkit.weights.hub import read_hub_token
from rigkit.topology.saved import print_saved_verdicts


def check_rig_file(rig_file: str, catalog: Path, topology_file: str | None,
                   windows_rules: Callable[[RigConfig], None]) -> bool:
    """True when `rig_file` and its catalog entries pass. `windows_rules(rig)` checks a Windows rig's task
    time limits (it raises ConfigError); the command line passes it in, since only the front door and
    Windows files import rigkit.windows (tests/test_layout.py)."""
    try:
        rig = load_rig(rig_file, catalog)
        windows_rules(rig)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return False
    problems, notes = reference_budget_problems(rig.spec)
    preflight_problems, preflight_notes = offline_findings(rig)
    problems, notes = problems + preflight_problems, notes + preflight_notes
    # The weights against the GPU table, where the catalog gives weight_bytes (the KV cache needs config.json:
    # the deploy's preflight reckons it on the rig).
    problems += shared_gpu_problems(rig) + variant_findings(rig, {}, {})
    for found in rig_fits(rig, {}, {}):
        problems, notes = problems + found.problems, notes + found.warnings
    for read in (read_api_key, read_hub_token):
        try:
            read(rig)
        except SecretFileError as exc:
            problems.append(str(exc))
    for note in [*notes, *rig.warnings]:
        print(f"{rig_file}: warning: {note}", file=sys.stderr)
    for note in rig.notes:
        print(f"{rig_file}: {note}")
    if problems:
        print("\n".join(f"{rig_file}: {p}" for p in problems), file=sys.stderr)
        return False
    if topology_file and print_saved_verdicts(rig, topology_file):
        return False
    models = ", ".join(m.name for m in rig.models) or "no models"
    print(f"{rig_file}: ok ({rig.spec.os}, {len(rig.spec.gpus)} GPUs, {models}; catalog {catalog})")
    return True
