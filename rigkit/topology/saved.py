"""`rigkit check --topology FACT_OUTPUT`: each multi-GPU model's links, P2P and vLLM flags from a saved
output of the topology fact, printed for the person; offline (docs/topology.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from rigkit.config.errors import one_line, shown
from rigkit.config.schema import RigConfig
from rigkit.config.yamlfile import read_small_file
from rigkit.topology.report import read_report
from rigkit.topology.rig import render_verdict, rig_verdicts

TOPOLOGY_FILE_BYTES = 1024 * 1024  # the topology fact's output for 8 GPUs is a few KiB


def print_saved_verdicts(rig: RigConfig, facts_file: str) -> bool:
    """Print the topology table and verdict of each multi-GPU model of `rig` from a saved topology
    fact output; True when a verdict has errors (or the file cannot be read)."""
    try:  # the rig files' reader: a regular file, bounded; a FIFO or a device is never read
        text = read_small_file(Path(facts_file), TOPOLOGY_FILE_BYTES).decode("utf-8")
    except OSError as exc:
        print(f"rigkit check: --topology {shown(facts_file)}: cannot read the file: {exc.strerror or exc}",
              file=sys.stderr)
        return True
    except UnicodeDecodeError as exc:
        print(f"rigkit check: --topology {shown(facts_file)}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
              f"offset {exc.start}); give the topology fact's output as it was saved", file=sys.stderr)
        return True
    topo, notes = read_report(text.splitlines(), windows=rig.spec.os == "windows")
    if topo is None:  # one line: why the matrix could not be read
        print(f"{rig.file}: topology: no nvidia-smi topo -m read from {shown(facts_file)}: "
              f"{'; '.join(one_line(n) for n in notes) or 'not in the file'}", file=sys.stderr)
        return True
    for note in notes:
        print(f"{rig.file}: topology: not read: {one_line(note)}", file=sys.stderr)
    verdicts = rig_verdicts(rig, topo)
    for verdict in verdicts:
        print(render_verdict(verdict))
    if not verdicts:
        print(f"{rig.file}: topology: no model spans GPUs (tensor x pipeline 1); nothing to decide")
    return any(v.errors for v in verdicts)
