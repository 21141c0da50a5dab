"""Where pyinfra's inventory meets rigkit's config: each host names its rig file.

This is the one place where `ConfigError` becomes pyinfra's error type, so a bad
file stops the run with its message before any operation runs on any rig.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from rigkit.config import RigConfig, load_rig
from rigkit.errors import ConfigError
from rigkit.winconnector import WindowsSSHConnector

DEFAULT_CATALOG_DIR = "inventory/models"


class RigConfigError(PyinfraError):
    """A rig's configuration is invalid; raised before any change is made."""


@lru_cache(maxsize=None)
def _load(rig_file: str, catalog_dir: str) -> RigConfig:
    return load_rig(Path(rig_file), Path(catalog_dir))


def rig_config(host) -> RigConfig:
    """The validated config of one inventory host (its `rig_file` and `catalog_dir` data)."""
    rig_file = host.data.get("rig_file")
    if not rig_file:
        raise RigConfigError(f"host {host.name} has no `rig_file` in its inventory data; point it at inventory/rigs/<rig>.yml")
    try:
        return _load(str(rig_file), str(host.data.get("catalog_dir") or DEFAULT_CATALOG_DIR))
    except ConfigError as exc:
        raise RigConfigError(f"rig {host.name}: {exc.render()}") from None


def validate_inventory(inventory) -> dict[str, RigConfig]:
    """Validate every active host's config up front, so one bad file stops all rigs; a
    Windows rig must be reached through the Windows connector, a Linux rig must not."""
    rigs = {}
    for host in inventory.get_active_hosts():
        rig = rigs[host.name] = rig_config(host)
        through_winssh = issubclass(host.connector_cls, WindowsSSHConnector)
        if rig.spec.os == "windows" and not through_winssh:
            raise RigConfigError(
                f"rig {host.name} ({rig.file}) has os: windows, but its inventory entry uses the "
                f"{host.connector_cls.__name__}; name it @winssh/<address> to use rigkit's Windows connector"
            )
        if rig.spec.os == "linux" and through_winssh:
            raise RigConfigError(
                f"rig {host.name} ({rig.file}) has os: linux, but its inventory entry uses the Windows "
                "connector (@winssh/); name it by its address"
            )
    return rigs
