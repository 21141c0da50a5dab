"""Names and paths both sides use: where rigkit puts things on a Linux rig, the systemd units it
installs, and the rules that turn a catalog model into a Compose project, a Docker volume and a
served model name. Declared once here and imported by roles, status, tune, weights, serving,
gateway and windows; rendered templates receive them as variables, and the rig-side scripts import
this module from the shipped runtime. Standard library only (it runs on rigs too).

The model rules take any object with a catalog model's shape (`model.name`, `model.spec.vllm`,
`model.spec.weights`): rigkit.config.schema.ModelConfig on the control side.
"""

from __future__ import annotations

# Folders
ETC_DIR = "/etc/rigkit"
SBIN_DIR = "/usr/local/sbin"
LIB_DIR = "/usr/local/lib/rigkit"  # shipped Python: the runtime, the sampler, pynvml
RUN_DIR = "/run/rigkit"  # root-only: the sampler's output
LOCK_DIR = "/run/lock"  # the rollout lock of each stack (RIGKIT_LOCK_DIR on the rig overrides it)
UNIT_DIR = "/etc/systemd/system"

# The rig-side runtime (this package), as shipped
RUNTIME_DIR = f"{LIB_DIR}/rigside"

# Serving: one Compose stack per model, the helper that rolls it out, the API key's env file
STACKS_DIR = f"{ETC_DIR}/stacks"
SECRETS_DIR = f"{ETC_DIR}/secrets"
SECRETS_ENV_FILE = f"{SECRETS_DIR}/vllm-api-key.env"
# During a key rotation: every key the models accept, as a vLLM config file (rigkit.serving.api_key), and
# the variable Compose takes it from (rigside.keyfile.compose_env) to copy it into the container.
ACCEPTED_KEYS_FILE = f"{SECRETS_DIR}/vllm-api-keys.yaml"
ACCEPTED_KEYS_ENV = "RIGKIT_VLLM_API_KEYS"
STACK_HELPER_PATH = f"{SBIN_DIR}/rigkit-stack"
PROJECT_PREFIX = "rigkit-"
ENGINE_SERVICE = "vllm"  # the one service of each model's compose file (templates/serving/compose.yml.j2)


def engine_container(project: str) -> str:
    """Compose's name for the one container of a model's stack: `docker top`, `docker logs` take it."""
    return f"{project}-{ENGINE_SERVICE}-1"


# What is in a stack's folder, and rigkit-stack's command line: its contract, rigkit/rigside/stack.py

# The watchdog
WATCHDOG_PATH = f"{SBIN_DIR}/rigkit-watchdog"
WATCHDOG_CONFIG_PATH = f"{ETC_DIR}/watchdog.json"
WATCHDOG_STATE_DIR = "/var/lib/rigkit/watchdog"  # one JSON file per model: last sample, suspicion, restarts
WATCHDOG_SERVICE = "rigkit-watchdog.service"
WATCHDOG_TIMER = "rigkit-watchdog.timer"

# On-demand models (docs/on-demand.md): rigkit-ondemand, the front and scheduler of the models loaded on demand
ONDEMAND_PATH = f"{SBIN_DIR}/rigkit-ondemand"
ONDEMAND_CONFIG_PATH = f"{ETC_DIR}/ondemand.json"
ONDEMAND_SERVICE = "rigkit-ondemand.service"
ONDEMAND_STATE_PATH = f"{RUN_DIR}/ondemand.json"  # each model's state and the last swaps, written by the program
ONDEMAND_STATE_STALE_S = 30  # older, the program is taken as not running (it writes at each swap and every 2 s)
# One JSON file per model: its canary and /v1/models answer, for the config they were proven with (engine_control)
ONDEMAND_PROOF_DIR = "/var/lib/rigkit/ondemand"

