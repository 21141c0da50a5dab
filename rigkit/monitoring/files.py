"""The monitoring pack's rendered files, pure: the exporter's settings and unit, Debian Prometheus's
config, ARGS file and rigkit's recording rules. Rendered only from the validated RigConfig; YAML and
JSON are written by their libraries (every value quoted as it needs), the unit from a template
whose values are rigkit's own paths and validated integers.

Per-model energy joins two scrapes: each vLLM target gets the label `model` (the catalog name) and
the exporter says which GPUs a model runs on (`rigkit_model_gpu_info{model, gpu}`).
"""

from __future__ import annotations

import json

import yaml

from rigkit.config.schema import RigConfig
from rigkit.render import render
from rigkit.rigside.names import (
    EXPORTER_CONFIG_PATH,
    EXPORTER_PATH,
    GPU_KEEPER_STATE_PATH,
    GPU_POLICY_PATH,
    PROMETHEUS_RULES_PATH,
    VERIFY_SUMMARY_DIR,
    WATCHDOG_STATE_DIR,
)

EXPORTER_WATCHDOG_S = 30  # a scrape stuck this long in a hung NVML call: systemd restarts the exporter
EXPORTER_JOB = "rigkit-exporter"
VLLM_JOB = "vllm"
MIN_RATE_WINDOW_S = 10


def rate_window_s(rig: RigConfig) -> int:
    """The recording rules' rate() window: four scrapes (Prometheus needs two samples in it)."""
    return max(4 * rig.spec.monitoring.scrape_interval_s, MIN_RATE_WINDOW_S)


def exporter_settings(rig: RigConfig) -> str:
    """What the exporter on the rig reads (JSON)."""
    monitoring = rig.spec.monitoring
    return json.dumps({
        "rig": rig.name,
        "address": "127.0.0.1",
        "port": monitoring.exporter_port,
        "gpus": sorted(g.index for g in rig.spec.gpus),
        "models": {m.name: sorted(m.spec.gpus) for m in rig.models},
        "policy_path": GPU_POLICY_PATH,
        "keeper_state_path": GPU_KEEPER_STATE_PATH,
        "watchdog_state_dir": WATCHDOG_STATE_DIR,
        "verify_summary_dir": VERIFY_SUMMARY_DIR,
        "hung_after_s": EXPORTER_WATCHDOG_S,
    }, indent=1, sort_keys=True) + "\n"


def exporter_unit() -> str:
    return render("monitoring/rigkit-exporter.service.j2", exporter_path=EXPORTER_PATH,
                  config_path=EXPORTER_CONFIG_PATH, watchdog_s=EXPORTER_WATCHDOG_S)


def prometheus_args(rig: RigConfig) -> str:
    """/etc/default/prometheus: Debian's unit runs `prometheus $ARGS`. Loopback only, retention set."""
    monitoring = rig.spec.monitoring
    args = (f"--web.listen-address=127.0.0.1:{monitoring.prometheus_port} "
            f"--storage.tsdb.retention.time={monitoring.retention_days}d")
    return ("# Rendered by rigkit (roles/monitoring.py) from the rig file's `monitoring`; edits are overwritten.\n"
            f'ARGS="{args}"\n')


def prometheus_config(rig: RigConfig) -> str:
    monitoring = rig.spec.monitoring
    interval = f"{monitoring.scrape_interval_s}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [PROMETHEUS_RULES_PATH],
        "scrape_configs": [
            {"job_name": EXPORTER_JOB,
             "static_configs": [{"targets": [f"127.0.0.1:{monitoring.exporter_port}"], "labels": {"rig": rig.name}}]},
            {"job_name": VLLM_JOB,
             "static_configs": [{"targets": [f"127.0.0.1:{m.spec.port}"], "labels": {"rig": rig.name, "model": m.name}}
                                for m in rig.models]},
        ],
    }
    if not rig.models:
        config["scrape_configs"].pop()
    return ("# Rendered by rigkit (roles/monitoring.py) from the rig file; edits are overwritten.\n"
            + yaml.safe_dump(config, sort_keys=False))


def gpu_budget_w(rig: RigConfig) -> float:
    """What the GPUs may draw together within the PSU budget (rigkit.gpu.policy's arithmetic)."""
    spec = rig.spec
    return spec.psu_w * (1 - spec.psu_headroom_share) - spec.system_w


def recording_rules(rig: RigConfig) -> str:
    """Energy per output token per model (the GPUs' energy counter over the window divided by the
    generated tokens over the same window), and the power headroom against the PSU budget."""
    window = f"{rate_window_s(rig)}s"
    rules = [
        {"record": "rigkit:model_gpu_power_watts",
         "expr": (f"sum by (rig, model) (rigkit_model_gpu_info * on (instance, gpu) group_left "
                  f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[{window}])) / 1000")},
        {"record": "rigkit:model_generation_tokens_per_second",
         "expr": f"sum by (rig, model) (rate(vllm:generation_tokens_total[{window}]))"},
        {"record": "rigkit:model_joules_per_output_token",
         "expr": "rigkit:model_gpu_power_watts / (rigkit:model_generation_tokens_per_second > 0)"},
        {"record": "rigkit:rig_gpu_power_watts", "expr": "sum by (rig) (DCGM_FI_DEV_POWER_USAGE)"},
        {"record": "rigkit:rig_psu_headroom_watts",
         "expr": f"{gpu_budget_w(rig):g} - rigkit:rig_gpu_power_watts"},
    ]
    document = {"groups": [{"name": "rigkit", "rules": rules}]}
    return ("# Rendered by rigkit (roles/monitoring.py); edits are overwritten. docs/monitoring.md#recording-rules\n"
            + yaml.safe_dump(document, sort_keys=False, width=200))
