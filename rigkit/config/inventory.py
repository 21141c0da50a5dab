"""Where pyinfra's inventory meets rigkit's config: the only module that reads `host.data`.

Each inventory host names its rig file (`rig_file`) and may override where the catalog
and results live; `rigkit deploy` / `rigkit verify` pass run switches as `--data`. This
module turns all of that into validated objects (`RigConfig`, `RunOptions`) that the
roles receive, and is the one place where `ConfigError` becomes pyinfra's error type, so
a bad file stops the run with its message before any operation runs on any rig.

Every default below is documented in docs/configuration.md.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.config.names import NAME_PATTERN
from rigkit.config.schema import GatewaySpec, RigConfig

# Defaults for every rig (group_data/all.py shows them; a host's own data overrides them).
from rigkit.config.defaults import DEFAULT_CATALOG_DIR, DEFAULT_RESULTS_DIR  # noqa: E402,F401 (re-exported)
from rigkit.config.defaults import WEIGHTS_CHUNK_BYTES, WEIGHTS_CHUNK_BYTES_RANGE  # noqa: E402
# The gateway (docs/gateway.md): the one host with `gateway` data runs it; its fields and their defaults
# are GatewaySpec's (rigkit/config/schema.py). `gateway_address` (any host, default: none) is where the
# gateway reaches that rig's models when not at the rig's own address.
GATEWAY_KEY = "gateway"
GATEWAY_ADDRESS_KEY = "gateway_address"
# The gateway's `health_check_interval_s` when its entry leaves it out: LiteLLM checks each replica with a
# 1-token completion this often and routes around one that fails (docs/gateway.md, "Health checks").
# 30 s: the cooldown after a failed request is 30 s too, so a dead replica nobody asked is found about as
# fast as one a client hit; one tiny request per replica per 30 s costs a serving GPU nothing measurable.
GATEWAY_HEALTH_CHECK_INTERVAL_S = 30


class RigConfigError(PyinfraError):
    """A rig's configuration is invalid; raised before any change is made."""


@dataclass(frozen=True)
class RunOptions:
    """Switches of one run, the same for every rig of it."""

    results_dir: Path = Path(DEFAULT_RESULTS_DIR)
    verify_always: bool = False  # `rigkit verify`: benchmark even when the deploy changed nothing
    verify_never: bool = False  # `rigkit deploy --no-verify`: skip verification (run `rigkit verify` later)
    verify_weights: bool = False  # `rigkit deploy --verify-weights`: re-hash every weights volume
    status_dir: Path | None = None  # `rigkit status`: where each rig's status document is left
    status_inventory: str = "INVENTORY"  # `rigkit status`: the inventory, as repair commands spell it
    accept_slower: frozenset[str] = frozenset()  # `rigkit deploy --accept-slower MODEL`: the gate waives speed
    rollout_outcome: Path | None = None  # `rigkit rollout`: where a refused gate says what the rig serves now
    # `rigkit_weights_chunk_bytes`: a rig-to-rig copy's unit of fsync, journal and resume (tests take small ones)
    weights_chunk_bytes: int = WEIGHTS_CHUNK_BYTES


@lru_cache(maxsize=None)
def _load(rig_file: str, catalog_dir: str) -> RigConfig:
    return load_rig(Path(rig_file), Path(catalog_dir))


def rig_config(host) -> RigConfig:
    """The validated config of one inventory host (its `rig_file` and `catalog_dir` data), with its
    weights sources as the fleet resolves them (rigkit.config.rig_sources: one download per fleet)."""
    inventory = getattr(host, "inventory", None)
    if inventory is None or host.name not in {h.name for h in inventory}:
        return own_rig_config(host)
    return fleet_rig_configs(inventory)[host.name]


_FLEETS: dict[int, tuple[object, dict[str, RigConfig]]] = {}