# GPU policy
GPU_POLICY_UNIT = "rigkit-gpu-policy.service"
GPU_POLICY_UNIT_PATH = f"{UNIT_DIR}/{GPU_POLICY_UNIT}"
GPU_POLICY_SCRIPT_PATH = f"{SBIN_DIR}/rigkit-gpu-policy"
GPU_POLICY_PATH = f"{ETC_DIR}/gpu-policy.conf"
GPU_OFFSETS_TOOL_PATH = f"{SBIN_DIR}/rigkit-gpu-offsets"  # NVML clock offsets (clock_offsets_mhz)
GPU_POLICY_NVML_DIR = f"{LIB_DIR}/gpu-policy"  # pynvml for rigs without nvidia-ml-py
GPU_POLICY_NVML_PATH = f"{GPU_POLICY_NVML_DIR}/pynvml.py"
GPU_POLICY_APPLIED_PATH = f"{RUN_DIR}/gpu-policy.applied"  # sha256 of the policy file last applied (the script writes it)
# The policy keeper (rigkit/gpu/keeper.py, templates/gpu_policy/rigkit-gpu-keeper.py)
GPU_KEEPER_PATH = f"{SBIN_DIR}/rigkit-gpu-keeper"
GPU_KEEPER_UNIT = "rigkit-gpu-keeper.service"  # the watch
GPU_KEEPER_RESUME_UNIT = "rigkit-gpu-keeper-resume.service"  # pulled in by the sleep targets
GPU_KEEPER_DRIVER_UNIT = "rigkit-gpu-keeper-driver.service"  # part of nvidia-persistenced.service
GPU_KEEPER_STATE_PATH = "/var/lib/rigkit/gpu-keeper.json"
IDLE_ENERGY_PATH = "/var/lib/rigkit/idle-energy.json"  # the keeper's ledger of idle energy (rigside.idle_energy)
GPU_KEEPER_LOCK_PATH = f"{RUN_DIR}/gpu-keeper.lock"  # one repair at a time
# GPUs whose clock lock is released while their on-demand models are parked (rigside.parked_clocks)
GPU_PARKED_PATH = f"{RUN_DIR}/gpu-parked"
# Its repair causes, the keys of its state file's counts and events (`rigkit status` and the exporter read
# them): a resume from sleep, a driver (re)load (the two a unit passes as `repair CAUSE`), a limit found back
# at the GPU's default (what a GPU reset leaves), any other limit
GPU_KEEPER_CAUSES = ("resume", "driver", "reset", "changed-by-hand")

# The NVML sampler of verification (and the pynvml copy for rigs without nvidia-ml-py)
SAMPLER_PATH = f"{LIB_DIR}/rigkit-telemetry.py"
SAMPLER_NVML_DIR = f"{LIB_DIR}/nvml"
SAMPLER_NVML_PATH = f"{SAMPLER_NVML_DIR}/pynvml.py"

# Tune's own folder: its helper, its sampler copy, its pynvml copy
TUNE_DIR = f"{LIB_DIR}/tune"
TUNE_HELPER_PATH = f"{TUNE_DIR}/rigkit-tune.py"
TUNE_SAMPLER_PATH = f"{TUNE_DIR}/rigkit-telemetry.py"
TUNE_NVML_DIR = f"{TUNE_DIR}/nvml"
# Tune's dead man's switch, a transient unit armed for the whole session: the keeper holds off
# while its timer is active (rigkit/tune/rig_helper.py, shipped alone, spells it out; a test keeps them equal)
TUNE_DEADMAN_UNIT = "rigkit-tune-deadman"

# The network surface (roles/surface.py, templates/surface/; docs/security.md): the models' ports closed
# to every host but the rig, its gateway's rig and serve_clients, by an nftables table of rigkit's own.
SURFACE_TABLE = "rigkit_surface"
SURFACE_RULES_PATH = f"{ETC_DIR}/surface.nft"
SURFACE_UNIT = "rigkit-surface.service"
SURFACE_UNIT_PATH = f"{UNIT_DIR}/{SURFACE_UNIT}"

# The gateway
GATEWAY_PROJECT = "rigkit-gateway"
GATEWAY_HELPER_PATH = f"{SBIN_DIR}/rigkit-gateway"
GATEWAY_DIR = f"{ETC_DIR}/gateway"
GATEWAY_SECRETS_ENV_FILE = f"{SECRETS_DIR}/gateway.env"
GATEWAY_BACKEND_KEYS_PATH = f"{SECRETS_DIR}/gateway-backend-keys.json"  # each replica's key, root only
GATEWAY_SETTINGS_PATH = f"{GATEWAY_DIR}/gateway.json"  # what the rig-side helper reads
GATEWAY_CLIENT_KEYS_PATH = f"{GATEWAY_DIR}/client-keys.json"  # SHA-256 of each client key (no key)
GATEWAY_TLS_CERT_PATH = f"{GATEWAY_DIR}/tls-cert.pem"  # the chain the gateway serves; the helper trusts it
GATEWAY_TLS_KEY_PATH = f"{SECRETS_DIR}/gateway-tls.key"  # its key, root only

