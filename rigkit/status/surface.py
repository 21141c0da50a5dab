"""`rigkit status`'s network surface: every port of the rig that answers beyond loopback, judged against
what rigkit opened there (docs/security.md). Pure: the probe's findings in, drift and findings out."""

from __future__ import annotations

from datetime import datetime, timezone

from rigkit.config.schema import RigConfig
from rigkit.gateway.tls import RENEW_DAYS


def known_ports(rig: RigConfig, gateway_bind: tuple[str, int] | None) -> dict[int, str]:
    """{port: what of rigkit's listens there beyond loopback, as the rig file and inventory say}: the models,
    the monitoring exporter where they serve on every interface (it wants their key), the gateway where it
    binds beyond loopback (`gateway_bind`: its bind address and port). Prometheus stays on loopback."""
    known = {m.spec.port: f"model {m.name}" for m in rig.models}
    if rig.spec.monitoring.enabled and rig.spec.serve_address == "0.0.0.0":
        known[rig.spec.monitoring.exporter_port] = "the monitoring exporter"
    if gateway_bind is not None and not gateway_bind[0].startswith("127."):
        known[gateway_bind[1]] = "the gateway"
    return known


def judge_surface(doc: dict, rig: RigConfig, found: dict | None, known: dict[int, str], commands, drift, failure) -> None:
    """`found`: the probe's "surface" ({"listening": [{"port", "addresses", "process", "http_status"?}],
    "firewall": {"loaded", "closed_ports"}}). A model port open beyond loopback must be where the rig file
    says so and closed by rigkit's firewall; a port rigkit does not know (SSH's daemon aside) is a finding."""
    if not found:
        return
    doc["surface"] = found
    firewall = found.get("firewall") or {}
    models = {m.spec.port: m for m in rig.models}
    for entry in found.get("listening", []):
        port, where = entry["port"], ", ".join(entry["addresses"])
        if port in models:
            if rig.spec.serve_address == "127.0.0.1":
                drift(f"model {models[port].name}: listening", f"beyond loopback ({where})", "127.0.0.1 only",
                      commands.deploy)
            elif not firewall.get("loaded") or port not in firewall.get("closed_ports", []):
                drift(f"model {models[port].name}: firewall", "its port open to every host",
                      "closed to all but the rig, its gateway's rig and serve_clients", commands.deploy)
        elif port in known or entry.get("process") == "sshd":
            continue
        elif entry.get("process") is None:
            # No process of the rig holds it: a kernel service (nfsd) or a socket of another network
            # namespace's user: said, not judged (there is nothing to stop).
            doc["notes"].append(f"surface: port {port} listens beyond loopback ({where}); no process of this rig "
                                "holds it (a kernel service, or another namespace's)")
        else:
            status = entry.get("http_status")
            answer = ("it does not answer HTTP" if status is None else f"it wants a key (HTTP {status})"
                      if status in (401, 403) else f"it answers HTTP without a key ({status})")
            failure("surface", f"port {port} ({entry['process']}) answers beyond loopback ({where}); {answer}; "
                    "rigkit did not open it",
                    commands.on_rig(f"stop it, bind it to 127.0.0.1, or close port {port} in the rig's firewall"))


def judge_gateway_tls(doc: dict, found: dict | None, now: datetime, commands, drift, failure) -> None:
    """`found`: the probe's "gateway_tls" ({"not_after": epoch seconds} or {"error"}), on the gateway's rig
    when it speaks HTTPS. A gateway not serving the deployed certificate is a failure; one whose certificate
    has RENEW_DAYS or fewer left is drift (the next deploy issues a new one; a user's own is theirs to renew)."""
    if not found:
        return
    if found.get("error"):
        failure("gateway", f"HTTPS: {found['error']}", commands.deploy)
        return
    expires = datetime.fromtimestamp(found["not_after"], timezone.utc)
    days = (expires - now).total_seconds() / 86400
    doc["gateway_tls"] = {"expires": expires.isoformat(timespec="seconds"), "days_left": int(days)}
    if days <= RENEW_DAYS:
        # rigkit renews its own at the next deploy; a certificate the user gave is theirs to renew.
        repair = commands.deploy if found.get("issued_by_rigkit") else (
            f"put a current certificate in gateway.tls.cert_file (and its key_file), then {commands.deploy}")
        drift("gateway: certificate", f"expires {expires:%Y-%m-%d} ({int(days)} days)" if days > 0 else
              f"expired {expires:%Y-%m-%d}", f"more than {RENEW_DAYS} days left", repair)