def fleet_rig_configs(inventory) -> dict[str, RigConfig]:
    """Every host's config, shared sources resolved and rig sources checked, once per inventory."""
    cached = _FLEETS.get(id(inventory))
    if cached is not None and cached[0] is inventory:
        return cached[1]
    from rigkit.config.rig_sources import FleetRig, RigSourceError, check_rig_sources, share_sources

    fleet = [FleetRig(h.name, own_rig_config(h), ssh_address(h), _relay_refusal(h)) for h in inventory]
    rigs = share_sources(fleet)
    try:
        check_rig_sources(rigs, {entry.name: entry.no_relay for entry in fleet})
    except RigSourceError as exc:
        raise RigConfigError(str(exc)) from None
    _FLEETS[id(inventory)] = (inventory, rigs)
    return rigs


def _relay_refusal(host) -> str | None:
    """Why the weights relay's `ssh` cannot reach `host`; its SSH settings' own error where they are bad (a
    missing key file): that stops a command only where it reaches the host, not every command of the fleet."""
    try:
        return ssh_target(host).openssh_refusal()
    except RigConfigError as exc:
        return str(exc)


def own_rig_config(host) -> RigConfig:
    """One host's config from its own files alone."""
    rig_file = host.data.get("rig_file")
    if not rig_file:
        raise RigConfigError(f"host {host.name} has no `rig_file` in its inventory data; point it at inventory/rigs/<rig>.yml")
    try:
        return _load(str(rig_file), str(host.data.get("catalog_dir") or DEFAULT_CATALOG_DIR))
    except ConfigError as exc:
        raise RigConfigError(f"rig {host.name}: {exc.render()}") from None


VERIFY_CHOICES = ("after-changes", "always", "never")  # `rigkit_verify`; unset: after-changes


def run_options(host) -> RunOptions:
    verify = host.data.get("rigkit_verify") or "after-changes"
    if verify not in VERIFY_CHOICES:  # a misspelt "never" must not benchmark, nor a misspelt "always" skip
        raise RigConfigError(f"host {host.name}: rigkit_verify is {verify!r}; allowed: {', '.join(VERIFY_CHOICES)}")
    return RunOptions(
        results_dir=Path(host.data.get("results_dir") or DEFAULT_RESULTS_DIR),
        verify_always=verify == "always",
        verify_never=verify == "never",
        verify_weights=bool(host.data.get("rigkit_weights_verify")),
        status_dir=Path(host.data.get("rigkit_status_dir")) if host.data.get("rigkit_status_dir") else None,
        status_inventory=str(host.data.get("rigkit_status_inventory") or "INVENTORY"),
        accept_slower=accept_slower_models(host),
        rollout_outcome=Path(host.data.get("rigkit_rollout_outcome")) if host.data.get("rigkit_rollout_outcome") else None,
        weights_chunk_bytes=weights_chunk_bytes(host),
    )


def weights_chunk_bytes(host) -> int:
    value = host.data.get("rigkit_weights_chunk_bytes")
    if value is None:
        return WEIGHTS_CHUNK_BYTES
    low, high = WEIGHTS_CHUNK_BYTES_RANGE
    number = int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value
    if type(number) is not int or not low <= number <= high:
        raise RigConfigError(f"host {host.name}: rigkit_weights_chunk_bytes {value!r}: give a whole number of bytes, "
                             f"{low}-{high}")
    return number


def accept_slower_models(host) -> frozenset[str]:
    """`rigkit_accept_slower`: catalog model names, comma-separated (`rigkit deploy --accept-slower`
    checks them against the rigs it deploys before any rig is reached)."""
    text = str(host.data.get("rigkit_accept_slower") or "")
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not NAME_PATTERN.fullmatch(n)]
    if bad:
        raise RigConfigError(f"host {host.name}: rigkit_accept_slower {text!r}: {', '.join(map(repr, bad))} is not a "
                             "model name (lower-case letters, digits, '_', '-'); give the catalog names, comma-separated")
    return frozenset(names)


def accept_slower_data(models: list[str] | None) -> list[str]:
    """pyinfra's `--data` that tells every rig of a run the models of `--accept-slower` (as
    accept_slower_models reads it back); nothing when there are none."""
    return ["--data", f"rigkit_accept_slower={','.join(sorted(set(models)))}"] if models else []