# Monitoring (roles/monitoring.py, templates/monitoring/; docs/monitoring.md)
EXPORTER_PATH = f"{SBIN_DIR}/rigkit-exporter"
EXPORTER_UNIT = "rigkit-exporter.service"
EXPORTER_UNIT_PATH = f"{UNIT_DIR}/{EXPORTER_UNIT}"
MONITORING_DIR = f"{ETC_DIR}/monitoring"
EXPORTER_CONFIG_PATH = f"{MONITORING_DIR}/exporter.json"
MONITORING_NVML_DIR = f"{LIB_DIR}/monitoring"  # pynvml for rigs without nvidia-ml-py
MONITORING_NVML_PATH = f"{MONITORING_NVML_DIR}/pynvml.py"
HUB_CACHE_DIR = "/var/lib/rigkit/hub"  # weights.hub's default cache: huggingface_hub's layout (docs/weights.md)
VERIFY_SUMMARY_DIR = "/var/lib/rigkit/verify"  # the last verification per model, <model>.json (roles/verify.py)
# Debian's prometheus package: its unit, its config, its ARGS file; rigkit's recording rules beside them
PROMETHEUS_UNIT = "prometheus.service"
PROMETHEUS_CONFIG_PATH = "/etc/prometheus/prometheus.yml"
PROMETHEUS_RULES_PATH = "/etc/prometheus/rigkit-rules.yml"
PROMETHEUS_ARGS_PATH = "/etc/default/prometheus"
# The keys Prometheus scrapes keyed rigs with, one file per rig (<rig>.key), readable by Prometheus only
PROMETHEUS_KEYS_DIR = "/etc/prometheus/rigkit-keys"
PROMETHEUS_USER = "prometheus"  # Debian's package creates it
# On the LAN the exporter's copy of the models' key: in its runtime folder (systemd's RuntimeDirectory=,
# its user's only, gone when it stops), put there by its unit's privileged ExecStartPre
EXPORTER_RUNTIME_DIR_NAME = "rigkit-exporter"
EXPORTER_KEY_PATH = f"/run/{EXPORTER_RUNTIME_DIR_NAME}/api-key.env"


def project_name(model) -> str:
    """The model's Compose project (and the prefix of its containers)."""
    return f"{PROJECT_PREFIX}{model.name}"


def served_name(model) -> str:
    """The name clients ask for: the catalog's served_model_name, else the catalog name."""
    return model.spec.vllm.served_model_name or model.name


def volume_name(model) -> str:
    """The Docker volume that holds the model's weights."""
    return model.spec.weights.volume or f"{PROJECT_PREFIX}weights-{model.name}"


def compile_cache_volume(model) -> str:
    """The Docker volume that keeps the model's compiled graphs (vLLM's cache root) across its containers."""
    return f"{PROJECT_PREFIX}compile-cache-{model.name}"


def weights_helper_name(model, side: str = "helper") -> str:
    """The container of a model's weights copier: "helper" (a copy from a folder), or a relay's side
    ("manifest", "send", "receive", "verify"). One of each at a time: a new one replaces it."""
    return f"{PROJECT_PREFIX}weights-{model.name}-{side}"


WEIGHTS_HELPER_LABEL = "rigkit.weights-helper"  # on each such container: the model's name


def rollout_lock_path(model_name: str, lock_dir: str = LOCK_DIR) -> str:
    """The one lock a stack's rollout holds (rigkit-stack takes it, the watchdog respects it)."""
    return f"{lock_dir}/rigkit-stack-{model_name}.lock"

# The active P2P check of a model spanning GPUs (docs/topology.md): the script run inside a container of
# the model's image, and its passed verdicts, one file per key (topology and image, rigkit.topology.probe)
P2P_PROBE_SCRIPT_PATH = f"{LIB_DIR}/rigkit-p2p-probe.py"
P2P_VERDICT_DIR = "/var/lib/rigkit/p2p"


def p2p_verdict_path(key: str, verdict_dir: str = P2P_VERDICT_DIR) -> str:
    """Where a passed P2P check of `key` is kept (its presence: no need to check again)."""
    return f"{verdict_dir}/{key}.json"
