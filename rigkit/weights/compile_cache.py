"""The compile cache travels with the weights: a rig whose weights come from another rig's volume
(`weights.source: {rig: NAME}`) also takes the graphs vLLM compiled there, so its first start loads
them instead of compiling (docs/serving.md, "Time to ready").

What is shipped: the cache folders the source rig's last proven start used, as its startup table
(rigkit-stack's STARTUP_FILE, rigkit.rigside.startup) lists them from vLLM's log: `torch_compile_cache/KEY`
for the graphs and, where vLLM 0.32 AOT-compiled, `torch_compile_cache/torch_aot_compile/KEY2` (its own
hash). vLLM's key covers the config and its own code, Inductor's the GPU's name and the CUDA and Triton
versions; the driver is in neither. So a key from another GPU would only be missed, never misused; rigkit
ships only where both rigs run the same image (by ID, the target pulling it first where it has none yet),
the model's GPUs are the same model and the driver the same version, and says which differs otherwise.
Folders the target's cache volume has already are not shipped again.

The stream is a tar of those folders between two OpenSSH `ssh` (the weights relay's one transport),
unpacked beside the cache and moved into place by a second command once both ends finished well: a cut-off
stream, or a sender that could not read a file, leaves nothing vLLM would read. A cache that cannot be
shipped never fails the deploy: the model compiles at its start, as it would.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import tempfile
import time

from rigkit.config.schema import ModelConfig
from rigkit.plumbing.rig_reads import DOCKER_S, NVIDIA_SMI_S, bounded
from rigkit.rigside.names import WEIGHTS_HELPER_LABEL, compile_cache_volume, project_name, weights_helper_name
from rigkit.rigside.stack import STARTUP_FILE, stack_file
from rigkit.rigside.startup import CACHE_PATHS
from rigkit.weights.layout import helper_image
from rigkit.weights.relay import volume_folder

CACHE_FOLDER = "torch_compile_cache"  # under VLLM_CACHE_ROOT (rigkit.serving.compose.COMPILE_CACHE_PATH)
INCOMING = f"{CACHE_FOLDER}/.rigkit-incoming"  # where a shipped key is unpacked before it is moved into place
READ_TIMEOUT_S = 60  # the reads of each rig: a docker, an nvidia-smi and a cat; a helper container at most
SHIP_TIMEOUT_S = 900  # one key's folder: tens to hundreds of MB on a GPU, across a LAN
ANSWER_MAX_BYTES = 1024 * 1024  # what is read of a rig's answer (a startup table is a few KiB)
PULL_TIMEOUT_S = 1800  # the image, where the target has not pulled it yet (serving would, next)
SENDER_GRACE_S = 60  # once the receiver has ended: the sender's own end


def volume_shell(volume: str, script: str, image: str, helper: str, label: str, read_only: bool) -> str:
    """A shell command on a rig running `script` (POSIX sh) in the folder of the Docker volume `volume`: on the
    rig's own shell where it reaches that folder (a local volume without options, readable or writable as
    needed), else in a helper container (`image`, no network, the volume at /v, named `helper`, labelled as
    the weights helpers so a deploy removes one a killed copy left behind). A volume that is not there is an
    empty one: the script runs in an empty folder, and nothing is created for a read."""
    docker = bounded("docker", DOCKER_S)
    quoted = shlex.quote(volume)
    mount = f"type=volume,source={volume},target=/v" + (",readonly" if read_only else "")
    run = shlex.join(["docker", "run", "--rm", "-i", "--name", helper, "--network", "none", "--pull", "never",
                      "--label", f"{WEIGHTS_HELPER_LABEL}={label}", "--mount", mount, "--workdir", "/v",
                      "--entrypoint", "sh", image, "-c", script])
    missing = (f"{docker} volume inspect {quoted} >/dev/null 2>&1 || {{ d=$(mktemp -d); cd \"$d\" && sh -c "
               f"{shlex.quote(script)}; c=$?; rm -rf \"$d\"; exit $c; }}; ") if read_only else ""
    access = "-r" if read_only else "-w"
    return (f"{missing}{volume_folder(volume)}"
            f'if [ -n "$mp" ] && [ -d "$mp" ] && [ {access} "$mp" ]; then cd "$mp" && exec sh -c {shlex.quote(script)}; fi; '
            f"{docker} rm -f {shlex.quote(helper)} >/dev/null 2>&1; exec {run}")


def identity_command(image: str, stack_name: str | None) -> str:
    """What a rig says of itself for the match: its image's ID, each GPU's index, name and driver, and (the
    source) the model's last startup table, one line each."""
    nvsmi = bounded("nvidia-smi", NVIDIA_SMI_S)
    start = (f"printf 'start='; head -c {ANSWER_MAX_BYTES // 2} {shlex.quote(stack_file(stack_name, STARTUP_FILE))} "
             "2>/dev/null | tr -d '\\n'; echo; "
             if stack_name else "")
    return (f"printf 'image='; {bounded('docker', DOCKER_S)} image inspect --format '{{{{.Id}}}}' {shlex.quote(image)} "
            f"2>/dev/null; echo; {start}"
            f"{nvsmi} --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu=/'; exit 0")


