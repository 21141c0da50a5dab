"""rigkit's pyinfra entry point: `pyinfra inventory/<your-rigs>.py deploy.py`.

Reads like a runbook, for each rig in the inventory:
1. validate every rig's config (all rigs, before any rig is touched);
Linux rigs (systemd, over SSH):
2. preflight: driver installed, its module and library agree, new enough for every image,
   every GPU's architecture in every image, disk for the weights (reads only; stops the rig);
3. base: Docker Engine + Compose v2, NVIDIA Container Toolkit, nvidia-persistenced, driver holds;
   then rigkit's rig-side runtime (rigkit/rigside), which the rig's own scripts import;
4. read the GPUs and check they are the ones the rig file describes;
5. GPU policy: power caps and clock locks, at boot and now;
6. weights: each model's weights copied onto its Docker volume, verified;
7. surface: where models listen beyond loopback, their ports closed to every host but the rig, its
   gateway's rig and the rig file's serve_clients, by the rig's own firewall (nftables);
   serving: one vLLM compose stack per model, rolled out with rollback;
8. verify: first the rollout gate of each model whose config changed (benchmarked against its last
   proven result; promoted, or rolled back and, once every model was gated, the deploy fails), then
   benchmark each model and check
   GPUs under load (when this deploy changed the rig; `rigkit verify` runs it on demand);
9. monitoring (when the rig file asks: `monitoring: {enabled: true}`): the exporter of GPU power,
   clocks, policy drift and verification figures, and Debian's Prometheus scraping it and the models
   (on the gateway's rig: every rig's exporter and models, the fleet);
10. gateway: on the rig whose inventory data has `gateway:`, the LiteLLM proxy over every
   replica of every rig (docs/gateway.md);
11. verify through the gateway: per model name, a benchmark through it and the time to first
   token it adds against a direct request (when this deploy changed the gateway's rig).
Windows rigs (`@winssh/HOST`): the same GPU checks, the same weights copy onto volumes
(through Docker Desktop), then the two elevated logon tasks and their scripts, installed
and run now (roles/windows.py).
"""

from rigkit.plumbing.pyinfra_fastpaths import use_fast_paths

# pyinfra's planning without its per-operation stack reads (rigkit/plumbing/pyinfra_fastpaths.py); before
# the roles' imports, whose fact classes ask for the same type hints as each operation.
use_fast_paths()

from pyinfra import host, inventory  # noqa: E402

from rigkit.config.inventory import rig_config, run_options, validate_inventory  # noqa: E402
from rigkit.plumbing.facts_once import read_ahead  # noqa: E402
from rigkit.gateway.plan import gateway_plan  # noqa: E402
from rigkit.monitoring.fleet import fleet_of  # noqa: E402
from rigkit.plumbing.ssh import tcp_nodelay  # noqa: E402
from rigkit.surface.fleet import fleet_surfaces  # noqa: E402
from roles.base import base  # noqa: E402
from roles.gateway import gateway  # noqa: E402
from roles.gateway_verify import gateway_verify  # noqa: E402
from roles.gpu_policy import gpu_policy, gpu_policy_reads  # noqa: E402
from roles.gpu_report import gpu_report, gpu_report_reads  # noqa: E402
from roles.monitoring import monitoring, monitoring_reads  # noqa: E402
from roles.preflight import preflight, preflight_reads  # noqa: E402
from roles.rigside import rigside, rigside_reads  # noqa: E402
from roles.serving import serving, serving_reads  # noqa: E402
from roles.surface import surface, surface_reads  # noqa: E402
from roles.verify import verify, verify_reads  # noqa: E402
from roles.weights import weights  # noqa: E402
from roles.windows import windows  # noqa: E402

rigs = validate_inventory(inventory)
fleet_gateway = gateway_plan(inventory, rigs)  # checked on every rig: a bad gateway entry stops them all
fleet_scraped = fleet_of(inventory, rigs, fleet_gateway)  # the gateway rig's Prometheus, checked on every rig too
surfaces = fleet_surfaces(inventory, rigs, fleet_gateway)  # who may reach each rig's models, checked on every rig
tcp_nodelay(host)  # ~45 ms less per round trip (rigkit/plumbing/ssh.py)
rig = rig_config(host)
options = run_options(host)
scraped = fleet_scraped if fleet_gateway is not None and fleet_gateway.host == host.name else None

if rig.spec.os == "linux":
    # Every question the roles below ask while planning, known from the rig file alone, asked
    # now and at once; each role gets its answers from memory (rigkit/plumbing/facts_once.py). They only
    # read: nothing changes before the preflight has passed. (tests/test_serving.py checks that
    # a converged deploy asks nothing else.)
    read_ahead([*preflight_reads(rig), *gpu_report_reads(rig), *gpu_policy_reads(rig), *rigside_reads(rig),
                *surface_reads(rig), *serving_reads(rig), *([] if options.verify_never else verify_reads(rig)),
                *monitoring_reads(rig, scraped)])
    checked = preflight(rig)
    base_changes = base(rig, checked.driver)
    runtime_changes = rigside(rig)  # the rig-side scripts below import it
    gpus = gpu_report(rig)
    policy_changes = gpu_policy(rig, gpus, runtime_changes)
    copied = weights(rig, verify=options.verify_weights, chunk_bytes=options.weights_chunk_bytes)
    surface(rig, surfaces[host.name])  # before the models listen
    # A new serving config is held un-promoted until the rollout gate (in verify) passes it; without
    # verification there is no gate, and a config that gets ready is promoted as before.
    rollouts: dict = {}
    changes = (base_changes + runtime_changes + policy_changes + list(copied.values())
               + serving(rig, copied, checked.topology, rollouts=rollouts, gate=not options.verify_never))
    if not options.verify_never:
        verify(rig, results_dir=options.results_dir, always=options.verify_always, after=changes, rollouts=rollouts,
               accept_slower=options.accept_slower, rollout_outcome=options.rollout_outcome, topology=checked.topology)
    # off unless the rig file asks; after verify, which its figures come from
    monitoring(rig, runtime_changes, scraped, {h.name: rig_config(h) for h in inventory} if scraped else None)
    if fleet_gateway is not None and fleet_gateway.host == host.name:
        fleet = {name: rig_config(h) for h in inventory for name in [h.name]}
        gateway_changes = gateway(fleet_gateway, fleet)
        if not options.verify_never:
            gateway_verify(fleet_gateway, fleet, results_dir=options.results_dir, always=options.verify_always,
                           after=changes + gateway_changes)
else:
    changes = windows(rig, verify_weights=options.verify_weights)
    if not options.verify_never:
        # The tasks bring the stacks up at logon and at their run now; verification benchmarks
        # them through an SSH port forward and samples NVML in a container (roles/verify.py).
        verify(rig, results_dir=options.results_dir, always=options.verify_always, after=changes)
