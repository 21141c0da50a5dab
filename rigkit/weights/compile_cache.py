"""The compile cache travels with the weights: a rig whose weights come from another rig's volume
(`weights.source: {rig: NAME}`) also takes the graphs vLLM compiled there, so its first start loads
them instead of compiling (docs/serving.md, "Time to ready").

What is shipped is one key of vLLM's cache, the one the source rig's last proven start used (its
startup table, rigkit-stack's STARTUP_FILE, names it): `torch_compile_cache/KEY`, and its AOT twin
`torch_compile_cache/torch_aot_compile/KEY` where there is one. vLLM keys graphs on the config and its
own code but not on the GPU or the driver (Inductor's Triton kernels are built for the GPU they were
compiled on), so a key is shipped only where both rigs run the same image (by ID), the model's GPUs
are the same model and the driver the same version; else nothing is shipped and the deploy says which
differs. A key the target's cache volume has already is not shipped again.

The stream is a tar of the key's folder between two OpenSSH `ssh` (the weights relay's one transport),
unpacked beside the cache and moved into place whole: a cut-off stream leaves nothing vLLM would read.
A cache that cannot be shipped never fails the deploy: the model compiles at its start, as it would.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time

from rigkit.config.schema import ModelConfig
from rigkit.plumbing.rig_reads import DOCKER_S, NVIDIA_SMI_S, bounded
from rigkit.rigside.names import WEIGHTS_HELPER_LABEL, compile_cache_volume, project_name, weights_helper_name
from rigkit.rigside.stack import STARTUP_FILE, stack_file
from rigkit.weights.layout import helper_image

CACHE_FOLDER = "torch_compile_cache"  # under VLLM_CACHE_ROOT (rigkit.serving.compose.COMPILE_CACHE_PATH)
INCOMING = f"{CACHE_FOLDER}/.rigkit-incoming"  # where a shipped key is unpacked before it is moved into place
READ_TIMEOUT_S = 60  # the reads of each rig: a docker, an nvidia-smi and a cat; a helper container at most
SHIP_TIMEOUT_S = 900  # one key's folder: tens to hundreds of MB on a GPU, across a LAN
KEY_CHARS = set("0123456789abcdef")


def key_paths(key: str) -> list[str]:
    """The folders of one key in vLLM's cache root (the graphs, and vLLM 0.32's AOT-compiled function)."""
    return [f"{CACHE_FOLDER}/{key}", f"{CACHE_FOLDER}/torch_aot_compile/{key}"]


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
    return (f"{missing}info=$({docker} volume inspect --format '{{{{.Driver}}}}:{{{{len .Options}}}}:{{{{.Mountpoint}}}}' "
            f"{quoted} 2>/dev/null); "
            'case "$info" in local:0:/*) mp=${info#local:0:} ;; *) mp= ;; esac; '
            f'if [ -n "$mp" ] && [ -d "$mp" ] && [ {access} "$mp" ]; then cd "$mp" && exec sh -c {shlex.quote(script)}; fi; '
            f"{docker} rm -f {shlex.quote(helper)} >/dev/null 2>&1; exec {run}")


def identity_command(image: str, stack_name: str | None) -> str:
    """What a rig says of itself for the match: its image's ID, each GPU's index, name and driver, and (the
    source) the model's last startup table, one line each."""
    nvsmi = bounded("nvidia-smi", NVIDIA_SMI_S)
    start = (f"printf 'start='; tr -d '\\n' < {shlex.quote(stack_file(stack_name, STARTUP_FILE))} 2>/dev/null; echo; "
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


def shipped_key(start: dict | None) -> str | None:
    """The key of the graphs a startup table says its start used (hit, or compiled and kept), else None."""
    cache = (start or {}).get("compile_cache")
    if not isinstance(cache, dict) or cache.get("cache") not in ("hit", "miss"):
        return None
    key = cache.get("key")
    return key if isinstance(key, str) and 10 <= len(key) <= 128 and set(key) <= KEY_CHARS else None


def mismatch(source_gpus: list[int], source: dict, target_gpus: list[int], target: dict, rig: str) -> str | None:
    """Why graphs compiled on the source rig would not serve the target's model, or None where they would:
    the image, the GPUs' model, the driver (each side's `parse_identity`, its model's GPU indices)."""
    if not source["image"] or source["image"] != target["image"]:
        return (f"the image differs (rig {rig} {source['image'][:19] or 'has none'}, "
                f"this rig {target['image'][:19] or 'has none'})")
    names = [[side["gpus"].get(i, ("?", "?"))[0] for i in gpus] for side, gpus in ((source, source_gpus), (target, target_gpus))]
    if names[0] != names[1] or "?" in names[0]:
        return f"the GPUs differ (rig {rig} {', '.join(names[0])}, this rig {', '.join(names[1])})"
    drivers = [{side["gpus"][i][1] for i in gpus} for side, gpus in ((source, source_gpus), (target, target_gpus))]
    if drivers[0] != drivers[1]:
        return f"the driver differs (rig {rig} {', '.join(sorted(drivers[0]))}, this rig {', '.join(sorted(drivers[1]))})"
    return None


def has_key_script(key: str) -> str:
    return " || ".join(f"[ -d {shlex.quote(path)} ]" for path in key_paths(key)) + " && echo has-key || echo no-key"


def send_script(key: str) -> str:
    """tar of the key's folders that exist, to stdout; exit 3 where neither does."""
    found = "; ".join(f"[ -d {shlex.quote(p)} ] && set -- \"$@\" {shlex.quote(p)}" for p in key_paths(key))
    return f"set --; {found}; [ $# -gt 0 ] || exit 3; exec tar -cf - \"$@\""


def receive_script(key: str) -> str:
    """Unpack the stream beside the cache; only a whole archive's folders are moved into place (where the
    cache has none of that name yet), then flushed to disk; the size received, in KiB, is the last line."""
    moves = "; ".join(f"if [ -d \"$inc\"/{shlex.quote(p)} ] && [ ! -e {shlex.quote(p)} ]; then "
                      f"mkdir -p {shlex.quote(p.rpartition('/')[0])} && mv \"$inc\"/{shlex.quote(p)} {shlex.quote(p)}; fi"
                      for p in key_paths(key))
    return (f"set -e; inc={shlex.quote(INCOMING)}; rm -rf \"$inc\"; mkdir -p \"$inc\"; "
            'tar -xf - -C "$inc" || { c=$?; rm -rf "$inc"; exit $c; }; '
            f"kib=$(du -sk \"$inc\" | cut -f1); {moves}; rm -rf \"$inc\"; sync; echo \"received-kib=$kib\"")


def helper_label(model: ModelConfig) -> str:
    return model.name


def run_on(transport, command: str, timeout_s: float) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `command` on the rig of a paramiko transport; 124 when it gave no
    end within `timeout_s`."""
    channel = transport.open_session()
    try:
        channel.settimeout(timeout_s)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        parts, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = channel.recv(65536)
            if not data:
                return channel.recv_exit_status(), b"".join(parts).decode(errors="replace")
            parts.append(data)
    except (socket.timeout, OSError):
        pass
    finally:
        channel.close()
    return 124, ""


def target_has_key(transport, model: ModelConfig, key: str) -> bool:
    command = volume_shell(compile_cache_volume(model), has_key_script(key), helper_image(model),
                           weights_helper_name(model, "cache-check"), helper_label(model), read_only=True)
    code, out = run_on(transport, command, READ_TIMEOUT_S)
    return code == 0 and out.strip().endswith("has-key")


def cache_volume_labels(model: ModelConfig) -> list[str]:
    """Compose's own labels for the model's cache volume, so that `compose up` takes the volume made here as
    the one it would have made (no "not created by Docker Compose" warning)."""
    return [f"com.docker.compose.project={project_name(model)}", "com.docker.compose.volume=compile_cache"]


def ship(model: ModelConfig, source_model: ModelConfig, key: str, openssh: tuple[list[str], list[str]]) -> dict:
    """Stream the key's folders from the source rig's cache volume into the target's: {"kib", "seconds"};
    RuntimeError saying which side failed."""
    started = time.monotonic()
    source_ssh, target_ssh = openssh
    send = volume_shell(compile_cache_volume(source_model), send_script(key), helper_image(source_model),
                        weights_helper_name(source_model, "cache-send"), helper_label(source_model), read_only=True)
    volume = compile_cache_volume(model)
    docker = bounded("docker", DOCKER_S)
    create = " ".join([docker, "volume inspect", shlex.quote(volume), ">/dev/null 2>&1 ||", docker, "volume create",
                       *(f"--label {shlex.quote(label)}" for label in cache_volume_labels(model)), shlex.quote(volume),
                       ">/dev/null; "])
    receive = create + volume_shell(volume, receive_script(key), helper_image(model),
                                    weights_helper_name(model, "cache-receive"), helper_label(model), read_only=False)
    sender = subprocess.Popen([*source_ssh, send], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    receiver = None
    try:
        receiver = subprocess.Popen([*target_ssh, receive], stdin=sender.stdout, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
        sender.stdout.close()  # the receiver's `ssh` holds it now: the sender's exit ends the stream
        sender.stdout = None  # closed: communicate() below reads only its stderr
        out = receiver.communicate(timeout=SHIP_TIMEOUT_S)[0].decode(errors="replace")
        sent_err = sender.communicate(timeout=READ_TIMEOUT_S)[1].decode(errors="replace")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no end within {SHIP_TIMEOUT_S} s") from None
    finally:
        for proc in (sender, receiver):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    if sender.returncode != 0:
        why = "it has no such key any more" if sender.returncode == 3 else sent_err.strip()[-300:] or f"exit {sender.returncode}"
        raise RuntimeError(f"the sender on the source rig failed: {why}")
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if receiver.returncode != 0 or not last.startswith("received-kib="):
        raise RuntimeError(f"the receiver failed: {out.strip()[-300:] or f'exit {receiver.returncode}'}")
    return {"kib": int(last.partition("=")[2] or 0), "seconds": time.monotonic() - started}

