"""Role gateway_verify: verification through the gateway, on the rig that runs it (docs/gateway.md).

For each model name the gateway serves: one benchmark through the gateway with rigkit's benchmark
client (tokens from `usage`; a stream without usage fails), and the time to first token it adds
against direct requests to one replica of that model, alternating (rigkit.gateway.verify). The
controller reaches both through SSH port forwards over this rig's connection: the gateway at its
bind address, the replica at the address the gateway itself uses for it (its `api_base`), so the
two paths differ only by the proxy. Writes results/<rig>/_gateway/<time>.json, prints one line per
model, and fails the deploy when a check fails.

Runs after the gateway role when this deploy changed the gateway's rig (`after`), or `always`
(`rigkit verify`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from rigkit.gateway.facts import GatewayRunning
from rigkit.gateway.stack import probe_host, scheme
from rigkit.gateway.tls import TlsError, plan_tls
from rigkit.rigside.probe import pinned_context
from rigkit.gateway.plan import GatewayPlan, Replica
from rigkit.rigside.names import GATEWAY_PROJECT
from rigkit.serving.api_key import SecretFileError, read_api_key, read_key_file
from rigkit.plumbing.ssh_forward import forward
from rigkit.plumbing.ssh import rig_call

REQUEST_TIMEOUT_S = 120  # each request, as in direct verification


@deploy("Verify through the gateway")
def gateway_verify(plan: GatewayPlan, rigs: dict, results_dir: Path, always: bool = False, after=()) -> None:
    """`rigs`: {inventory host: RigConfig} of every rig, for the replicas' API keys. `after`: this
    rig's operations of the deploy; verification runs if any changed, or `always`."""
    models = sorted({r.model_name for r in plan.replicas})
    if not models:
        return
    python.call(
        name=f"Verify through the gateway: {', '.join(models)} (benchmark, usage, added TTFT)",
        function=rig_call(_verify), plan=plan, rigs=rigs, results_dir=results_dir,
        _if=lambda: always or any(op.did_change() for op in after),
    )


def direct_replica(plan: GatewayPlan, model_name: str) -> Replica:
    """The replica the direct requests go to: one on the gateway's own rig if there is one (the same
    machine as the proxy), else the first in the inventory's order."""
    replicas = [r for r in plan.replicas if r.model_name == model_name]
    return next((r for r in replicas if r.rig == plan.host), replicas[0])


def _verify(plan: GatewayPlan, rigs: dict, results_dir: Path) -> None:
    # httpx, the client and its checks are imported only when verification runs.
    from rigkit.gateway.verify import document, measure_model, save, summary_line

    try:
        master = read_key_file(plan.spec.master_key_file, f"host {plan.host}: gateway.master_key_file")
    except SecretFileError as exc:
        raise OperationError(str(exc)) from None
    if host.get_fact(GatewayRunning, project=GATEWAY_PROJECT) == 0:
        raise OperationError(f"the gateway is not running on {plan.host} (compose project {GATEWAY_PROJECT}): nothing to "
                             "verify through; `rigkit deploy` brings it up")
    try:
        tls = plan_tls(plan)  # the certificate the gateway role deployed (saved, so the same one)
    except TlsError as exc:
        raise OperationError(f"host {plan.host}: {exc}") from None
    verify = True if tls is None else pinned_context(tls.cert_pem.decode())
    transport = host.connector.client.get_transport()
    gateway_host = probe_host(plan.spec)
    results = []
    with forward(transport, plan.spec.port, gateway_host) as gateway_port:
        gateway_url = f"{scheme(plan)}://127.0.0.1:{gateway_port}"
        for name in sorted({r.model_name for r in plan.replicas}):
            replica = direct_replica(plan, name)
            where = urlsplit(replica.api_base)
            try:
                key = read_api_key(rigs[replica.rig]) if replica.key_env else None
            except SecretFileError as exc:
                raise OperationError(str(exc)) from None
            with forward(transport, where.port, where.hostname) as direct_port:
                results.append(measure_model(
                    gateway_url, master, f"http://127.0.0.1:{direct_port}", key, name,
                    [r.deployment_id for r in plan.replicas if r.model_name == name], replica.deployment_id,
                    REQUEST_TIMEOUT_S, max_added_ttft_ms=plan.spec.max_added_ttft_ms, gateway_verify=verify))
    rig = rigs[plan.host].name
    doc = document(plan.host, rig, f"{scheme(plan)}://{gateway_host}:{plan.spec.port}", results)
    path = save(results_dir, rig, doc)
    lines = [summary_line(r) for r in results]
    logger.info(f"{host.print_prefix}verification through the gateway:\n" + "\n".join(lines) + f"\nresult: {path}")
    failed = [f"{r.model}: {c.name}: {c.message}" for r in results for c in r.checks if not c.passed]
    if failed:
        raise OperationError(f"verification through the gateway failed: {'; '.join(failed)} (details: {path})")