def connector_os(host) -> str:
    """The OS a host's connector speaks to: rigkit's Windows connector says `windows`
    through its `target_os`; every other connector is taken as a POSIX shell."""
    return getattr(host.connector_cls, "target_os", "linux")


def validate_inventory(inventory) -> dict[str, RigConfig]:
    """Validate every active host's config up front, so one bad file stops all rigs; a
    Windows rig must be reached through the Windows connector, a Linux rig must not."""
    return {host.name: validate_host(host) for host in inventory.get_active_hosts()}


def validate_host(host) -> RigConfig:
    """One host's rig config, its run switches, and its connector against the rig file's os."""
    rig = rig_config(host)
    run_options(host)
    speaks = connector_os(host)
    if rig.spec.os == "windows" and speaks != "windows":
        raise RigConfigError(
            f"rig {host.name} ({rig.file}) has os: windows, but its inventory entry uses the "
            f"{host.connector_cls.__name__}; name it @winssh/<address> to use rigkit's Windows connector"
        )
    if rig.spec.os == "linux" and speaks == "windows":
        raise RigConfigError(
            f"rig {host.name} ({rig.file}) has os: linux, but its inventory entry uses the Windows "
            "connector (@winssh/); name it by its address"
        )
    return rig


MAX_INVENTORY_BYTES = 1024 * 1024  # an inventory is a short Python file


def load_inventory(path: str):
    """The inventory file's pyinfra `Inventory`, read offline (no rig is reached). A missing file,
    one that is not a regular .py file, or one whose Python raises is a RigConfigError of one line
    (the file, the line of the inventory where it raised, the exception): never a traceback.
    A relative path is taken from the current directory, as pyinfra takes it."""
    import stat

    from rigkit.config.errors import one_line, shown
    from rigkit.config.names import host_name_problem

    try:
        info = Path(path).stat()
    except FileNotFoundError:
        raise RigConfigError(f"{path}: no such inventory file; give the path of an inventory .py file "
                             "(a relative path is taken from the current directory)") from None
    except OSError as exc:
        raise RigConfigError(f"{path}: cannot read the inventory file: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode) or not path.endswith(".py"):
        raise RigConfigError(f"{path}: not an inventory file; an inventory is a regular Python file (.py) "
                             "listing the rigs (inventory/sim.py)")
    if info.st_size > MAX_INVENTORY_BYTES:
        raise RigConfigError(f"{path}: {info.st_size} bytes; an inventory file has at most {MAX_INVENTORY_BYTES}")
    # Imported only now: pyinfra_cli patches the standard library with gevent on import.
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    try:
        with ctx_state.use(State()), _bounded(INVENTORY_LOAD_S):
            inventory = make_inventory(path, cwd=".")
    except _LoadTimeout:
        raise RigConfigError(f"{path}: still loading after {INVENTORY_LOAD_S:g} s; an inventory lists rigs, "
                             "it does not wait or loop (inventory/sim.py)") from None
    except (Exception, SystemExit) as exc:  # the inventory is the user's Python: its error, in one line
        inner = getattr(exc, "exception", None) or exc  # pyinfra wraps it (UnexpectedExternalError)
        line = _raised_at(inner, path)
        raise RigConfigError(f"{path}{line}: cannot be loaded: {type(inner).__name__}: {one_line(str(inner))}"
                             + (" (an environment variable it reads is not set?)" if isinstance(inner, KeyError)
                                else "")) from None
    hosts = list(inventory)
    if not hosts:
        raise RigConfigError(f"{path}: lists no rigs; an inventory names each rig with its data, "
                             'e.g. rigs = [("rig-a", {"ssh_hostname": "192.0.2.10", "rig_file": ...})] (inventory/sim.py)')
    for host in hosts:
        if problem := host_name_problem(host.name):
            raise RigConfigError(f"{path}: host name {shown(host.name)}: {problem}")
    return inventory


INVENTORY_LOAD_S = 10.0  # an inventory is a list of rigs: loading it takes milliseconds


class _LoadTimeout(BaseException):
    """Raised into the inventory's own code by the timer (a BaseException: the code's `except Exception`
    does not swallow it)."""


@contextmanager
def _bounded(seconds: float):
    """A bound on the time the block runs, by SIGALRM (the main thread only: elsewhere, unbounded)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _LoadTimeout()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _raised_at(exc: BaseException, path: str) -> str:
    import traceback

    tb = getattr(exc, "_traceback", None) or exc.__traceback__
    target = Path(path).resolve()
    lines = [frame.lineno for frame in traceback.extract_tb(tb) if Path(frame.filename).resolve() == target]
    return f", line {lines[-1]}" if lines else ""


def select_hosts(inventory, path: str, limit: str | None, option: str = "--limit") -> list:
    """The hosts `limit` selects as pyinfra's --limit does (a group's name, else a glob on host
    names); RigConfigError naming the inventory's rigs when it selects none."""
    from fnmatch import fnmatch

    from pyinfra.api.exceptions import NoGroupError

    from rigkit.config.errors import shown

    hosts = list(inventory)
    if limit is None:
        return hosts
    try:
        selected = list(inventory.get_group(limit)) if limit else []
    except NoGroupError:
        selected = [host for host in hosts if fnmatch(host.name, limit)]
    if not selected:
        raise RigConfigError(f"{option} {shown(limit)}: no rig or group of {path} matches; its rigs: "
                             f"{', '.join(h.name for h in hosts) or 'none'}")
    return selected


