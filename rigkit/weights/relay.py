"""Weights from another rig's volume (`weights.source: {rig: NAME}`): a streamed relay through the
control machine, between two SSH channels the deploy already trusts.

On the source rig a helper container mounts its volume read-only and runs the copier's `send`;
on the target rig another mounts the target volume and runs `receive`. The controller writes the
source's manifest into the receiver, hands the receiver's plan (which files, from which byte) to
the sender, and pumps the sender's stdout into the receiver's stdin: nothing is staged on the
controller's disk, and the rigs need no SSH trust between them. The receiver fsyncs and journals
fixed-size chunks (CHUNK_BYTES), so a copy cut off resumes at its last journaled chunk.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time

from rigkit.config.defaults import WEIGHTS_CHUNK_BYTES as CHUNK_BYTES
from rigkit.config.schema import ModelConfig
from rigkit.render import template_text
from rigkit.rigside.names import PROJECT_PREFIX, volume_name

WINDOW_BYTES = 32 * 1024 * 1024  # SSH channel window: paramiko's 2 MiB default stalls a fast stream
PACKET_BYTES = 256 * 1024
PUMP_BYTES = 4 * 1024 * 1024
MANIFEST_TIMEOUT_S = 120  # one container start and a small JSON file
STALL_TIMEOUT_S = 300  # no byte in either direction for this long: the copy is given up (and resumes next time)


class RelayError(Exception):
    pass


def source_volume(model: ModelConfig) -> str:
    """The volume on the source rig: `weights.source.volume`, else the model's own volume name there."""
    return model.spec.weights.source.volume or volume_name(model)


def relay_name(model: ModelConfig, side: str) -> str:
    return f"{PROJECT_PREFIX}weights-{model.name}-{side}"


def helper_command(model: ModelConfig, side: str, volume: str, args: list[str], read_only: bool) -> str:
    """A shell command on a rig: replace any earlier helper of this side (one writer only), then run
    the copier in a container with stdin attached, no network, the volume at /v."""
    image = model.spec.weights.helper_image or model.spec.image
    name = relay_name(model, side)
    mount = f"type=volume,source={volume},target=/v" + (",readonly" if read_only else "")
    run = ["docker", "run", "--rm", "-i", "--name", name, "--network", "none", "--pull", "never",
           "--label", f"rigkit.weights-helper={model.name}", "--mount", mount, "--entrypoint", "python3",
           image, "-c", template_text("weights/rigkit-copy.py"), *args]
    # A source volume that is not there is an error, never created empty by `docker run`.
    exists = "" if not read_only else (
        f"docker volume inspect {shlex.quote(volume)} >/dev/null 2>&1 || "
        f"{{ echo {shlex.quote(json.dumps({'status': 'error', 'error': f'no volume {volume} on that rig'}))}; exit 2; }}; ")
    return f"{exists}docker rm -f {shlex.quote(name)} >/dev/null 2>&1; exec {shlex.join(run)}"


def manifest_digest(files: list[dict]) -> str:
    """What a complete volume holds, as one hash: each file's path, size and SHA-256."""
    rows = sorted((f["path"], f["size"], f["sha256"]) for f in files)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _open(transport, command: str):
    channel = transport.open_session(window_size=WINDOW_BYTES, max_packet_size=PACKET_BYTES)
    channel.settimeout(STALL_TIMEOUT_S)
    channel.exec_command(command)
    return channel


def _drain(channel, stream: str) -> str:
    """What is left on a channel's stdout or stderr, once it has exited."""
    read = channel.recv if stream == "out" else channel.recv_stderr
    parts = []
    while True:
        data = read(65536)
        if not data:
            return b"".join(parts).decode(errors="replace")
        parts.append(data)


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def read_manifest(transport, model: ModelConfig, rig: str) -> dict:
    """The source rig's complete manifest ({"files": [...]}), or RelayError saying why not."""
    channel = _open(transport, helper_command(model, "manifest", source_volume(model), ["manifest", "/v"], True))
    channel.settimeout(MANIFEST_TIMEOUT_S)
    out, err = _drain(channel, "out"), _drain(channel, "err")
    answer = _last_json(out)
    if channel.recv_exit_status() != 0 or not answer or answer.get("status") != "ok":
        why = (answer or {}).get("error") or (err or out).strip()[-400:] or "no answer"
        raise RelayError(f"{model.name}: weights from rig {rig}, volume {source_volume(model)}: {why}")
    return answer


