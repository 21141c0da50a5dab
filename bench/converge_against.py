"""A converged deploy of the demo rig, this checkout against an earlier commit, in one run (ABBA).

For a change that should not change behaviour or speed (a move, such as the rig-side runtime's,
issue #28): both trees deploy the same rig (the demo rig, inventory/sim.py: GPU policy, weights on
volumes, two served models) in alternating blocks, A B B A ... Each block first converges the rig to
its own tree (the other tree's files differ, so that deploy changes things and is not timed), then
times `--runs` converged deploys, each of which must report 0 changed operations. Both run as users
run them, `rigkit deploy INVENTORY`, in the tree's own folder with the tree's own rigkit on the
import path (so each side is wholly its own code). Prints each side's median and their ratio, and
a fixed pure-Python loop timed between blocks (this shared machine's speed drifts).

    .venv/bin/python bench/converge_against.py REF [--new REF2] [--rounds 4] [--runs 3]

REF: a commit, e.g. the commit before a move (`git log`); it is exported with `git archive` into a
temporary folder, nothing in this checkout changes. `--new REF2`: compare REF2 (e.g. the move's
merge commit) instead of this checkout, so that only the move's own changes are timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.converge import reference_loop_s  # noqa: E402
from tests.conftest import _changed  # noqa: E402  (the results table's changed operations)
from tests.simrig.rig import STATE_ROOT  # noqa: E402


def export(ref: str, folder: Path) -> str:
    """The tree of `ref` in `folder`; returns the commit's short name and subject."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return subprocess.run(["git", "log", "-1", "--format=%h %s", ref], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()[:90]


def deploy(tree: Path, *extra: str) -> tuple[float, int]:
    """`rigkit deploy inventory/sim.py` from `tree` with that tree's rigkit; (seconds, changed operations)."""
    env = dict(os.environ, PYTHONPATH=str(tree), RIGKIT_STATE=str(STATE_ROOT))
    command = [sys.executable, "-c", "import sys; from rigkit.cli import main; sys.exit(main())",
               "deploy", "inventory/sim.py", *extra]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    elapsed = time.perf_counter() - started
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"deploy from {tree} failed (exit {proc.returncode}):\n{output[-3000:]}")
    return elapsed, _changed(output)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ref", help="the earlier commit to compare with")
    parser.add_argument("--new", help="the later commit (default: this checkout as it is)")
    parser.add_argument("--rounds", type=int, default=4, help="A B B A blocks, this many sides in all (even)")
    parser.add_argument("--runs", type=int, default=3, help="timed converged deploys per block")
    args = parser.parse_args()

    print("starting the demo rig", flush=True)
    subprocess.run([sys.executable, "-m", "tests.simrig", "up"], cwd=REPO, check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        earlier, later = Path(tmp) / "earlier", Path(tmp) / "later"
        earlier.mkdir()
        described = export(args.ref, earlier)
        sides = {"this checkout": REPO}
        if args.new:
            later.mkdir()
            sides = {f"later ({export(args.new, later)})": later}
        sides[f"earlier ({described})"] = earlier
        times: dict[str, list[float]] = {name: [] for name in sides}
        loops_s = [reference_loop_s()]
        names = list(sides)
        for block in range(args.rounds):
            # A B B A: blocks 0 and 3 run this checkout first, 1 and 2 the earlier commit first.
            order = names if block % 4 in (0, 3) else names[::-1]
            for name in order:
                tree = sides[name]
                # Converge to this tree's files, not timed; with verification, as users deploy: a
                # changed stack is held for the rollout gate until a verifying deploy promotes it.
                deploy(tree)
                for _ in range(args.runs):
                    elapsed, changed = deploy(tree)
                    if changed:
                        raise RuntimeError(f"{name}: a converged deploy changed {changed} operations; not comparable")
                    times[name].append(elapsed)
                loops_s.append(reference_loop_s())
            print(f"block {block + 1}/{args.rounds}: " + ", ".join(
                f"{n} median {statistics.median(v):.2f} s" for n, v in times.items()), flush=True)
    # Leave the demo rig converged to this checkout, as `./run demo` leaves it.
    deploy(REPO)
    med = {name: statistics.median(v) for name, v in times.items()}
    this, before = med[names[0]], med[names[1]]
    print(f"\nmedians of {len(times[names[0]])} converged deploys each (0 changed operations each):")
    for name in names:
        print(f"  {name}: {med[name]:.2f} s (min {min(times[name]):.2f}, max {max(times[name]):.2f})")
    print(f"  {names[0].split(' (')[0]} / earlier: {this / before:.3f}")
    print(f"  reference loop: {min(loops_s):.2f}-{max(loops_s):.2f} s over the blocks (the machine's speed while measuring)")


if __name__ == "__main__":
    main()
