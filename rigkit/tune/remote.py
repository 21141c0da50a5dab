"""The rig side of a sweep, reached over SSH: follows `rigkit.tune.sweep.Rig`.

Ships three files to a root-only folder on the rig (the helper `rigkit.tune.rig_helper`, the NVML
sampler and a pynvml copy for rigs without nvidia-ml-py), then per cell: `apply` (which arms the
dead man's switch first), read back what the driver enforces, and measure through an SSH port
forward with the sampler running on the rig. `restore` puts the offsets found before the sweep
back, restarts the declared GPU policy unit and disarms the switch.
"""

from __future__ import annotations

import io
import json
import shlex
import time
from pathlib import Path

import paramiko

from rigkit.config.inventory import SshTarget
from rigkit.plumbing.render import module_source
from rigkit.rigside import sampler
from rigkit.rigside.names import GPU_POLICY_UNIT, RUN_DIR, TUNE_HELPER_PATH, TUNE_NVML_DIR, TUNE_SAMPLER_PATH
from rigkit.plumbing.ssh import named_connect_error, quiet_paramiko
from rigkit.plumbing.ssh_forward import forward
from rigkit.tune.cells import Cell, Enforced, Figures
from rigkit.tune.measure import BenchSettings, MeasurementError, measure_once
from rigkit.tune.rig_helper import DEADMAN_UNIT
from rigkit.tune.safety import OffsetRange

COMMAND_TIMEOUT_S = 60
# Prefer the rig's own nvidia-ml-py; fall back to the copy shipped here.
PY = sampler.python_with_nvml(TUNE_NVML_DIR)


class RigError(Exception):
    """The rig did something the sweep cannot go on from; str() says what."""


def connect(target: SshTarget, timeout_s: float = 10.0) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    if target.known_hosts_file and target.known_hosts_file != "/dev/null":
        client.load_host_keys(str(Path(target.known_hosts_file).expanduser()))
    else:
        client.load_system_host_keys()
    trusting = target.strict_host_key_checking in ("off", "no", "accept-new")
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if trusting else paramiko.RejectPolicy())
    quiet_paramiko()
    try:
        client.connect(target.hostname, port=target.port, username=target.user, key_filename=target.key_file,
                       timeout=timeout_s, banner_timeout=timeout_s, auth_timeout=timeout_s)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        client.close()
        named = named_connect_error(f"{target.hostname}:{target.port}", timeout_s, exc)
        raise RigError(named or f"cannot reach {target.user + '@' if target.user else ''}{target.hostname}:"
                                f"{target.port} over SSH: {exc}") from None
    client.get_transport().sock.setsockopt(6, 1, 1)  # TCP_NODELAY (rigkit/plumbing/ssh.py says why)
    return client


