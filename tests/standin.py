"""Run the vLLM stand-in as a local process on 127.0.0.1 (no Docker): fast for client tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

SERVER = Path(__file__).parent / "vllm_standin" / "server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def standin(tmp_path, *flags: str, name: str = "m", **env: str):
    """Yield the base URL of a running stand-in serving `name` with vLLM `flags` and STANDIN_* `env`."""
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text("{}")
    port = free_port()
    environment = dict(os.environ, STANDIN_LOAD_S="0", **{k.upper(): v for k, v in env.items()})
    proc = subprocess.Popen(
        [sys.executable, "-u", str(SERVER), str(model_dir), "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", name, *flags],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:  # until it answers /health (a fault may make it answer slowly or badly, never not at all)
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError(f"stand-in exited: {proc.stdout.read()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"stand-in on {url} did not answer /health within 20 s") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()
