"""Start, reboot and inspect a simulated rig. TEST INFRASTRUCTURE.

A rig is a container of the image from image.py with systemd as PID 1, run the
way `--privileged` is avoided: `--cap-add SYS_ADMIN`, host networking, the
host's cgroups mounted read-only, tmpfs on /run, /run/lock and /tmp. sshd
listens on 127.0.0.1:<ssh_port> only, with a key made for the test run. A
container restart is a reboot: tmpfs is emptied, so the simulated GPU forgets
its settings, and systemd runs enabled units again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.types import Mount
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.simrig.bare_image import ensure_bare_image
from tests.simrig.image import ensure_image
from tests.simrig.weights import SIM_MODELS

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_ROOT = Path(os.environ.get("RIGKIT_STATE", REPO_ROOT / ".state"))
NVIDIA_SMI = Path(__file__).with_name("nvidia-smi")
CUDA_CHECKPOINT = Path(__file__).with_name("cuda-checkpoint")  # NVIDIA's tool, played on the stand-ins
LSPCI = Path(__file__).with_name("lspci")  # prints gpus.json's topology.lspci (ACS of the bridges)
FAKE_NVML = Path(__file__).with_name("pynvml.py")
FAKE_POWERSHELL = Path(__file__).with_name("powershell.exe")
SIM_CURVES = Path(__file__).parents[1] / "sim_curves.py"
FAKE_DOCKER_EXE = Path(__file__).with_name("docker.exe")
NFT = Path(__file__).with_name("nft")  # Debian's nft in a network namespace of the rig's own (see the file)


@dataclass(frozen=True)
class SimGpu:
    name: str = "NVIDIA GeForce RTX 4090"
    min_w: int = 150
    max_w: int = 450
    default_w: int = 450
    max_clock_mhz: int = 3105
    memory_mib: int = 49140
    ignores_clock_lock: bool = False  # firmware that runs past a lock (seen once at 2640 MHz)
    compute_cap: str = "8.9"  # as nvidia-smi's compute_cap reports it (Ada); an RTX 5090 says 12.0
    # NVML clock-offset range per domain (pynvml.py); None: the driver does not support offsets.
    offset_range_mhz: dict | None = field(default_factory=lambda: {"graphics": [-500, 1000], "memory": [-2000, 6000]})
    tune_profile: str | None = None  # a curve in tests/sim_curves.py: draw and clocks follow the settings
    held_at_w: float | None = None  # another firmware limit: draws at most this, reports the request as enforced
    context_draw_w: float | None = None  # idle draw added while memory is held on it (nvidia-smi's docstring)
    # The PCIe link as nvidia-smi reports it: the max the card and slot allow together, and the current
    # link (the generation drops at idle to save power; a riser shows as a narrow max width).
    pcie_gen_max: int = 4
    pcie_width_max: int = 16
    pcie_gen_current: int = 1
    pcie_width_current: int = 16


@dataclass
class SimRig:
    name: str = "rigkit-sim"
    ssh_port: int = 2222
    gpus: list[SimGpu] = field(default_factory=lambda: [SimGpu(), SimGpu()])
    ready_after_boot_s: float = 0.0
    driver_version: str = "580.95.05"  # the driver's user-space library, as nvidia-smi reports it
    module_version: str | None = None  # the loaded kernel module; differs after an upgrade without reboot
    # A bare rig (image.py's bare variant: no docker CLI, no Compose, no toolkit) whose only apt
    # source is `apt_sources` (a sources.list, e.g. a local test repository; see aptrepo.py).
    bare: bool = False
    apt_sources: str = ""
    # A host folder bind-mounted at the rig's /run/nvidia-sim, so that a process outside the rig
    # (the vLLM stand-in, a sibling container on the host's engine) can read the simulated GPUs'
    # settings and gpus.json. Emptied of settings at start and reboot, as the tmpfs would be.
    shared_gpu_dir: Path | None = None
    # sshd's MaxSessions (sessions at once on one connection); None: OpenSSH's default, 10.
    max_sessions: int | None = None
    # What `nvidia-smi topo -m` and `topo -p2p r` print ({"topo_m": text, "p2p_r": text}, e.g. a capture
    # from tests/data/topology); None: every pair across one host bridge (PHB), P2P "GNS" (GeForce cards).
    topology: dict | None = None
    # Host folders that get a copy of gpus.json on every write, without a restart (e.g. inside a model's
    # bind-mounted weights folder, where the vLLM stand-in image's torch stand-in reads `topology.p2p_faults`).
    gpu_config_copies: tuple[Path, ...] = ()
    # The engine's volumes folder in the rig at the path `docker volume inspect` reports, writable, as
    # root sees it on a real rig whose engine is local. False: not there, as for a user the folder
    # refuses or an engine in a VM (Docker Desktop); rigkit then reaches volumes through containers.
    engine_volumes: bool = True
    # The rig's memory as its /proc/meminfo says (a file mounted over it: runc allows that file, as LXCFS does):
    # a rig's host RAM, not this machine's, for what reads it (rigkit-ondemand: does a park's copy fit there)
    host_ram_gib: int = 128

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / "simrig" / self.name

    @property
    def windows_drive(self) -> Path:
        """The host folder that is the rig's `/C:/` tree: Windows' drive C: on the simulated Windows rig."""
        return self.state_dir / "windows-c"

    @property
    def ssh_key(self) -> Path:
        return ssh_keypair()

    def _client(self) -> docker.DockerClient:
        return docker.from_env()

    def write_gpu_config(self) -> None:
        """Change the simulated hardware; read by nvidia-smi on its next call."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = {"gpus": [vars(g) for g in self.gpus], "ready_after_boot_s": self.ready_after_boot_s,
                  "driver_version": self.driver_version, "module_version": self.module_version or self.driver_version,
                  "topology": self.topology}
        (self.state_dir / "gpus.json").write_text(json.dumps(config, indent=2))
        for folder in ([self.shared_gpu_dir] if self.shared_gpu_dir else []) + list(self.gpu_config_copies):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "gpus.json").write_text(json.dumps(config, indent=2))

    def _forget_gpu_settings(self) -> None:
        """What a reboot does to /run/nvidia-sim when it is a host folder rather than a tmpfs."""
        if self.shared_gpu_dir:
            for name in ("state.json", "calls.log", "lock"):
                (self.shared_gpu_dir / name).unlink(missing_ok=True)

    def start(self, log=print) -> "SimRig":
        """Start the rig fresh (an existing container of this name is replaced) and wait for boot."""
        client = self._client()
        image = ensure_bare_image(client, log=log) if self.bare else ensure_image(client, log=log)
        self.write_gpu_config()
        (self.state_dir / "sshd.conf").write_text(
            f"Port {self.ssh_port}\nListenAddress 127.0.0.1\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n" + (f"MaxSessions {self.max_sessions}\n" if self.max_sessions else "")
        )
        authorized = self.state_dir / "authorized_keys"
        authorized.write_text(Path(f"{self.ssh_key}.pub").read_text())
        authorized.chmod(0o600)
        self.remove()
        SIM_MODELS.mkdir(parents=True, exist_ok=True)
        # Windows' drive C: (the `/C:/` tree) is a host folder, so the host's dockerd can bind-mount
        # `C:\...` paths as Docker Desktop does (tests/simrig/docker.exe); a fresh rig, a fresh disk.
        shutil.rmtree(self.windows_drive, ignore_errors=True)
        self.windows_drive.mkdir(parents=True)
        (self.state_dir / "meminfo").write_text(simulated_meminfo(self.host_ram_gib))
        (self.state_dir / "windows.json").write_text(json.dumps({
            "drive_c": str(self.windows_drive), "nvml": str(FAKE_NVML), "gpus_json": str(self.state_dir / "gpus.json"),
        }))
        volumes_dir = f"{client.info()['DockerRootDir']}/volumes"
        mounts = {
            str(SIM_MODELS): (str(SIM_MODELS), "ro"),  # same path in the rig as on the host (see weights.py)
            "/sys/fs/cgroup": ("/sys/fs/cgroup", "ro"),
            "/var/run/docker.sock": ("/run/docker.sock", "rw"),
            str(NVIDIA_SMI): ("/usr/bin/nvidia-smi", "ro"),
            str(CUDA_CHECKPOINT): ("/usr/local/bin/cuda-checkpoint", "ro"),
            str(LSPCI): ("/usr/bin/lspci", "ro"),
            str(NFT): ("/usr/sbin/nft", "ro"),
            str(FAKE_NVML): ("/usr/lib/python3/dist-packages/pynvml.py", "ro"),
            str(SIM_CURVES): ("/usr/lib/python3/dist-packages/rigkit_sim_curves.py", "ro"),
            str(FAKE_POWERSHELL): ("/usr/local/bin/powershell.exe", "ro"),
            str(FAKE_DOCKER_EXE): ("/usr/local/bin/docker.exe", "ro"),
            str(self.state_dir / "windows.json"): ("/etc/rigkit-sim/windows.json", "ro"),
            str(self.state_dir / "gpus.json"): ("/etc/rigkit-sim/gpus.json", "ro"),
            str(self.state_dir / "meminfo"): ("/proc/meminfo", "ro"),
            str(self.state_dir / "sshd.conf"): ("/etc/ssh/sshd_config.d/rigkit-sim.conf", "ro"),
            str(authorized): ("/root/.ssh/authorized_keys", "ro"),
        }
        if self.engine_volumes:  # rigkit reads weights markers there; a relay reads and writes volumes there
            mounts[volumes_dir] = (volumes_dir, "rw")
        if self.shared_gpu_dir:
            self._forget_gpu_settings()
            mounts[str(self.shared_gpu_dir)] = ("/run/nvidia-sim", "rw")
        if self.bare:
            (self.state_dir / "sources.list").write_text(self.apt_sources)
            mounts[str(self.state_dir / "sources.list")] = ("/etc/apt/sources.list", "ro")
        client.containers.run(
            image,
            name=self.name,
            detach=True,
            network_mode="host",
            cap_add=["SYS_ADMIN"],
            tmpfs={"/run": "rw,mode=755", "/run/lock": "rw", "/tmp": "rw,mode=1777"},
            volumes={src: {"bind": dst, "mode": mode} for src, (dst, mode) in mounts.items()},
            # A Mount, not `volumes`: the target's colon would split a bind string.
            mounts=[Mount("/C:", str(self.windows_drive), type="bind")],
            environment={"container": "docker"},
            stop_signal="SIGRTMIN+3",
            labels={"rigkit.simrig": "1"},
        )
        self.wait_booted()
        return self

    def reboot(self) -> None:
        container = self._client().containers.get(self.name)
        if self.shared_gpu_dir:
            container.stop(timeout=20)
            self._forget_gpu_settings()
            container.start()
        else:
            container.restart(timeout=20)
        self.wait_booted()

    def remove(self) -> None:
        try:
            self._client().containers.get(self.name).remove(force=True)
        except docker.errors.NotFound:
            pass

    def exec(self, command: str, user: str = "root") -> tuple[int, str]:
        """Run a shell command in the rig directly (not over SSH): the independent read. Its output (stdout and
        stderr) goes to a file on the rig's root filesystem, read back through the engine's archive API: a
        `docker exec` stream on a loaded machine came back with the right exit code and no output at all (a
        refusal's message, a script's text: three tests of one fresh clone), which a file cannot lose."""
        container = self._client().containers.get(self.name)
        path = f"/var/tmp/rigkit-exec-{os.urandom(8).hex()}"  # not /tmp: a tmpfs, which the archive API cannot read
        result = container.exec_run(["/bin/sh", "-c", f"( {command}\n) > {path} 2>&1"], user=user)
        try:
            stream, _ = container.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
                member = archive.extractfile(archive.getmembers()[0])
                output = member.read() if member else b""
        except docker.errors.NotFound:  # the shell could not create it (it failed before the command ran)
            output = result.output or b""
        container.exec_run(["rm", "-f", path])
        return result.exit_code, output.decode(errors="replace")

    def system_state(self) -> str:
        return self.exec("systemctl is-system-running")[1].strip()

    def gpu_state(self) -> list[dict]:
        """The simulated GPUs' settings as stored, read past rigkit and nvidia-smi. Every writer replaces the
        file whole (os.replace), yet a `docker exec` of `cat` twice came back with exit 0 and no output on a
        loaded machine: the output lost on its way, not an empty file. A line after the file tells the two
        apart; a read that lost it is made again (5 at most), an empty file is not."""
        for _ in range(5):
            code, out = self.exec("cat /run/nvidia-sim/state.json && printf '\\n%s\\n' rigkit-read-whole")
            if code != 0:
                return [{"power_limit_w": g.default_w, "clock_lock": None, "persistence": False} for g in self.gpus]
            text, _, rest = out.rpartition("\nrigkit-read-whole")
            if rest.strip() == "" and out.rstrip().endswith("rigkit-read-whole"):
                return json.loads(text)
        raise RuntimeError(f"five reads of /run/nvidia-sim/state.json by docker exec lost their output; last: {out!r}")

    def gpu_calls(self) -> list[str]:
        """Every setting change the simulated nvidia-smi and NVML were asked for since boot."""
        code, out = self.exec("cat /run/nvidia-sim/calls.log")
        return out.splitlines() if code == 0 else []

    def wait_booted(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.system_state() if self._running() else "not running"
            if state in ("running", "degraded") and self._ssh_open():
                return
            time.sleep(0.5)
        raise TimeoutError(f"rig {self.name} did not boot in {timeout_s} s (systemd: {state!r})")

    def _running(self) -> bool:
        try:
            return self._client().containers.get(self.name).status == "running"
        except docker.errors.NotFound:
            return False

    def _ssh_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.ssh_port)) == 0


def ssh_keypair() -> Path:
    """A key made once per checkout for logging in to simulated rigs."""
    key = STATE_ROOT / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        private = ed25519.Ed25519PrivateKey.generate()
        key.write_bytes(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        key.chmod(0o600)
        public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        Path(f"{key}.pub").write_bytes(public + b" rigkit-simrig\n")
    return key


def simulated_meminfo(total_gib: int) -> str:
    """This machine's /proc/meminfo with the totals of a rig of `total_gib` GiB, 90% of it available."""
    total_kb = total_gib * 1024 * 1024
    said = {"MemTotal": total_kb, "MemFree": total_kb * 85 // 100, "MemAvailable": total_kb * 90 // 100}
    lines = []
    for line in Path("/proc/meminfo").read_text().splitlines():
        key = line.split(":", 1)[0]
        lines.append(f"{key + ':':<16}{said[key]:>8} kB" if key in said else line)
    return "\n".join(lines) + "\n"