# pyinfra's ssh_strict_host_key_checking values, as OpenSSH's StrictHostKeyChecking ("ask" would prompt).
# "no"/"off" are accept-new: paramiko accepts an unknown key then but refuses a changed one always,
# which OpenSSH's "no" would accept.
HOST_KEY_CHECKING = {"yes": "yes", "accept-new": "accept-new", "no": "accept-new", "off": "accept-new"}


@dataclass(frozen=True)
class SshTarget:
    """How `rigkit tune` and the weights relay's `ssh` (rigkit.plumbing.ssh.openssh_command) reach a rig outside
    pyinfra's connection: pyinfra's own `ssh_*` host data."""

    hostname: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts_file: str | None = None
    strict_host_key_checking: str = "yes"  # pyinfra's `ssh_strict_host_key_checking`: yes, off, accept-new
    config_file: str | None = None  # `ssh_config_file`
    # What only paramiko can be given: a password or a key's passphrase (OpenSSH would prompt), or the
    # names of paramiko connect arguments the inventory sets (`ssh_paramiko_connect_kwargs`; not
    # `transport_factory`, which only picks algorithms on a socket already connected: rigkit's default).
    has_password: bool = False
    paramiko_kwargs: tuple[str, ...] = ()

    def openssh_refusal(self) -> str | None:
        """Why OpenSSH's `ssh` cannot reach the rig as pyinfra's connection does, or None where it can:
        what only paramiko is given (a password, a key's passphrase, paramiko's own connect arguments),
        a host key check that would prompt, or no `ssh` on this machine."""
        if self.has_password:
            return ("its inventory data gives a password (ssh_password or ssh_key_password), which OpenSSH would prompt "
                    "for; use a key without a passphrase (ssh_key) or one loaded in an SSH agent")
        if self.paramiko_kwargs:
            return (f"its inventory data gives paramiko's own arguments ({', '.join(self.paramiko_kwargs)}); put such "
                    "settings in an SSH config file (ssh_config_file) instead")
        if self.strict_host_key_checking not in HOST_KEY_CHECKING:
            return (f"ssh_strict_host_key_checking {self.strict_host_key_checking!r} would prompt; use yes, "
                    "accept-new or off")
        if not shutil.which("ssh"):
            return "this machine has no OpenSSH client (`ssh`) on its PATH; install it"
        return None


def ssh_address(host) -> str:
    """`hostname:port` as pyinfra's SSH connector reaches the host, for messages."""
    return f"{host.data.get('ssh_hostname') or host.name}:{host.data.get('ssh_port') or 22}"


