"""Role monitoring (Linux): the monitoring pack, when the rig file says `monitoring: {enabled: true}`.

Installs Debian's python3-prometheus-client (the exporter's library: Debian 12 refuses `pip install`
into the system Python, PEP 668) and, with `monitoring.prometheus` (the default), Debian's
`prometheus`, both without recommends (no node exporter). Then the exporter
(templates/monitoring/rigkit-exporter.py, a systemd service on 127.0.0.1:exporter_port, or on every
interface wanting the models' API key where the models serve there; a pynvml copy for rigs without
nvidia-ml-py), and Prometheus's config: a scrape of the exporter and of each model's vLLM /metrics
(on the gateway's rig: of every rig of the inventory, rigkit.monitoring.fleet), the keys of keyed
rigs in files only Prometheus reads, rigkit's recording rules (energy per output token, PSU
headroom), retention and a loopback-only listen address in /etc/default/prometheus. A changed
config is checked with the package's own `promtool check config` (rules included) before
Prometheus is restarted on it.

Off (the default): a rig with the exporter installed gets it stopped and removed; Prometheus, a
distribution package the owner may use otherwise, is left as it is (docs/monitoring.md).
Windows rigs are refused (not covered: docs/monitoring.md). Only what differs is changed: a second
deploy changes nothing.

Defaults: the rig file's `monitoring` (rigkit/config/schema.py MonitoringSpec). Where things go:
rigkit.rigside.names.
"""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files, server, systemd

from rigkit.plumbing import systemd_units as units
from rigkit.config.schema import RigConfig
from rigkit.plumbing.facts_once import Read, read_once
from rigkit.plumbing.files import FileStates, put
from rigkit.monitoring.files import exporter_settings, exporter_unit, prometheus_args, prometheus_config, recording_rules
from rigkit.monitoring.fleet import ScrapedRig, exporter_on_lan, own_rig
from rigkit.plumbing.private_file import private_file
from rigkit.plumbing.render import module_source, template_text
from rigkit.serving.api_key import SecretFileError, api_key_env_file, read_api_key
from rigkit.rigside.names import (
    EXPORTER_CONFIG_PATH,
    EXPORTER_PATH,
    EXPORTER_UNIT,
    EXPORTER_UNIT_PATH,
    MONITORING_NVML_PATH,
    PROMETHEUS_ARGS_PATH,
    PROMETHEUS_CONFIG_PATH,
    PROMETHEUS_KEYS_DIR,
    PROMETHEUS_RULES_PATH,
    PROMETHEUS_UNIT,
    PROMETHEUS_USER,
    SECRETS_ENV_FILE,
)
from rigkit.plumbing.systemd_units import UnitStates

# Defaults (the rig file's own are in MonitoringSpec)
EXPORTER_PACKAGES = ("python3-prometheus-client",)
PROMETHEUS_PACKAGES = ("prometheus",)
APT_TIMEOUT_S = 600
PROMTOOL_TIMEOUT_S = 60
SERVICE_TIMEOUT_S = 120
EXPORTER_FILES = (EXPORTER_PATH, EXPORTER_CONFIG_PATH, EXPORTER_UNIT_PATH, MONITORING_NVML_PATH)
PROMETHEUS_FILES = (PROMETHEUS_CONFIG_PATH, PROMETHEUS_RULES_PATH, PROMETHEUS_ARGS_PATH)
UNITS = (EXPORTER_UNIT, PROMETHEUS_UNIT)  # read in one command


def _key_files(rig: RigConfig, scraped: list[ScrapedRig] | None) -> tuple[str, ...]:
    if not rig.spec.monitoring.prometheus:
        return ()
    return tuple(r.key_file for r in (own_rig(rig) if scraped is None else scraped) if r.key_file)


def _paths(rig: RigConfig, scraped: list[ScrapedRig] | None) -> tuple[str, ...]:
    """The files the role puts, read in one command (with the models' key file: has it changed?)."""
    prometheus = PROMETHEUS_FILES + _key_files(rig, scraped) if rig.spec.monitoring.prometheus else ()
    return EXPORTER_FILES + prometheus + ((SECRETS_ENV_FILE,) if exporter_on_lan(rig) else ())


