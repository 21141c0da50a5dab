"""Weights from another rig's volume (`weights.source: {rig: NAME}`): a streamed relay through the
control machine, between two SSH channels the deploy already trusts.

On the source rig the copier's `send` reads its volume, on the target rig `receive` writes the
target volume: each runs as the SSH session's own python3 on the volume's folder where that
session can reach it (root on a rig whose engine is local), else in a helper container that
mounts the volume (Docker Desktop, a user without access to the engine's folder). The folder is
the fast path: a container's stdin and stdout cross dockerd, which cost most of the relay's CPU
(bench/weights_copy.py --rig-to-rig). The controller writes the
source's manifest into the receiver, hands the receiver's plan (which files, from which byte) to
the sender, and joins the sender's stdout to the receiver's stdin: nothing is staged on the
controller's disk, and the rigs need no SSH trust between them. The receiver fsyncs and journals
fixed-size chunks (WEIGHTS_CHUNK_BYTES), so a copy cut off resumes at its last journaled chunk.

The join, the relay's one transport: two OpenSSH `ssh` reaching the rigs as the deploy's connections
do (rigkit/plumbing/ssh.py openssh_command), the sender's writing into a pipe the receiver's reads, so
no byte crosses Python. (The deploy's paramiko channels, pumped here, carried 0.26-0.67 of what this
pipe does on the same machine: Python handles each 32 KiB packet twice; docs/weights.md.) An
inventory OpenSSH cannot follow (a password, paramiko's own arguments) is refused before any rig is
reached (rigkit/config/rig_sources.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shlex
import subprocess
import time

from rigkit.config.schema import ModelConfig
from rigkit.weights.copier import copier_source
from rigkit.plumbing.rig_reads import DOCKER_S, bounded
from rigkit.rigside.names import WEIGHTS_HELPER_LABEL, volume_name, weights_helper_name

MANIFEST_TIMEOUT_S = 120  # one container start and a small JSON file
STALL_TIMEOUT_S = 300  # no byte in either direction for this long: the copy is given up (and resumes next time)


class RelayError(Exception):
    pass


def source_volume(model: ModelConfig) -> str:
    """The volume on the source rig: `weights.source.volume`, else the model's own volume name there."""
    return model.spec.weights.source.volume or volume_name(model)


def helper_command(model: ModelConfig, side: str, volume: str, args: list[str], read_only: bool) -> str:
    """A shell command on a rig running the copier with `args` ("/v" standing for the volume's folder):
    on the volume's folder itself where this shell can read it (`read_only`) or write it, else in a
    container with stdin attached, no network, the volume at /v, replacing any earlier helper of this
    side. One writer at a time either way: the copier's receive and verify lock the volume."""
    image = model.spec.weights.helper_image or model.spec.image
    name = weights_helper_name(model, side)
    docker = bounded("docker", DOCKER_S)  # the engine's quick questions; the copy itself has its stall rule
    mount = f"type=volume,source={volume},target=/v" + (",readonly" if read_only else "")
    run = shlex.join(["docker", "run", "--rm", "-i", "--name", name, "--network", "none", "--pull", "never",
                      "--label", f"{WEIGHTS_HELPER_LABEL}={model.name}", "--mount", mount, "--entrypoint", "python3",
                      image, "-c"])
    # The copier's source once, in $s (it is ~45 KB; one argument may be 128 KiB on Linux).
    args_direct = " ".join('"$mp"' if arg == "/v" else shlex.quote(arg) for arg in args)
    # A source volume that is not there is an error, never created empty; a target volume is made
    # here (as `docker run --mount` would) so that its folder exists for the direct path.
    if read_only:
        prepare = (f"{docker} volume inspect {shlex.quote(volume)} >/dev/null 2>&1 || "
                   f"{{ echo {shlex.quote(json.dumps({'status': 'error', 'error': f'no volume {volume} on that rig'}))}; exit 2; }}; ")
    else:
        prepare = f"{docker} volume create {shlex.quote(volume)} >/dev/null 2>&1; "
    access = "-r" if read_only else "-w"
    return (f"s={shlex.quote(copier_source())}; {prepare}{volume_folder(volume)}"
            f'if [ -n "$mp" ] && [ -d "$mp" ] && [ {access} "$mp" ] && command -v python3 >/dev/null; then '
            f'umask 022; exec python3 -c "$s" {args_direct}; fi; '  # files as the container makes them
            f'{docker} rm -f {shlex.quote(name)} >/dev/null 2>&1; exec {run} "$s" {shlex.join(args)}')