def parse_identity(text: str) -> dict:
    """{"image": ID or "", "gpus": {index: (name, driver)}, "start": the startup table or None}."""
    found = {"image": "", "gpus": {}, "start": None}
    for line in text.splitlines():
        field, _, value = line.partition("=")
        if field == "image":
            found["image"] = value.strip()
        elif field == "start" and value.strip():
            try:
                start = json.loads(value)
            except ValueError:
                continue
            found["start"] = start if isinstance(start, dict) else None
        elif field == "gpu":
            cells = [cell.strip() for cell in value.split(",")]
            if len(cells) == 3 and cells[0].isdigit():
                found["gpus"][int(cells[0])] = (cells[1], cells[2])
    return found


def shipped_paths(start: dict | None) -> list[str]:
    """The cache folders a startup table says its start used (a hit, or compiled and kept): its `paths`, every
    key vLLM logged (the graphs' and, apart, the AOT function's); [] for none (a table from before they were kept)."""
    cache = (start or {}).get("compile_cache")
    if not isinstance(cache, dict) or cache.get("cache") not in ("hit", "miss"):
        return []
    paths = cache.get("paths")
    return sorted({p for p in paths if isinstance(p, str) and CACHE_PATHS.fullmatch(p)})[:8] if isinstance(paths, list) else []


def mismatch(source_gpus: list[int], source: dict, target_gpus: list[int], target: dict, rig: str) -> str | None:
    """Why graphs compiled on the source rig should not serve the target's model, or None where they may: the
    GPUs' model, the driver (each side's `parse_identity`, its model's GPU indices). The image: `image_mismatch`."""
    names = [[side["gpus"].get(i, ("?", "?"))[0] for i in gpus] for side, gpus in ((source, source_gpus), (target, target_gpus))]
    if names[0] != names[1] or "?" in names[0]:
        return f"the GPUs differ (rig {rig} {', '.join(names[0])}, this rig {', '.join(names[1])})"
    drivers = [{side["gpus"][i][1] for i in gpus} for side, gpus in ((source, source_gpus), (target, target_gpus))]
    if drivers[0] != drivers[1]:
        return f"the driver differs (rig {rig} {', '.join(sorted(drivers[0]))}, this rig {', '.join(sorted(drivers[1]))})"
    return None


def image_mismatch(source: dict, target: dict, rig: str) -> str | None:
    if source["image"] and source["image"] == target["image"]:
        return None
    return f"the image differs (rig {rig} {source['image'][:19] or 'has none'}, this rig {target['image'][:19] or 'has none'})"


def has_paths_script(paths: list[str]) -> str:
    return " && ".join(f"[ -d {shlex.quote(p)} ]" for p in paths) + " && echo has-key || echo no-key"


def send_script(paths: list[str]) -> str:
    """tar of the folders, to stdout; exit 3 where one is gone."""
    there = " && ".join(f"[ -d {shlex.quote(p)} ]" for p in paths)
    return f"{there} || exit 3; exec tar -cf - {' '.join(shlex.quote(p) for p in paths)}"


def receive_script() -> str:
    """Unpack the stream beside the cache (INCOMING, emptied first); the size received, in KiB, is the last line.
    Nothing moves into place here: `commit_script` does, once the sender too has ended well."""
    return (f"set -e; inc={shlex.quote(INCOMING)}; rm -rf \"$inc\"; mkdir -p \"$inc\"; "
            'tar -xf - -C "$inc" || { c=$?; rm -rf "$inc"; exit $c; }; '
            'echo "received-kib=$(du -sk "$inc" | cut -f1)"')


def commit_script(paths: list[str]) -> str:
    """Move the received folders into place (where the cache has none of that name yet), flushed to disk."""
    moves = "; ".join(f"if [ -d \"$inc\"/{shlex.quote(p)} ] && [ ! -e {shlex.quote(p)} ]; then "
                      f"mkdir -p {shlex.quote(p.rpartition('/')[0])} && mv \"$inc\"/{shlex.quote(p)} {shlex.quote(p)}; fi"
                      for p in paths)
    return f"set -e; inc={shlex.quote(INCOMING)}; [ -d \"$inc\" ]; {moves}; rm -rf \"$inc\"; sync; echo committed"


def helper_label(model: ModelConfig) -> str:
    return model.name


