"""vLLM stand-ins as local processes that rigkit-ondemand can stop, start and restart by a command, as it
stops and starts a model's container on a rig. TEST INFRASTRUCTURE: it plays Docker Compose's stop, start
and restart for a process on 127.0.0.1 (the container and its engine process; a restart is a new process,
so whatever a bad wake corrupted is gone, as in a restarted container).

    python3 tests/ondemand_engines.py stop|start|restart|memory|pids SPEC.json

`memory` plays `nvidia-smi --query-gpu=memory.used` for the engine's one GPU: the MiB its process holds (the
stand-in's STANDIN_MEMORY_FILE), 0 once that process is gone, as a driver frees a dead process's memory.
`pids` plays `docker top CONTAINER -eo pid`: a header, then the engine's PID while it runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER = Path(__file__).parent / "vllm_standin" / "server.py"


def spec_for(folder: Path, name: str, port: int, env: dict[str, str], flags: list[str]) -> Path:
    """Write the spec of one engine (its model folder, port, environment) and return its path."""
    model = folder / f"model-{name}"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    spec = folder / f"engine-{name}.json"
    spec.write_text(json.dumps({
        "argv": [sys.executable, "-u", str(SERVER), str(model), "--host", "127.0.0.1", "--port", str(port),
                 "--served-model-name", name, "--enable-sleep-mode", *flags],
        "env": {"STANDIN_LOAD_S": "0", "VLLM_SERVER_DEV_MODE": "1", "STANDIN_MEMORY_FILE": str(folder / f"engine-{name}.mem"),
                **env},
        "pidfile": str(folder / f"engine-{name}.pid"), "log": str(folder / f"engine-{name}.log")}))
    return spec


def start(spec_path: Path) -> None:
    spec = json.loads(Path(spec_path).read_text())
    log = open(spec["log"], "a")
    proc = subprocess.Popen(spec["argv"], env=dict(os.environ, **spec["env"]), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    Path(spec["pidfile"]).write_text(str(proc.pid))


def stop(spec_path: Path) -> None:
    spec = json.loads(Path(spec_path).read_text())
    try:
        pid = int(Path(spec["pidfile"]).read_text())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):  # bounded: 10 s, then SIGKILL
        if not alive(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def memory(spec_path: Path) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        pid, mib = Path(spec["env"]["STANDIN_MEMORY_FILE"]).read_text().split()
    except (FileNotFoundError, ValueError):
        return 0
    return int(mib) if alive(int(pid)) else 0


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet is not: it serves nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def command(verb: str, spec_path: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), verb, str(spec_path)]


if __name__ == "__main__":
    verb, path = sys.argv[1], Path(sys.argv[2])
    if verb == "memory":
        print(memory(path))
    if verb == "pids":  # as `docker top CONTAINER -eo pid` prints the container's processes
        print("PID")
        try:
            pid = int(Path(json.loads(path.read_text())["pidfile"]).read_text())
        except (FileNotFoundError, ValueError):
            pid = 0
        if pid and alive(pid):
            print(pid)
    if verb in ("stop", "restart"):
        stop(path)
    if verb in ("start", "restart"):
        start(path)


def alternate(models: tuple[str, str], ask, both_loaded, clients: int = 4, each: int = 8,
              timeout_s: float = 300) -> tuple[list[str], list, int]:
    """`clients` threads of `each` requests, each client alternating between the two `models` from its own
    start (`ask(model, stream)` -> what the request returned; every third one not streamed), while a watcher
    samples `both_loaded()` every 20 ms. Returns (the failed requests, said; what the others returned; how many
    samples found both loaded). Every kind of exception counts as a failed request."""
    import threading

    failures, answers, both, stop = [], [], [], threading.Event()

    def watch():
        while not stop.is_set():
            if both_loaded():
                both.append(time.monotonic())
            time.sleep(0.02)

    def client(k: int):
        for i in range(each):
            model = models[(i + k) % 2]
            try:
                answers.append(ask(model, bool((i + k) % 3)))
            except Exception as error:
                failures.append(f"client {k} request {i} ({model}): {error!r}")

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    stop.set()
    watcher.join(10)
    return failures, answers, len(both)
