"""The rollout gate on the real engine: how far one config's decode moves from one start to the next,
against the noise the gate sees inside one start (its runs' CV).

Starts its own simulated rig (tests/simrig), serves engine-alpha on vLLM's CPU build (tests/vllm_engine)
and runs real deploys of configs that change nothing the engine's speed depends on (an env marker), each a
fresh start of the engine measured by the gate's 3 runs. Prints, per rollout: the verdict, the candidate's
mean decode and its runs' CV, and its ratio to the proven mean it was judged against; then the spread of
the starts' means (between starts) next to the mean of the runs' CVs (inside a start). Under the Docker
lock, for its whole run, alone (it measures):

    flock /tmp/rigkit-docker.lock .venv/bin/python bench/gate_engine_starts.py [--rollouts 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import DATA, copy_catalog, remove_test_stacks, run_deploy  # noqa: E402
from tests.simrig.rig import SimRig  # noqa: E402
from tests.vllm_engine.models import ensure_engine_model  # noqa: E402

PORT = 2234
ENGINE_RIG = DATA / "rigs" / "engine.yml"
MARKER = '  VLLM_CPU_KVCACHE_SPACE: "1"\n'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=6, help="equal rollouts after the first")
    args = parser.parse_args()
    ensure_engine_model(log=lambda m: None)
    remove_test_stacks({"engine-alpha": 18141})
    rig = SimRig(name="rigkit-bench-engine", ssh_port=PORT).start(log=lambda m: None)
    starts: list[tuple[float, float]] = []  # (mean decode, runs' CV) per start
    refused = 0
    try:
        with tempfile.TemporaryDirectory() as folder:
            results = Path(folder) / "results"
            for n in range(args.rollouts + 1):
                catalog = copy_catalog(Path(folder) / f"c{n}", engine_alpha=[
                    (MARKER, MARKER + f'  RIGKIT_BENCH_ROLLOUT: "{n}"\n')])
                run = run_deploy(rig, ENGINE_RIG, "--data", f"results_dir={results}", catalog=catalog)
                gates = sorted((results / "engine" / "engine-alpha").glob("gate-*.json"))
                if not gates:
                    print(run.output[-3000:])
                    return 1
                gate = json.loads(gates[-1].read_text())
                decode = gate["runs"]["decode_tok_s"]
                proven = (gate.get("baseline") or {}).get("decode_tok_s")
                ratio = f"{decode['mean'] / proven:.3f} of the proven {proven:.0f}" if proven else "establishes"
                verdict = "promoted" if gate["promoted"] else "REFUSED"
                refused += not gate["promoted"]
                print(f"#{n}: {verdict:8} decode {decode['mean']:.0f} tok/s (runs {', '.join(f'{r:.0f}' for r in decode['runs'])};"
                      f" CV {decode['cv']:.1%}), {ratio}", flush=True)
                starts.append((decode["mean"], decode["cv"]))
    finally:
        rig.remove()
        remove_test_stacks({"engine-alpha": 18141})
    means = [m for m, _ in starts]
    print(f"\n{len(starts)} starts of one config: between starts CV {statistics.stdev(means) / statistics.fmean(means):.1%} "
          f"(min/max {min(means) / max(means):.3f}); inside a start mean runs' CV "
          f"{statistics.fmean(c for _, c in starts):.1%}; refused {refused} of {len(starts) - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
