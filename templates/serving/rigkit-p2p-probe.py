"""rigkit-p2p-probe: the active P2P check of a model spanning GPUs, run INSIDE a short-lived container
of the model's own image (its torch, its NCCL, its GPUs), before vLLM is first started on them.

Shipped by rigkit to /usr/local/lib/rigkit/rigkit-p2p-probe.py; `rigkit-stack probe` pipes it into
`docker compose run` of the model's service (same image, GPU reservation and environment, so
NCCL_P2P_DISABLE is what vLLM will get). Needs only the image's python3 and torch; not the rig-side
runtime (it runs in the container, where that is not installed).

    python3 rigkit-p2p-probe.py --gpus 0,1 [--bytes N] [--floats N] [--step-timeout-s S]

Two checks, each step printed before it starts (`STEP name`), so a caller that has to kill a hung
container still knows which pair hung:
1. copy: for each pair of GPUs, a byte pattern is copied each way (device to device: over P2P where
   the driver allows it, else through host memory) and read back; wrong bytes fail the check;
2. all-reduce: one process per GPU, torch.distributed with NCCL (what vLLM's tensor parallelism
   uses), a sum over every GPU of the model; every element must be the expected sum.
Every step is bounded: a watchdog thread ends the process (exit 3) when a step runs past
--step-timeout-s, naming the step; the caller bounds the whole container too. Exit codes: 0 passed,
1 wrong bytes or an error (named), 2 bad arguments, 3 a step timed out (named).
The last line is `RESULT {json}`: {"ok": bool, "pairs": [...], "failed": step or null, "why": text}.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

# CUDA numbers devices fastest first unless told otherwise; nvidia-smi's indices (the model's `gpus`)
# are in PCI bus order. Set before torch initialises CUDA.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

COPY_BYTES = 32 * 1024 * 1024  # per direction and pair: a real transfer, small next to any card's memory
REDUCE_FLOATS = 1024 * 1024  # 4 MiB per GPU
STEP_TIMEOUT_S = 30
RENDEZVOUS_TIMEOUT_S = 30  # torch.distributed's own bound on process group start-up


def say(line):
    print(line, flush=True)


def result(ok, pairs, failed=None, why=""):
    say("RESULT " + json.dumps({"ok": ok, "pairs": pairs, "failed": failed, "why": why}))


class Watchdog:
    """Ends the whole process when one step runs past its bound: a hung CUDA or NCCL call cannot be
    interrupted from Python, but this thread still runs while the main one waits inside it."""

    def __init__(self, timeout_s, pairs):
        self.timeout_s, self.pairs = timeout_s, pairs
        self.timer = None
        self.children = []  # the all-reduce's ranks: ended with this process

    def step(self, name):
        self.cancel()
        say(f"STEP {name}")
        self.timer = threading.Timer(self.timeout_s, self._expired, args=(name,))
        self.timer.daemon = True
        self.timer.start()

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()

    def _expired(self, name):
        result(False, self.pairs, name, f"{name} did not finish within {self.timeout_s:g} s (hung)")
        for child in self.children:
            child.kill()
        os._exit(3)


def pattern(torch, size, seed, device):
    """`size` bytes: 0..255 repeated, shifted by `seed` (so each direction's bytes differ)."""
    base = torch.arange(256, dtype=torch.uint8, device=device).repeat(size // 256)
    return base + seed  # uint8 wraps modulo 256


def copy_check(torch, gpus, size, watchdog, pairs):
    """Each ordered pair: source pattern on GPU a, copied to GPU b, compared on the host."""
    for i in range(len(gpus)):
        for j in range(len(gpus)):
            if i == j:
                continue
            name = f"copy GPU{gpus[i]}->GPU{gpus[j]}"
            watchdog.step(name)
            started = time.monotonic()
            source = pattern(torch, size, i * 16 + j, f"cuda:{i}")
            target = torch.empty(size, dtype=torch.uint8, device=f"cuda:{j}")
            target.copy_(source)
            torch.cuda.synchronize(j)
            seconds = time.monotonic() - started
            same = torch.equal(target.cpu(), source.cpu())
            watchdog.cancel()
            pairs.append({"step": name, "ok": same, "seconds": round(seconds, 3)})
            if not same:
                result(False, pairs, name, f"{name}: the bytes read back differ from the bytes sent")
                return False
            say(f"OK {name} ({size} bytes, {seconds:.3f} s)")
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_reduce_check(gpus, floats, timeout_s, watchdog, pairs):
    """One process per GPU (this script again, `--rank`), NCCL all-reduce over all of them."""
    name = "all-reduce " + "+".join(f"GPU{g}" for g in gpus)
    watchdog.step(name)
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--gpus",
                               ",".join(map(str, gpus)), "--floats", str(floats), "--port", port,
                               "--step-timeout-s", str(timeout_s)])
             for r in range(len(gpus))]
    watchdog.children = ranks
    codes = []
    for process in ranks:
        codes.append(process.wait())  # bounded by the watchdog: it ends this process, and the ranks with it
    watchdog.cancel()
    ok = codes == [0] * len(ranks)
    pairs.append({"step": name, "ok": ok, "exit_codes": codes})
    if not ok:
        why = "wrong sums" if 1 in codes else "a rank timed out or failed"
        result(False, pairs, name, f"{name}: {why} (rank exit codes {codes})")
        return False
    say(f"OK {name}")
    return True


