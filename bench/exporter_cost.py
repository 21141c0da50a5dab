"""What the monitoring exporter costs, and whether its values match nvidia-smi's (read only).

Starts the real exporter (templates/monitoring/rigkit-exporter.py) on this machine's GPUs with the
rig-side runtime from --lib, scrapes it every --interval s for --seconds s as Prometheus would, and
reports the exporter's CPU time per wall second (from /proc/<pid>/stat), the scrape times, and one
scrape's values beside nvidia-smi's query made right after it. Changes no GPU setting.

    python3 bench/exporter_cost.py --lib DIR [--seconds 60] [--interval 1] [--port 19835] [--exporter PATH]

DIR holds the runtime as `rigside/` (a copy of rigkit/rigside), and pynvml / prometheus_client where
the Python here lacks them. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMI_FIELDS = ("index", "power.draw", "enforced.power.limit", "power.limit", "clocks.sm", "clocks.mem", "temperature.gpu")
EXPORTER_FOR = {"power.draw": "DCGM_FI_DEV_POWER_USAGE", "enforced.power.limit": "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
                "power.limit": "DCGM_FI_DEV_POWER_MGMT_LIMIT", "clocks.sm": "DCGM_FI_DEV_SM_CLOCK",
                "clocks.mem": "DCGM_FI_DEV_MEM_CLOCK", "temperature.gpu": "DCGM_FI_DEV_GPU_TEMP"}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> tuple[str, float]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return text, time.monotonic() - started


def values(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_") and 'gpu="' in line:
            name = line.split("{", 1)[0]
            gpu = line.split('gpu="', 1)[1].split('"', 1)[0]
            out[(name, gpu)] = float(line.rsplit(" ", 1)[1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--port", type=int, default=19835)
    parser.add_argument("--exporter", default=str(REPO / "templates/monitoring/rigkit-exporter.py"))
    args = parser.parse_args()

    smi_list = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    gpus = list(range(len([line for line in smi_list.splitlines() if line.startswith("GPU ")])))
    folder = Path(tempfile.mkdtemp(prefix="exporter-cost-"))
    settings = folder / "settings.json"
    settings.write_text(json.dumps({"rig": "bench", "address": "127.0.0.1", "port": args.port, "gpus": gpus,
                                    "models": {}, "policy_path": str(folder / "none"),
                                    "keeper_state_path": str(folder / "none"), "watchdog_state_dir": str(folder),
                                    "verify_summary_dir": str(folder), "hung_after_s": 30}))
    env = dict(os.environ, RIGKIT_LIB_DIR=args.lib, PYTHONPATH=os.pathsep.join(filter(None, [args.lib, os.environ.get("PYTHONPATH")])))
    exporter = subprocess.Popen([sys.executable, args.exporter, str(settings)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:  # bounded: the exporter answers its first scrape, or we say why not
            try:
                scrape(args.port)
                break
            except OSError:
                if exporter.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the exporter did not answer on 127.0.0.1:{args.port} within 30 s: "
                                     f"{exporter.stdout.read() if exporter.poll() is not None else 'still starting'}")
                time.sleep(0.2)
        cpu0, wall0 = cpu_s(exporter.pid), time.monotonic()
        durations, starts, powers = [], [], []
        next_at = wall0
        while time.monotonic() - wall0 < args.seconds:
            starts.append(time.monotonic())
            text, took = scrape(args.port)
            durations.append(took)
            powers.append(values(text).get(("DCGM_FI_DEV_POWER_USAGE", "0")))
            next_at += args.interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        wall = time.monotonic() - wall0
        cpu = cpu_s(exporter.pid) - cpu0
        text, _ = scrape(args.port)
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
    exported = values(text)
    compared = []
    for line in smi.splitlines():
        cells = dict(zip(SMI_FIELDS, (c.strip() for c in line.split(","))))
        for field, name in EXPORTER_FOR.items():
            compared.append({"gpu": cells["index"], "nvidia_smi": field, "smi": cells[field],
                             "exporter": name, "value": exported.get((name, cells["index"]))})
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    durations.sort()
    print(json.dumps({
        "scrapes": len(durations), "interval_s": args.interval, "wall_s": round(wall, 2),
        "exporter_cpu_s": round(cpu, 3), "exporter_cpu_share_of_one_core": round(cpu / wall, 5),
        "scrape_s_p50": round(durations[len(durations) // 2], 4), "scrape_s_max": round(durations[-1], 4),
        "scrape_gap_s_min": round(min(gaps), 3) if gaps else None, "scrape_gap_s_max": round(max(gaps), 3) if gaps else None,
        "gpu0_power_w_min_max": [min(p for p in powers if p is not None), max(p for p in powers if p is not None)]
        if any(p is not None for p in powers) else None,
        "compared_with_nvidia_smi": compared,
        "energy_mj": {gpu: v for (name, gpu), v in exported.items() if name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
        "throttle_reasons": {gpu: v for (name, gpu), v in exported.items() if name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"},
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