def monitoring_reads(rig: RigConfig, scraped: list[ScrapedRig] | None = None) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    if rig.spec.os != "linux":
        return []
    if not rig.spec.monitoring.enabled:
        return [(FileStates, {"paths": EXPORTER_FILES})]
    keys = [(FileStates, {"paths": (path,)}) for path in _key_files(rig, scraped)]  # private_file's
    return [(DebPackages, {}), (FileStates, {"paths": _paths(rig, scraped)}), *keys, (UnitStates, {"units": UNITS})]


@deploy("Monitoring")
def monitoring(rig: RigConfig, runtime_changes: list = (), scraped: list[ScrapedRig] | None = None,
               rigs: dict[str, RigConfig] | None = None) -> list:
    """`runtime_changes`: the rig-side runtime's operations (roles/rigside.py), which the exporter
    imports. `scraped`: on the gateway's rig, the fleet its Prometheus scrapes
    (rigkit.monitoring.fleet.fleet), with `rigs` the fleet's rig configs by inventory host (their
    keys); by default the rig's own exporter and models. Returns the operations that changed what
    the rig monitors."""
    spec = rig.spec.monitoring
    if rig.spec.os != "linux":
        if spec.enabled:  # the schema refuses it already; a RigConfig built in code gets the same answer
            raise DeployError(f"rig {rig.name} ({rig.file}): the monitoring pack runs on Linux rigs only; Windows rigs "
                              "are not covered (docs/monitoring.md): remove `monitoring` from the rig file")
        return []
    if not spec.enabled:
        return _remove()

    paths = _paths(rig, scraped)
    try:  # every key read before anything is changed: a bad key file stops the rig untouched
        keys = _scrape_keys(own_rig(rig) if scraped is None else scraped, {rig.name: rig} if rigs is None else rigs) \
            if spec.prometheus else {}
        lan_key = read_api_key(rig) if exporter_on_lan(rig) else None
    except SecretFileError as exc:
        raise DeployError(str(exc)) from None
    # Prometheus's files before its package: its first start (the package's postinst) is then already on
    # 127.0.0.1 with this config (apt keeps a conffile that is there: --force-confold), never on Debian's
    # default of every interface.
    prometheus_files = _prometheus_files(rig, paths, scraped) if spec.prometheus else []
    wanted = [*EXPORTER_PACKAGES, *(PROMETHEUS_PACKAGES if spec.prometheus else ())]
    installed = read_once(DebPackages) or {}
    missing = [p for p in wanted if p not in installed]
    if missing:
        apt.update(name="Update the package lists", _timeout=APT_TIMEOUT_S)
        apt.packages(name=f"Install {', '.join(missing)} (Debian's)", packages=missing, no_recommends=True,
                     _timeout=APT_TIMEOUT_S)
    else:
        host.noop(f"{', '.join(wanted)} installed")
    if keys:
        _key_files_put(keys, paths)

    script = put(name="Install the monitoring exporter", data=template_text("monitoring/rigkit-exporter.py"),
                 dest=EXPORTER_PATH, mode="755", batch=paths)
    nvml = put(name="Ship pynvml for the exporter (rigs without nvidia-ml-py)", data=module_source("pynvml"),
               dest=MONITORING_NVML_PATH, mode="644", batch=paths)
    settings = put(name="Exporter settings", data=exporter_settings(rig), dest=EXPORTER_CONFIG_PATH, mode="644",
                   batch=paths)
    unit = put(name="Exporter unit", data=exporter_unit(rig), dest=EXPORTER_UNIT_PATH, mode="644", batch=paths)
    systemd.daemon_reload(name="Reload systemd units (exporter)", _if=unit.did_change)
    started = units.service(name="Exporter running and enabled at boot", unit=EXPORTER_UNIT, batch=UNITS,
                            enabled=True, after=(unit,))
    changes = [script, settings]
    # systemd copies the key at the exporter's start: a key the serving role changes now needs a restart
    key_state = read_once(FileStates, paths=paths).get(SECRETS_ENV_FILE) if lan_key is not None else None
    new_key = lan_key is not None and (key_state or {}).get("sha256") != _sha256(api_key_env_file(lan_key))
    server.shell(name="Restart the exporter (new version, settings or key)", commands=[f"systemctl restart {EXPORTER_UNIT}"],
                 _if=lambda: (new_key or any(op.did_change() for op in (script, nvml, settings, unit, *runtime_changes)))
                 and not (started is not None and started.did_change()),
                 _timeout=SERVICE_TIMEOUT_S)
    if spec.prometheus:
        _prometheus_running(*prometheus_files)
    return changes + prometheus_files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _scrape_keys(scraped: list[ScrapedRig], rigs: dict[str, RigConfig]) -> dict[str, str]:
    """{key file on the rig: the key} for every keyed rig scraped, from its api_key_file here."""
    return {r.key_file: read_api_key(rigs[r.label]) for r in scraped if r.key_file}