def volume_folder(volume: str) -> str:
    """Shell that sets $mp to the rig's folder of the Docker volume `volume`, or to "" where the rig's shell cannot
    use it: the folder only of a local volume without mount options (one of another driver, or mounted from NFS,
    a tmpfs or a bind, is mounted only while a container uses it, and its folder is then empty)."""
    return (f"info=$({bounded('docker', DOCKER_S)} volume inspect --format "
            f"'{{{{.Driver}}}}:{{{{len .Options}}}}:{{{{.Mountpoint}}}}' {shlex.quote(volume)} 2>/dev/null); "
            'case "$info" in local:0:/*) mp=${info#local:0:} ;; *) mp= ;; esac; ')


def manifest_digest(files: list[dict]) -> str:
    """What a complete volume holds, as one hash: each file's path, size and SHA-256."""
    rows = sorted((f["path"], f["size"], f["sha256"]) for f in files)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _open(transport, command: str):
    channel = transport.open_session()
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


def relay(source_transport, model: ModelConfig, rig: str, chunk_bytes: int,
          openssh: tuple[list[str], list[str]]) -> dict:
    """Copy the source rig's volume into the target's; the receiver's report (copied, received_bytes,
    rehashed_bytes, resent_bytes, volume_path, ...) with the sender's read_bytes and folder (sent_from:
    "/v" in a helper container) and the relay's seconds. The manifest is read over the deploy's own
    connection to the source (`source_transport`); the stream goes through `openssh`, the `ssh` commands
    reaching the source and the target rig (rigkit.plumbing.ssh.openssh_command)."""
    started = time.monotonic()
    manifest = read_manifest(source_transport, model, rig)
    receive = helper_command(model, "receive", volume_name(model), ["receive", "/v", str(chunk_bytes)], False)
    send = helper_command(model, "send", source_volume(model), ["send", "/v"], True)
    line = json.dumps({"files": manifest["files"]}).encode() + b"\n"
    report, sent = join_rigs(openssh, model, rig, line, send, receive)
    return {**report, "read_bytes": sent.get("read_bytes", 0), "sent_from": sent.get("volume_path", ""),
            "seconds": time.monotonic() - started}


END_OF_STREAM = json.dumps({"end": True}).encode() + b"\n"  # what the sender ends its stream with
SENDER_GRACE_S = 30  # once the receiver has ended: the sender's last report, else it is killed


def _split_plan(answer: bytes) -> tuple[bytes | None, bytes]:
    """(the receiver's plan line, what came after it) from its first output; None for the plan when
    its first line is not a plan ({"files": [...]}), e.g. its error report."""
    first, newline, rest = answer.partition(b"\n")
    try:
        value = json.loads(first)
    except ValueError:
        return None, answer
    if not newline or not isinstance(value, dict) or "status" in value or not isinstance(value.get("files"), list):
        return None, answer
    return first + newline, rest