def ssh_target(host) -> SshTarget:
    data = host.data
    port = data.get("ssh_port") or 22
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)
    if type(port) is not int or not 1 <= port <= 65535:
        from rigkit.config.errors import shown

        raise RigConfigError(f"host {host.name}: ssh_port {shown(port)}: give a TCP port, 1-65535")
    key = data.get("ssh_key")
    if key and not Path(str(key)).expanduser().is_file():
        raise RigConfigError(f"host {host.name}: ssh_key {key}: no such private key file; give the path of the key "
                             "(a relative path is taken from the current directory)")
    return SshTarget(
        hostname=str(data.get("ssh_hostname") or host.name),
        port=port,
        user=data.get("ssh_user"),
        key_file=data.get("ssh_key"),
        known_hosts_file=data.get("ssh_known_hosts_file"),
        strict_host_key_checking=str(data.get("ssh_strict_host_key_checking") or "yes"),
        config_file=data.get("ssh_config_file"),
        has_password=bool(data.get("ssh_password") or data.get("ssh_key_password")),
        paramiko_kwargs=tuple(sorted(str(key) for key in (data.get("ssh_paramiko_connect_kwargs") or {})
                                     if key != "transport_factory")),
    )


def gateway_spec(host) -> GatewaySpec | None:
    """The host's `gateway` data, validated, or None when it runs no gateway."""
    data = host.data.get(GATEWAY_KEY)
    if data is None:
        return None
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise RigConfigError(f"host {host.name}: {GATEWAY_KEY} must be a mapping (port, bind_address, "
                             f"master_key_file, ...), not {type(data).__name__}")
    try:
        return GatewaySpec.model_validate({"health_check_interval_s": GATEWAY_HEALTH_CHECK_INTERVAL_S, **data})
    except ValidationError as exc:
        allowed = ", ".join(GatewaySpec.model_fields)
        lines = []
        for error in exc.errors():
            # `tls` is a word or a mapping: pydantic reports each form it tried; one line says both.
            loc = [p for p in error["loc"] if p != "GatewayTlsFiles"]
            field = ".".join(str(p) for p in loc)
            if error["loc"][0] == "tls" and (len(loc) == 1 or "literal" in str(error["loc"][1])):
                if not isinstance(data.get("tls"), dict) and not any("tls: " in line for line in lines):
                    lines.append(f"{GATEWAY_KEY}.tls: {data.get('tls')!r}: allowed: rigkit (a certificate from the "
                                 "fleet's CA), none (plain HTTP), or a mapping with cert_file and key_file")
            elif error["type"] == "extra_forbidden":
                fields = "cert_file, key_file" if loc[0] == "tls" else allowed
                lines.append(f"{GATEWAY_KEY}.{field}: unknown key (a typo?); allowed: {fields}")
            elif error["type"] == "missing":
                lines.append(f"{GATEWAY_KEY}.{field}: required field is missing")
            else:
                lines.append(f"{GATEWAY_KEY}.{field}: {error.get('input')!r}: {error['msg'].removeprefix('Value error, ')}")
        raise RigConfigError(f"host {host.name}: " + "; ".join(lines)) from None


@dataclass(frozen=True)
class RigView:
    """One inventory host, as the gateway needs it (rigkit.gateway.plan plans from these)."""

    host: str  # inventory name
    rig: RigConfig
    address: str  # how the control machine reaches it (ssh_hostname, else the inventory name)
    gateway: GatewaySpec | None = None  # set on the host that runs the gateway
    gateway_address: str | None = None  # where the gateway reaches this rig's models, if not `address`


def gateway_views(inventory, rigs: dict[str, RigConfig] | None = None) -> list[RigView]:
    """Every host of the inventory as the gateway sees it, active or not: a rollout limited to one
    rig keeps the others (rigkit.gateway.plan.gateway_plan turns them into the gateway)."""
    views = []
    for host in inventory:
        rig = (rigs or {}).get(host.name) or rig_config(host)
        address = host.data.get(GATEWAY_ADDRESS_KEY)
        views.append(RigView(host=host.name, rig=rig, address=str(host.data.get("ssh_hostname") or host.name),
                             gateway=gateway_spec(host), gateway_address=None if address is None else str(address)))
    return views