def rank_main(args):
    """One rank of the all-reduce: its GPU's value is rank + 1; the sum is n(n+1)/2 everywhere."""
    import datetime

    import torch
    import torch.distributed as dist

    world = len(args.gpus)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=args.port)
    torch.cuda.set_device(args.rank)
    dist.init_process_group("nccl", rank=args.rank, world_size=world,
                            timeout=datetime.timedelta(seconds=min(args.step_timeout_s, RENDEZVOUS_TIMEOUT_S)))
    tensor = torch.full((args.floats,), float(args.rank + 1), dtype=torch.float32, device=f"cuda:{args.rank}")
    dist.all_reduce(tensor)
    torch.cuda.synchronize(args.rank)
    expected = world * (world + 1) / 2
    ok = tensor.min().item() == expected == tensor.max().item()
    dist.destroy_process_group()
    if not ok:
        say(f"rank {args.rank} (GPU{args.gpus[args.rank]}): sum {tensor.min().item()}..{tensor.max().item()}, "
            f"expected {expected}")
    return 0 if ok else 1


def parse(argv):
    parser = argparse.ArgumentParser(prog="rigkit-p2p-probe")
    parser.add_argument("--gpus", required=True, type=lambda s: [int(g) for g in s.split(",")],
                        help="the model's GPUs (nvidia-smi indices), for naming pairs")
    parser.add_argument("--bytes", type=int, default=COPY_BYTES)
    parser.add_argument("--floats", type=int, default=REDUCE_FLOATS)
    parser.add_argument("--step-timeout-s", type=float, default=STEP_TIMEOUT_S)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port")
    args = parser.parse_args(argv)
    if args.bytes <= 0 or args.bytes % 256 or args.floats <= 0 or args.step_timeout_s <= 0:
        parser.error("--bytes must be a positive multiple of 256, --floats and --step-timeout-s positive")
    return args


def main(argv):
    args = parse(argv)
    if args.rank is not None:
        return rank_main(args)
    pairs = []
    watchdog = Watchdog(args.step_timeout_s, pairs)
    watchdog.step("start CUDA")
    import torch

    count = torch.cuda.device_count()
    watchdog.cancel()
    if count != len(args.gpus):
        result(False, pairs, "start CUDA", f"the container sees {count} GPUs, the model has {len(args.gpus)}")
        return 1
    if not copy_check(torch, args.gpus, args.bytes, watchdog, pairs):
        return 1
    if not all_reduce_check(args.gpus, args.floats, args.step_timeout_s, watchdog, pairs):
        return 1
    result(True, pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
