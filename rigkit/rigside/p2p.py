"""The active P2P check's rig side (`rigkit-stack probe`): run rigkit-p2p-probe.py in a short-lived
container of the model's own service, bounded, and keep a passed verdict so it is not run again.

The container is `docker compose run` of the model's wanted compose file: its image, its GPU
reservation and its environment (NCCL_P2P_DISABLE where rigkit set it), no ports of its own (host
networking), removed when it ends. The script goes in on stdin (a bind mount would name a path of
the engine's host, which is not the rig where the engine is remote). Every wait is bounded and says
what it waited for; a verdict file is written only after the probe passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

from . import atomic, keyfile, names

INSPECT_TIMEOUT_S = 60  # docker image inspect, docker rm
PULL_TIMEOUT_S = 1800  # an image of many GB, pulled before the probe's own clock starts
# In the container: keep the script in /tmp, then run it with the image's python3.
BOOTSTRAP = 'cat > /tmp/rigkit-p2p-probe.py && exec python3 /tmp/rigkit-p2p-probe.py "$@"'
FIX = ("the GPUs' peer-to-peer path does not work as the driver reports it: see docs/topology.md (ACS off in "
       "the BIOS, `iommu=pt`), or give the model `env: {NCCL_P2P_DISABLE: \"1\"}` and `extra_args: "
       "[--disable-custom-all-reduce]` in its catalog entry")


class ProbeFailed(Exception):
    """The check failed; the message names the step (the pair) and the fix."""


def _run(command, timeout_s, what):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=keyfile.compose_env())
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"{what} did not finish within {timeout_s} s") from None


def _compose(project, compose_file):
    return ["docker", "compose", "-p", project, "-f", compose_file]


def ensure_image(project, compose_file, say):
    """The image is pulled (bounded) before the probe's clock starts: a pull is not a hang."""
    images = _run([*_compose(project, compose_file), "config", "--images"], INSPECT_TIMEOUT_S, "`docker compose config`")
    for image in images.stdout.split():
        if _run(["docker", "image", "inspect", image], INSPECT_TIMEOUT_S, "`docker image inspect`").returncode != 0:
            say(f"pulling {image} for the P2P check (up to {PULL_TIMEOUT_S} s)")
            pulled = _run([*_compose(project, compose_file), "pull", names.ENGINE_SERVICE], PULL_TIMEOUT_S,
                          f"pulling {image}")
            if pulled.returncode != 0:
                raise ProbeFailed(f"pulling {image} failed: {(pulled.stderr or pulled.stdout).strip()}")


def last_step(output):
    """The last step the probe started (its `STEP name` lines), or None."""
    steps = [line[5:] for line in output.splitlines() if line.startswith("STEP ")]
    return steps[-1] if steps else None


def verdict_of(output):
    """The probe's `RESULT {json}` line, or None when it printed none."""
    for line in reversed(output.splitlines()):
        if line.startswith("RESULT "):
            try:
                return json.loads(line[7:])
            except ValueError:
                return None
    return None


def probe(project, compose_file, script_path, gpus, timeout_s, say):
    """Run the check; returns its verdict (dict) when it passed, raises ProbeFailed naming the step
    otherwise. `timeout_s` bounds the container from its start to its end; each step inside gets half."""
    with open(script_path, "rb") as f:
        script = f.read()
    ensure_image(project, compose_file, say)
    name = f"{project}-p2p-check"
    _run(["docker", "rm", "-f", name], INSPECT_TIMEOUT_S, f"removing a leftover {name}")
    command = [*_compose(project, compose_file), "run", "--rm", "-T", "--no-deps", "--name", name,
               "--entrypoint", "sh", names.ENGINE_SERVICE, "-c", BOOTSTRAP, "rigkit-p2p-probe",
               "--gpus", ",".join(map(str, gpus)), "--step-timeout-s", str(max(1.0, timeout_s / 2))]
    say(f"P2P check of GPUs {', '.join(map(str, gpus))} in {name} (at most {timeout_s} s)")
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as given:
        given.write(script)
        given.seek(0)
        process = subprocess.Popen(command, stdin=given, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=INSPECT_TIMEOUT_S)
            code = None
        out.seek(0)
        output = out.read().decode(errors="replace")
    seconds = time.monotonic() - started
    for line in output.splitlines()[-20:]:
        print(f"    {line}", flush=True)
    if code is None:
        _run(["docker", "rm", "-f", name], INSPECT_TIMEOUT_S, f"removing the hung {name}")
        step = last_step(output) or "starting the container"
        raise ProbeFailed(f"the P2P check hung at {step}: no end within {timeout_s} s (container removed); {FIX}")
    verdict = verdict_of(output)
    if verdict is None:
        raise ProbeFailed(f"the P2P check ended (exit {code}) without a verdict after {seconds:.1f} s "
                          f"(last step: {last_step(output) or 'none'})")
    if code != 0 or not verdict.get("ok"):
        raise ProbeFailed(f"the P2P check failed at {verdict.get('failed')}: {verdict.get('why')}; {FIX}")
    return {**verdict, "seconds": round(seconds, 1), "gpus": list(gpus)}


def passed(key, verdict_dir=names.P2P_VERDICT_DIR):
    return os.path.exists(names.p2p_verdict_path(key, verdict_dir))


def keep(key, verdict, verdict_dir=names.P2P_VERDICT_DIR):
    """The passed verdict, written last (atomically): its presence is what the deploy reads."""
    os.makedirs(verdict_dir, exist_ok=True)
    atomic.write_text(names.p2p_verdict_path(key, verdict_dir), json.dumps({"key": key, **verdict}, indent=2) + "\n")