def relay(source_transport, target_transport, model: ModelConfig, rig: str, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Copy the source rig's volume into the target's; the receiver's report (copied, received_bytes,
    rehashed_bytes, resent_bytes, ...) with the sender's read_bytes and the relay's seconds."""
    started = time.monotonic()
    manifest = read_manifest(source_transport, model, rig)
    receiver = _open(target_transport, helper_command(model, "receive", volume_name(model),
                                                      ["receive", "/v", str(chunk_bytes)], False))
    receiver.sendall(json.dumps({"files": manifest["files"]}).encode() + b"\n")
    plan = b""
    while not plan.endswith(b"\n"):
        data = receiver.recv(65536)
        if not data:
            break
        plan += data
    if not plan.endswith(b"\n"):
        raise RelayError(_failed(model, "the target rig's receiver", receiver, plan.decode(errors="replace")))
    sender = _open(source_transport, helper_command(model, "send", source_volume(model), ["send", "/v"], True))
    sender.sendall(plan)
    sender.shutdown_write()
    pumped = 0
    try:
        while True:
            data = sender.recv(PUMP_BYTES)
            if not data:
                break
            receiver.sendall(data)
            pumped += len(data)
    except OSError as exc:  # the receiver went away (killed, out of space): its own report says why
        sender.close()
        raise RelayError(_failed(model, "the target rig's receiver", receiver, "", f" ({exc})")) from None
    receiver.shutdown_write()
    sent = _last_json(_drain(sender, "err")) or {}
    if sender.recv_exit_status() != 0:
        receiver.close()
        raise RelayError(f"{model.name}: the sender on rig {rig} failed: {sent.get('error', 'no report')}. "
                         "Nothing was marked complete; deploy again and the copy resumes at its last chunk")
    out = _drain(receiver, "out")
    report = _last_json(out)
    if receiver.recv_exit_status() != 0 or not report or report.get("status") != "copied":
        raise RelayError(_failed(model, "the target rig's receiver", receiver, out))
    return {**report, "read_bytes": sent.get("read_bytes", 0), "pumped_bytes": pumped,
            "seconds": time.monotonic() - started}


def _failed(model: ModelConfig, who: str, channel, out: str, extra: str = "") -> str:
    out = out + _drain(channel, "out")
    answer = _last_json(out) or {}
    if answer.get("error") == "no space":
        why = (f"volume {volume_name(model)} is out of space: the copy needs {answer.get('needed_bytes', 0) / 1e9:.2f} GB "
               f"more (free: {answer.get('free_bytes', 0) / 1e9:.2f} GB)")
    else:
        why = answer.get("error") or _drain(channel, "err").strip()[-400:] or "it stopped without a report"
    return (f"{model.name}: {who} failed{extra}: {why}. Nothing was marked complete; deploy again and the copy "
            "resumes at its last chunk")


def verify_volume(transport, model: ModelConfig) -> str:
    """`--verify-weights` for a volume filled from another rig: the copier's verify on it (files that fail
    and the marker removed, so the relay that follows fetches them again); its report as one line."""
    channel = _open(transport, helper_command(model, "verify", volume_name(model), ["verify", "/v", "/v"], False))
    out = _drain(channel, "out")
    answer = _last_json(out) or {}
    code = channel.recv_exit_status()
    if code not in (0, 1) or not answer:
        raise RelayError(f"{model.name}: verifying volume {volume_name(model)} failed: "
                         f"{answer.get('error') or _drain(channel, 'err').strip()[-400:] or 'no report'}")
    if answer.get("status") == "verified":
        return f"{model.name}: volume {volume_name(model)} verified, {answer.get('files', 0)} files"
    return f"{model.name}: volume {volume_name(model)} has files that fail their check (copied again): " + \
        "; ".join(answer.get("reasons", {}).values())