class Shell:
    def __init__(self, client: paramiko.SSHClient):
        self.client = client

    def run(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
        try:
            _, stdout, stderr = self.client.exec_command(command, timeout=timeout_s)
            out, err = stdout.read().decode(), stderr.read().decode()
        except (OSError, paramiko.SSHException) as exc:  # socket.timeout is an OSError
            raise RigError(f"on the rig, `{command[:200]}` did not finish within {timeout_s:.0f} s or the "
                           f"connection failed: {exc or type(exc).__name__}") from None
        if check and stdout.channel.recv_exit_status() != 0:
            raise RigError(f"on the rig, `{command}` failed: {(err or out).strip()[-800:]}")
        return out

    def put(self, data: bytes, path: str, mode: int) -> None:
        with self.client.open_sftp() as sftp:
            with sftp.open(path + ".tmp", "wb") as f:
                f.write(data)
            sftp.chmod(path + ".tmp", mode)
            sftp.posix_rename(path + ".tmp", path)

    def get(self, path: str) -> bytes:
        buffer = io.BytesIO()
        with self.client.open_sftp() as sftp:
            sftp.getfo(path, buffer)
        return buffer.getvalue()


def install(shell: Shell) -> None:
    shell.run(f"mkdir -p -m 755 {TUNE_NVML_DIR} && mkdir -p -m 700 {RUN_DIR}")
    for module, path in (("rigkit.tune.rig_helper", TUNE_HELPER_PATH), ("rigkit.verify.telemetry", TUNE_SAMPLER_PATH), ("pynvml", f"{TUNE_NVML_DIR}/pynvml.py")):
        shell.put(module_source(module), path, 0o755 if path != f"{TUNE_NVML_DIR}/pynvml.py" else 0o644)


class RemoteSampling:
    """The NVML sampler on the rig (as roles/verify.py runs it), for one measurement."""

    def __init__(self, shell: Shell, gpus: tuple[int, ...]):
        self.shell, self.gpus = shell, gpus
        self.out = f"{RUN_DIR}/tune-telemetry.json"
        self.spent_s = 0.0  # in start() and stop(): the SSH round trips around a measurement

    def start(self) -> None:
        started = time.monotonic()
        try:
            self._start()
        finally:
            self.spent_s += time.monotonic() - started

    def stop(self) -> dict:
        started = time.monotonic()
        try:
            return self._stop()
        finally:
            self.spent_s += time.monotonic() - started

    def _start(self) -> None:
        self.pid = self.shell.run(sampler.start_command(TUNE_SAMPLER_PATH, TUNE_NVML_DIR, self.gpus, sampler.SAMPLE_HZ, self.out,
                                                        sampler.MAX_S)).strip().splitlines()[-1]
        self.shell.run(sampler.started_command(self.pid, self.out, sampler.START_WAIT_S))

    def _stop(self) -> dict:
        self.shell.run(sampler.stop_command(self.pid, self.out))
        return json.loads(self.shell.get(self.out))


class SshTuneRig:
    """`Rig` for one model's GPUs on a Linux rig whose GPU policy unit rigkit installed."""

    def __init__(self, client: paramiko.SSHClient, gpus: tuple[int, ...], port: int, model: str,
                 bench: BenchSettings, deadman_s: int, start: Cell):
        self.shell = Shell(client)
        self.client, self.gpus, self.port, self.model, self.bench = client, gpus, port, model, bench
        self.deadman_s, self.start = deadman_s, start
        self.last_apply: dict | None = None
        self.restored: dict | None = None
        self.spent_applying_s = 0.0  # apply: arm the switch, set, read back
        self.spent_measuring_s = 0.0  # measure: port forward, sampler start/stop, the benchmark
        self.spent_sampling_s = 0.0  # of which the sampler's start and stop

    def _helper(self, action: str, *args: str) -> dict:
        gpus = ",".join(str(i) for i in self.gpus)
        out = self.shell.run(f"{PY} {TUNE_HELPER_PATH} {action} --gpus {gpus} " + " ".join(shlex.quote(a) for a in args))
        return json.loads(out.strip().splitlines()[-1])

    def check_ready(self) -> None:
        state = self.shell.run(f"systemctl is-enabled {GPU_POLICY_UNIT}", check=False).strip()
        if state != "enabled":
            raise RigError(f"the GPU policy unit {GPU_POLICY_UNIT} is not installed and enabled on the rig ({state or 'absent'}): "
                           "it is what the dead man's switch restores; deploy the rig first (rigkit deploy)")

    def read(self) -> dict:
        return self._helper("read")

    def offset_ranges(self, reading: dict) -> tuple[OffsetRange, ...]:
        return tuple(OffsetRange(g["index"], domain, o["min"], o["max"])
                     for g in reading["gpus"] for domain, o in g["offsets"].items() if o is not None)

    # -- the Rig protocol ------------------------------------------------
    def apply(self, cell: Cell) -> None:
        started = time.monotonic()
        lock = "none" if cell.clock_lock_mhz is None else str(cell.clock_lock_mhz)
        self.last_apply = self._helper(
            "apply", "--power-limit", str(cell.power_limit_w), "--lock", lock, "--mem", str(cell.mem_offset_mhz),
            "--core", str(cell.core_offset_mhz), "--deadman-s", str(self.deadman_s),
            "--restore-mem", str(self.start.mem_offset_mhz), "--restore-core", str(self.start.core_offset_mhz),
            "--policy-unit", GPU_POLICY_UNIT)
        self.spent_applying_s += time.monotonic() - started

    def read_enforced(self) -> tuple[Enforced, ...]:
        reading = self.last_apply or self.read()
        return tuple(Enforced(g["index"], g["enforced_w"],
                              g["offsets"]["memory"]["now"] if g["offsets"]["memory"] else None,
                              g["offsets"]["graphics"]["now"] if g["offsets"]["graphics"] else None)
                     for g in reading["gpus"])

    def apply_errors(self) -> list[str]:
        return list((self.last_apply or {}).get("errors", []))

    def measure(self, cell: Cell) -> Figures:
        started, sampling = time.monotonic(), RemoteSampling(self.shell, self.gpus)
        try:
            with forward(self.client.get_transport(), self.port) as local_port:
                figures = measure_once(f"http://127.0.0.1:{local_port}", self.model, sampling, self.bench)
            # A switch that fired mid-measurement put the declared policy back under the load: the
            # reading is of no one setting, and must not be booked to the cell.
            armed = self.shell.run(f"systemctl is-active {DEADMAN_UNIT}.timer", check=False).strip()
            if armed != "active":
                raise MeasurementError(
                    f"the dead man's switch fired during the measurement of {cell.label()} (timer {armed or 'gone'}): "
                    f"--deadman-s {self.deadman_s} is shorter than one measurement; raise it")
            return figures
        finally:
            self.spent_measuring_s += time.monotonic() - started
            self.spent_sampling_s += sampling.spent_s

    def restore(self) -> None:
        self.restored = self._helper("restore", "--mem", str(self.start.mem_offset_mhz),
                                     "--core", str(self.start.core_offset_mhz), "--policy-unit", GPU_POLICY_UNIT)
        self.last_apply = None
