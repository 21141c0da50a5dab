"""Which hosts may reach a rig's models. Pure functions (the gateway's address resolved by the caller).

vLLM asks for the API key only on paths under /v1: /metrics, /version, /ping, /tokenize, /detokenize,
/pooling, /score, /invocations (and the development routes when VLLM_SERVER_DEV_MODE is on) answer
anyone who reaches the port. So a rig whose models listen on every interface (`serve_address:
0.0.0.0`) gets a firewall in its own kernel (nftables, roles/surface.py) that lets in only the rig
itself, the rig of the gateway that fronts its models, and the hosts its rig file names in
`serve_clients`; every other host is refused at the port, on every path. A rig serving on the network
with neither a gateway in front nor `serve_clients` is refused before any rig is touched: there is no
one the models are for but everyone.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from rigkit.config.schema import RigConfig


class SurfaceError(Exception):
    """The rig's serving surface cannot be closed as written; nothing was touched."""


@dataclass(frozen=True)
class SurfacePlan:
    ports: tuple[int, ...]  # the models' ports, closed to every host but these
    gateway: tuple[str, ...]  # IPv4 networks: the rig of the gateway fronting its models
    clients: tuple[str, ...]  # IPv4 networks: the rig file's serve_clients

    @property
    def allowed(self) -> tuple[str, ...]:
        """The networks let in, overlaps merged (an nftables set of intervals may not overlap)."""
        networks = [ipaddress.IPv4Network(n) for n in (*self.gateway, *self.clients)]
        return tuple(str(n) for n in ipaddress.collapse_addresses(networks))


def surface_plan(host: str, rig: RigConfig, gateway_sources: tuple[str, ...],
                 runs_gateway: bool = False) -> SurfacePlan | None:
    """The plan for `host`'s rig; None where nothing of it listens beyond loopback (a loopback rig, a
    Windows rig, no models). `gateway_sources`: the addresses of the rig whose gateway routes to this
    rig's models (none when no gateway does, or it runs here: `runs_gateway`, reaching them on 127.0.0.1)."""
    if rig.spec.serve_address == "127.0.0.1" or rig.spec.os != "linux" or not rig.models:
        return None
    clients = tuple(rig.spec.serve_clients)
    if not gateway_sources and not clients:
        why = (f"the gateway on rig {host} reaches its models on 127.0.0.1, and no other host needs them"
               if runs_gateway else f"with no gateway in front and no serve_clients, every host of the network "
               f"would reach rig {host}'s models")
        fix = ("serve on 127.0.0.1, or list the other hosts that may call the models in serve_clients" if runs_gateway
               else "put a rigkit gateway in front (its rig is then the one let in), or list the hosts that may "
               "call the models in serve_clients (they reach those paths without the key), or serve on 127.0.0.1")
        raise SurfaceError(
            f"{rig.file}: serve_address: '0.0.0.0': {why}, and vLLM asks for the API key only under /v1 (/metrics, "
            f"/tokenize, /version and more answer anyone). {fix[0].upper()}{fix[1:]}")
    return SurfacePlan(ports=tuple(sorted({m.spec.port for m in rig.models})),
                       gateway=tuple(f"{ipaddress.IPv4Address(a)}/32" for a in gateway_sources), clients=clients)


def open_paths_warning(host: str, plan: SurfacePlan) -> str | None:
    """What a deploy says every time a rig lets hosts other than a gateway reach its models."""
    if not plan.clients:
        return None
    return (f"rig {host}: serve_clients {', '.join(plan.clients)} reach the models' ports on every path, and vLLM "
            "asks for the API key only under /v1 (/metrics, /tokenize, /version and more answer them without it)")
