"""The rollout gate through real rollouts, with the stand-in's noise on: false rollbacks and misses (#29).

bench/gate_cost.py simulates the gate's decision on drawn figures; this drives the real thing. It starts
its own simulated rig (tests/simrig: systemd, sshd on 127.0.0.1), serves test-alpha alone (the vLLM
stand-in, tests/vllm_standin, decoding at --decode-tok-s with STANDIN_NOISE_SHARE 0.006, the relative
sd of each request's rates: the stand-in's default noise, drawn from a fresh seed at every start), and
runs real deploys (pyinfra over SSH, rigkit-stack holding each new config, the gate's 3 runs through the
SSH forward, promote or roll back and verify the rollback):

1. a first rollout establishes the proven result;
2. HEALTHY rollouts of configs that change nothing the server's speed depends on (an env marker): each
   refusal is a false rollback;
3. SLOWER rollouts to a config 10% slower (the stand-in's `slower_by`, prefill and decode): each
   promotion is a miss (then a healthy config is rolled out again, so the next is judged against it);
4. SLOWER rollouts to a config 2% slower: each refusal is a false rollback (each followed by a healthy
   config again, 2% faster, not counted).

Prints each rollout's verdict and seconds, then the counts. Under the Docker lock, for its whole run:

    flock /tmp/rigkit-docker.lock .venv/bin/python bench/gate_rollouts.py [--healthy 10] [--slower 5]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import SERVING_RIG, copy_catalog, remove_test_stacks, run_deploy  # noqa: E402
from tests.simrig.rig import SimRig  # noqa: E402
from tests.simrig.weights import ensure_checkpoint  # noqa: E402
from tests.vllm_standin.image import ensure_standin_image  # noqa: E402

PORT = 2232
NOISE_SHARE = "0.006"  # the stand-in's default (STANDIN_NOISE_SHARE with a simulated GPU)


class Bench:
    def __init__(self, rig: SimRig, folder: Path, decode_tok_s: int):
        self.rig, self.folder, self.decode_tok_s, self.count = rig, folder, decode_tok_s, 0
        self.rig_file = folder / "alpha.yml"
        self.rig_file.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", "models: [test-alpha]"))

    def rollout(self, slower_by: float = 0.0) -> tuple[str, float, str]:
        """One rollout to a new config (a fresh marker; `slower_by` the stand-in's fault): the verdict
        (promoted / refused / failed), its seconds, and the gate's reason line(s)."""
        self.count += 1
        env = (f'env:\n  RIGKIT_BENCH_ROLLOUT: "{self.count}"\n  STANDIN_NOISE_SHARE: "{NOISE_SHARE}"\n'
               + (f'  STANDIN_FAULT: slower_by\n  STANDIN_SLOWER_BY: "{slower_by}"\n' if slower_by else ""))
        catalog = copy_catalog(self.folder / f"c{self.count}", test_alpha=[
            ('STANDIN_DECODE_TOK_S: "100"', f'STANDIN_DECODE_TOK_S: "{self.decode_tok_s}"'), ("env:\n", env)])
        started = time.monotonic()
        run = run_deploy(self.rig, self.rig_file, "--data", f"results_dir={self.folder / 'results'}", catalog=catalog)
        took = time.monotonic() - started
        if run.returncode == 0 and re.search(r"PROMOTE", run.output):
            verdict = "promoted"
        elif "rollout gate REFUSED" in run.output and "its verification passed" in run.output:
            verdict = "refused"
        else:
            (self.folder / f"failed-{self.count}.log").write_text(run.output)
            verdict = "failed"
        lines = [ln.strip() for ln in run.output.splitlines()
                 if re.search(r"(ok  |FAIL|REFUSE|PROMOTE).*(decode|ttft|TTFT|candidate|proven)", ln)]
        return verdict, took, " | ".join(dict.fromkeys(lines))[:400]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--healthy", type=int, default=10)
    parser.add_argument("--slower", type=int, default=5, help="rollouts each of the 10%% and the 2%% slower config")
    parser.add_argument("--decode-tok-s", type=int, default=1000, help="the stand-in's decode rate (runs take seconds)")
    args = parser.parse_args()
    ensure_standin_image()
    ensure_checkpoint("test-alpha")
    remove_test_stacks()
    rig = SimRig(name="rigkit-bench-gate", ssh_port=PORT).start(log=lambda m: None)
    counts = {"healthy": [], "10%": [], "2%": []}
    try:
        with tempfile.TemporaryDirectory() as folder:
            bench = Bench(rig, Path(folder), args.decode_tok_s)

            def show(kind, result):
                verdict, took, reason = result
                print(f"{kind:>12} #{bench.count:<3} {verdict:9} {took:5.1f} s  {reason}", flush=True)
                return result

            first = show("establish", bench.rollout())
            if first[0] != "promoted":
                sys.exit(f"the first rollout did not establish the proven result: {first}")
            for _ in range(args.healthy):
                counts["healthy"].append(show("healthy", bench.rollout()))
            for share, kind in ((0.10, "10%"), (0.02, "2%")):
                for _ in range(args.slower):
                    result = show(f"{kind} slower", bench.rollout(share))
                    counts[kind].append(result)
                    if result[0] == "promoted":
                        show("back", bench.rollout())  # the next is judged against a healthy proven config
    finally:
        rig.remove()
        remove_test_stacks()

    def n(kind, verdict):
        return sum(r[0] == verdict for r in counts[kind])
    seconds = {v: [r[1] for k in counts for r in counts[k] if r[0] == v] for v in ("promoted", "refused")}
    print()
    print(f"healthy rollouts: {len(counts['healthy'])}, false rollbacks {n('healthy', 'refused')}, "
          f"failed otherwise {n('healthy', 'failed')}")
    print(f"10% slower: {len(counts['10%'])}, caught {n('10%', 'refused')}, missed {n('10%', 'promoted')}, "
          f"failed otherwise {n('10%', 'failed')}")
    print(f"2% slower: {len(counts['2%'])}, passed {n('2%', 'promoted')}, false rollbacks {n('2%', 'refused')}, "
          f"failed otherwise {n('2%', 'failed')}")
    for verdict, values in seconds.items():
        if values:
            print(f"a {verdict} rollout (whole deploy): mean {sum(values) / len(values):.1f} s over {len(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
