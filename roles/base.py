"""Role base (Linux): what a rig needs under rigkit, on a bare Debian or Ubuntu with only the
NVIDIA driver installed. Runs after the preflight, before the GPU policy.

1. Docker Engine and the Compose v2 plugin: from the distribution (`base.docker_source: distro`,
   the default: Ubuntu docker.io + docker-compose-v2, Debian 13+ docker.io + docker-compose) or
   from Docker's apt repository (`docker`: docker-ce, docker-ce-cli, containerd.io,
   docker-compose-plugin; Debian 12 needs this, its Compose is v1);
2. the NVIDIA Container Toolkit from NVIDIA's apt repository (repository line and key as NVIDIA
   documents them; both overridable for a mirror: `base.nvidia_repo`);
3. `nvidia-ctk runtime configure --runtime=docker` when daemon.json lacks the nvidia runtime,
   and a Docker restart only then;
4. nvidia-persistenced enabled and running;
5. the driver's installed packages held with `apt-mark hold` (`base.hold_driver: false` unholds).
Every step reads a fact first, so a second deploy changes nothing. The driver itself is not
installed: without it the role stops with instructions. `base.install: false` skips all of it.

Defaults: the paths in rigkit.base.packages; the repositories in rigkit.config.schema.BaseSpec.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.deb import DebArch, DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from rigkit.base.facts import AptHolds, SystemdUnitFile, TextFile
from rigkit.base.packages import (
    DAEMON_JSON,
    DOCKER_KEYRING,
    DOCKER_LIST,
    NVIDIA_KEYRING,
    NVIDIA_LIST,
    PREREQUISITES,
    TOOLKIT_PACKAGES,
    BaseError,
    Distro,
    docker_list,
    docker_packages,
    docker_repo,
    driver_packages,
    engine_conflict,
    has_nvidia_runtime,
    nvidia_list,
)
from rigkit.config.schema import RigConfig
from rigkit.preflight.checks import INSTALL_DRIVER, DriverState

PERSISTENCED = "nvidia-persistenced.service"
DOCKER = "docker.service"
# Bounds on the slow steps, so a stuck mirror or daemon fails the deploy instead of hanging it.
APT_TIMEOUT_S = 1800  # package lists and installs (Docker + the toolkit is several hundred MB)
KEY_FETCH_TIMEOUT_S = 120  # one signing key, with curl's retries
SERVICE_TIMEOUT_S = 180  # systemctl start/enable/restart of Docker or nvidia-persistenced


@deploy("Base")
def base(rig: RigConfig, driver: DriverState) -> list:
    """`driver`: what the preflight read. Returns the operations whose change restarted Docker."""
    spec = rig.spec.base
    if not driver.installed:
        raise DeployError(f"rig {rig.name} ({rig.file}), nothing was changed: {INSTALL_DRIVER}")
    if not spec.install:
        host.noop("base.install is false: Docker, the NVIDIA Container Toolkit and driver holds are left as they are")
        return []
    meta = host.get_fact(LinuxDistribution) or {}
    release = meta.get("release_meta") or {}
    distro = Distro(str(release.get("ID", meta.get("name") or "")).lower(), meta.get("major"),
                    str(release.get("VERSION_CODENAME", "")))
    installed = set(host.get_fact(DebPackages) or {})
    try:
        engine = docker_packages(distro, spec.docker_source)
        if conflict := engine_conflict(installed, spec.docker_source):
            raise BaseError(conflict)
        sources = {NVIDIA_LIST: (nvidia_list(spec.nvidia_repo), spec.nvidia_repo.key_url, NVIDIA_KEYRING)}
        if spec.docker_source == "docker":
            repo = docker_repo(spec, distro)
            sources[DOCKER_LIST] = (docker_list(repo, host.get_fact(DebArch), distro.codename), repo.key_url,
                                    DOCKER_KEYRING)
    except BaseError as exc:
        raise DeployError(f"rig {rig.name} ({rig.file}), nothing was changed: {exc}") from None
    if not host.get_fact(SystemdUnitFile, unit=PERSISTENCED):
        raise DeployError(
            f"rig {rig.name} ({rig.file}), nothing was changed: {PERSISTENCED} is not installed: install the "
            "driver's persistence daemon (Debian: `apt install nvidia-persistenced`; Ubuntu: it comes with "
            "nvidia-compute-utils-<driver branch>), then deploy again"
        )

    if missing := [p for p in PREREQUISITES if p not in installed]:
        apt.packages(name=f"Install {', '.join(missing)} (to fetch repository keys)", packages=missing, update=True,
                     _timeout=APT_TIMEOUT_S)
    changed_sources = []
    for list_path, (line, key_url, keyring) in sources.items():
        if host.get_fact(File, path=keyring) is None:
            changed_sources.append(server.shell(
                name=f"Fetch the signing key {key_url}",
                commands=[f"install -d -m 755 {shlex.quote(keyring.rsplit('/', 1)[0])} && "
                          f"curl -fsSL --retry 3 --max-time 30 -o {shlex.quote(keyring + '.part')} {shlex.quote(key_url)} && "
                          f"chmod 644 {shlex.quote(keyring + '.part')} && "
                          f"mv {shlex.quote(keyring + '.part')} {shlex.quote(keyring)}"],
                _timeout=KEY_FETCH_TIMEOUT_S,
            ))
        changed_sources.append(files.put(name=f"apt source {list_path}", src=StringIO(line), dest=list_path,
                                         mode="644"))

    wanted = [*engine, *TOOLKIT_PACKAGES]
    missing = [p for p in wanted if p not in installed]
    apt.update(name="Update the package lists",
               _if=lambda: bool(missing) or any(op.did_change() for op in changed_sources), _timeout=APT_TIMEOUT_S)
    apt.packages(name=f"Install {', '.join(wanted)}", packages=wanted, _timeout=APT_TIMEOUT_S)

    configured = None
    if not has_nvidia_runtime(host.get_fact(TextFile, path=DAEMON_JSON)):
        configured = server.shell(name="Add the nvidia runtime to Docker (nvidia-ctk runtime configure)",
                                  commands=["nvidia-ctk runtime configure --runtime=docker"], _timeout=SERVICE_TIMEOUT_S)
    systemd.service(name="Docker running and enabled at boot", service=DOCKER, running=True, enabled=True,
                    _timeout=SERVICE_TIMEOUT_S)
    restarted = server.shell(name="Restart Docker on its new runtime", commands=[f"systemctl restart {DOCKER}"],
                             _if=lambda: bool(configured and configured.did_change()), _timeout=SERVICE_TIMEOUT_S)
    systemd.service(name="nvidia-persistenced running and enabled at boot", service=PERSISTENCED,
                    running=True, enabled=True, _timeout=SERVICE_TIMEOUT_S)
    _hold(driver_packages(installed), host.get_fact(AptHolds) or set(), spec.hold_driver)
    return [restarted]


def _hold(packages: list[str], held: set[str], hold: bool) -> None:
    if not packages:
        logger.warning(f"{host.print_prefix}no NVIDIA driver packages found (a driver from NVIDIA's .run "
                       "installer?): nothing to hold; apt does not upgrade such a driver")
        return
    change = [p for p in packages if (p not in held) == hold]
    verb = "hold" if hold else "unhold"
    if not change:
        host.noop(f"driver packages already {'held' if hold else 'not held'}: {', '.join(packages)}")
        return
    server.shell(name=f"apt-mark {verb} the NVIDIA driver: {', '.join(change)}",
                 commands=[f"apt-mark {verb} {' '.join(shlex.quote(p) for p in change)}"], _timeout=APT_TIMEOUT_S)