def join_rigs(openssh, model, rig, line, send, receive) -> tuple[dict, dict]:
    """The receiver's `ssh` reads a pipe; the controller writes the manifest into it, reads the plan,
    then starts the sender's `ssh` writing its stdout into the same pipe. Every wait is bounded: the
    plan by STALL_TIMEOUT_S; the copy by the receiver's own rule (it gives up after STALL_TIMEOUT_S
    without a byte) and `ssh`'s keepalives (a lost rig: STALL_TIMEOUT_S); the sender, once the
    receiver has ended, by SENDER_GRACE_S, then it is killed."""
    source_ssh, target_ssh = openssh
    read_end, write_end = os.pipe()
    _widen(write_end)
    try:
        receiver = subprocess.Popen([*target_ssh, receive], stdin=read_end, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
    finally:
        os.close(read_end)
    sender, sent_err = None, ""
    try:
        try:
            _write_all(write_end, line)
            answer = _read_line(receiver.stdout, STALL_TIMEOUT_S)
        except OSError:
            answer = b""
        plan, rest = _split_plan(answer)
        if plan is None or not json.loads(plan)["files"]:
            if plan is not None:  # nothing to send (or the receiver refused): no sender at all
                try:
                    _write_all(write_end, END_OF_STREAM)
                except OSError:  # the receiver has ended already (no space): its report says why
                    pass
            os.close(write_end)
            write_end = -1
            out, err = _finish(receiver, SENDER_GRACE_S)
            rest = answer if plan is None else rest  # a refusal's first line is its report
        else:
            sender = subprocess.Popen([*source_ssh, send], stdin=subprocess.PIPE, stdout=write_end,
                                      stderr=subprocess.PIPE)
            os.close(write_end)  # the sender's `ssh` holds the pipe's writing end now: its exit ends the stream
            write_end = -1
            try:
                sender.stdin.write(plan)
                sender.stdin.close()
            except OSError:  # its `ssh` ended at once (refused, unknown host key): its stderr says why
                pass
            sender.stdin = None  # closed: communicate() below only reads its stderr
            out, err = _finish(receiver)
            sent_err = _finish(sender, SENDER_GRACE_S)[1]
        out = rest.decode(errors="replace") + out
    finally:
        if write_end >= 0:
            os.close(write_end)
        for proc in (sender, receiver):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    sent = _last_json(sent_err) or {}
    report = _last_json(out) or {}
    if report.get("status") == "copied" and receiver.returncode == 0:
        return report, sent  # every file proven against the source's manifest: the copy is complete
    # Which side broke: a receiver whose stream was cut off blames the sender; a receiver that failed
    # otherwise (killed, out of space) is the cause, and the sender's broken pipe only its echo.
    if sender is not None and "the copy was cut off" in str(report.get("error", "")) and sender.returncode != 0:
        raise RelayError(_sender_failed(model, rig, sent, sent_err))
    raise RelayError(_failed(model, "the target rig's receiver", out, err, receiver.returncode))


def _widen(fd: int) -> None:
    """A pipe's buffer to 1 MiB (Linux): the manifest is written into it before the receiver reads, and
    a blocking write would hold up every other host's deploy (pyinfra runs them in one process)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1024 * 1024)
    except (ImportError, OSError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_line(stream, timeout_s: float) -> bytes:
    """A process's stdout up to and including its first line (and whatever came with it), waiting
    at most `timeout_s` for each piece."""
    fd, answer = stream.fileno(), b""
    while b"\n" not in answer:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            break
        data = os.read(fd, 65536)
        if not data:
            break
        answer += data
    return answer


def _finish(proc: subprocess.Popen, timeout_s: float | None = None) -> tuple[str, str]:
    """A process's stdout and stderr once it has exited (it exits when its stdin ends, or by the
    stall rule); killed after `timeout_s` when given."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


def _sender_failed(model: ModelConfig, rig: str, sent: dict, err: str = "") -> str:
    why = sent.get("error") or err.strip()[-400:] or "no report"
    return (f"{model.name}: the sender on rig {rig} failed: {why}. Nothing was marked complete; deploy again and "
            "the copy resumes at its last chunk")


def _failed(model: ModelConfig, who: str, out: str, err: str, code: int | None = None) -> str:
    answer = _last_json(out) or {}
    if answer.get("error") == "no space":
        why = (f"volume {volume_name(model)} is out of space: the copy needs {answer.get('needed_bytes', 0) / 1e9:.2f} GB "
               f"more (free: {answer.get('free_bytes', 0) / 1e9:.2f} GB)")
    else:
        # Its exit status where it said nothing else: 255 is ssh's own failure, 125 `docker run`'s, 128+N a signal.
        why = answer.get("error") or err.strip()[-400:] or f"it stopped without a report (exit status {code})"
    return (f"{model.name}: {who} failed: {why}. Nothing was marked complete; deploy again and the copy "
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