def _key_files_put(keys: dict[str, str], paths: tuple[str, ...]) -> None:
    """Each keyed rig's key in a file only Prometheus reads (mode 600, its own), in a folder only it
    enters; its scrape config names the file (credentials_file), never the key."""
    owner = f"{PROMETHEUS_USER}:{PROMETHEUS_USER}"
    states = read_once(FileStates, paths=paths)
    if any((states.get(path) or {}).get("sha256") != _sha256(key.encode()) or states[path]["owner"] != owner
           for path, key in keys.items()):
        server.shell(name="Prometheus's key folder (Prometheus only)",
                     commands=[f"install -d -m 700 -o {PROMETHEUS_USER} -g {PROMETHEUS_USER} {PROMETHEUS_KEYS_DIR}"])
    for path, key in keys.items():
        private_file(name=f"Key for scraping {path.rsplit('/', 1)[-1][:-len('.key')]} (Prometheus only)", dest=path,
                     data=key.encode(), mode="600", owner=owner)


def _prometheus_files(rig: RigConfig, paths: tuple[str, ...], scraped: list[ScrapedRig] | None) -> list:
    config = put(name="Prometheus scrape config", data=prometheus_config(rig, scraped), dest=PROMETHEUS_CONFIG_PATH,
                 mode="644", batch=paths)
    rules = put(name="Prometheus recording rules (rigkit)", data=recording_rules(rig, scraped),
                dest=PROMETHEUS_RULES_PATH, mode="644", batch=paths)
    args = put(name="Prometheus listen address and retention", data=prometheus_args(rig), dest=PROMETHEUS_ARGS_PATH,
               mode="644", batch=paths)
    return [config, rules, args]


def _prometheus_running(config, rules, args) -> None:
    """A changed config is checked by promtool before Prometheus restarts on it: a bad one stops the
    deploy while the running Prometheus keeps the config it has."""
    changed = lambda: config.did_change() or rules.did_change() or args.did_change()  # noqa: E731
    server.shell(name="Check the Prometheus config and rules (promtool)",
                 commands=[f"promtool check config {PROMETHEUS_CONFIG_PATH}"], _if=changed,
                 _timeout=PROMTOOL_TIMEOUT_S)
    started = units.service(name="Prometheus running and enabled at boot", unit=PROMETHEUS_UNIT, batch=UNITS,
                            enabled=True, after=(config, rules, args))
    server.shell(name="Restart Prometheus on its new config", commands=[f"systemctl restart {PROMETHEUS_UNIT}"],
                 _if=lambda: changed() and not (started is not None and started.did_change()),
                 _timeout=SERVICE_TIMEOUT_S)


def _remove() -> list:
    states = read_once(FileStates, paths=EXPORTER_FILES)
    if not states:
        host.noop("monitoring is off (the rig file's monitoring.enabled) and not installed")
        return []
    systemd.service(name="Stop and disable the exporter", service=EXPORTER_UNIT, running=False, enabled=False,
                    _timeout=SERVICE_TIMEOUT_S)
    removed = [files.file(name=f"Remove {path}", path=path, present=False) for path in EXPORTER_FILES]
    systemd.daemon_reload(name="Reload systemd units (exporter removed)")
    return removed