def run_on(transport, command: str, timeout_s: float) -> tuple[int, str]:
    """(exit status, stdout and stderr: at most ANSWER_MAX_BYTES) of `command` on the rig of a paramiko transport;
    124 when it gave no end within `timeout_s` (the channel is closed then)."""
    deadline = time.monotonic() + timeout_s
    channel = transport.open_session()
    parts, size = [], 0
    try:
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        while (remaining := deadline - time.monotonic()) > 0:
            channel.settimeout(remaining)
            data = channel.recv(65536)
            if not data:
                if channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                    return channel.recv_exit_status(), b"".join(parts).decode(errors="replace")
                break
            if size < ANSWER_MAX_BYTES:
                parts.append(data[:ANSWER_MAX_BYTES - size])
                size += len(parts[-1])
    except (socket.timeout, OSError):
        pass
    finally:
        channel.close()
    return 124, ""


def target_has(transport, model: ModelConfig, paths: list[str]) -> bool | None:
    """Whether the target's cache volume holds every folder; None where the rig did not say."""
    command = volume_shell(compile_cache_volume(model), has_paths_script(paths), helper_image(model),
                           weights_helper_name(model, "cache-check"), helper_label(model), read_only=True)
    code, out = run_on(transport, command, READ_TIMEOUT_S)
    answer = out.strip().splitlines()[-1] if out.strip() else ""
    return None if code != 0 or answer not in ("has-key", "no-key") else answer == "has-key"


def pull_command(image: str) -> str:
    return f"timeout -k 10 {PULL_TIMEOUT_S} docker pull -q {shlex.quote(image)} >/dev/null"


def cache_volume_labels(model: ModelConfig) -> list[str]:
    """Compose's own labels for the model's cache volume, so that `compose up` takes the volume made here as
    the one it would have made (no "not created by Docker Compose" warning)."""
    return [f"com.docker.compose.project={project_name(model)}", "com.docker.compose.volume=compile_cache"]


def ship(model: ModelConfig, source_model: ModelConfig, paths: list[str], openssh: tuple[list[str], list[str]],
         target_transport) -> dict:
    """Stream the folders from the source rig's cache volume into the target's, then move them into place there
    once both ends finished well: {"kib", "seconds"}; RuntimeError saying which side failed."""
    started = time.monotonic()
    source_ssh, target_ssh = openssh
    send = volume_shell(compile_cache_volume(source_model), send_script(paths), helper_image(source_model),
                        weights_helper_name(source_model, "cache-send"), helper_label(source_model), read_only=True)
    volume = compile_cache_volume(model)
    docker = bounded("docker", DOCKER_S)
    create = " ".join([docker, "volume inspect", shlex.quote(volume), ">/dev/null 2>&1 ||", docker, "volume create",
                       *(f"--label {shlex.quote(label)}" for label in cache_volume_labels(model)), shlex.quote(volume),
                       ">/dev/null; "])

    def on_target(script: str, side: str) -> str:
        return volume_shell(volume, script, helper_image(model), weights_helper_name(model, side),
                            helper_label(model), read_only=False)

    with tempfile.TemporaryFile() as sent_err:
        sender = subprocess.Popen([*source_ssh, send], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=sent_err)
        receiver = None
        try:
            receiver = subprocess.Popen([*target_ssh, create + on_target(receive_script(), "cache-receive")],
                                        stdin=sender.stdout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            sender.stdout.close()  # the receiver's `ssh` holds it now: the sender's exit ends the stream
            try:
                out = receiver.communicate(timeout=SHIP_TIMEOUT_S)[0][-ANSWER_MAX_BYTES:].decode(errors="replace")
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the stream had no end within {SHIP_TIMEOUT_S} s") from None
            try:
                sender.wait(timeout=SENDER_GRACE_S)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the sender on the source rig did not end within {SENDER_GRACE_S} s of the "
                                   "receiver") from None
        finally:
            for proc in (sender, receiver):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        sent_err.seek(0)
        why_sent = sent_err.read(ANSWER_MAX_BYTES).decode(errors="replace").strip()[-300:]
    if sender.returncode != 0:
        why = "it no longer has those folders" if sender.returncode == 3 else why_sent or f"exit {sender.returncode}"
        raise RuntimeError(f"the sender on the source rig failed: {why}")
    last = out.strip().splitlines()[-1] if out.strip() else ""
    kib = last.partition("=")[2]
    if receiver.returncode != 0 or not last.startswith("received-kib=") or not kib.isdigit():
        raise RuntimeError(f"the receiver failed: {out.strip()[-300:] or f'exit {receiver.returncode}'}")
    code, said = run_on(target_transport, on_target(commit_script(paths), "cache-commit"), READ_TIMEOUT_S)
    if code != 0 or not said.strip().endswith("committed"):
        raise RuntimeError(f"moving the received folders into place failed: {said.strip()[-300:] or f'exit {code}'}")
    return {"kib": int(kib), "seconds": time.monotonic() - started}
