"""The monitoring pack's rendered files, pure: the exporter's settings and unit, Debian Prometheus's
config, ARGS file and rigkit's recording rules. Rendered only from the validated RigConfig; YAML and
JSON are written by their libraries (every value quoted as it needs), the unit from a template
whose values are rigkit's own paths and validated integers.

Per-model energy joins two scrapes: each vLLM target gets the label `model` (the catalog name) and
the exporter says which GPUs a model runs on (`rigkit_model_gpu_info{model, gpu}`). What a
Prometheus scrapes (one rig, or the fleet from the gateway's rig): rigkit.monitoring.fleet.
"""

from __future__ import annotations

import json

import yaml

from rigkit.config.schema import RigConfig
from rigkit.monitoring.fleet import ScrapedRig, exporter_on_lan, own_rig
from rigkit.plumbing.render import render
from rigkit.rigside.names import (
    EXPORTER_CONFIG_PATH,
    EXPORTER_KEY_PATH,
    EXPORTER_PATH,
    EXPORTER_RUNTIME_DIR_NAME,
    GPU_KEEPER_STATE_PATH,
    IDLE_ENERGY_PATH,
    GPU_POLICY_PATH,
    PROMETHEUS_RULES_PATH,
    SECRETS_ENV_FILE,
    STACKS_DIR,
    VERIFY_SUMMARY_DIR,
    WATCHDOG_STATE_DIR,
)

EXPORTER_WATCHDOG_S = 30  # no heartbeat this long (its HTTP server gone): systemd restarts the exporter
EXPORTER_NVML_READ_S = 5  # a scrape waits this long for NVML, then answers without the GPUs (nvml_up 0)
EXPORTER_JOB = "rigkit-exporter"
VLLM_JOB = "vllm"
MIN_RATE_WINDOW_S = 10


def rate_window_s(rig: RigConfig) -> int:
    """The recording rules' rate() window: four scrapes (Prometheus needs two samples in it)."""
    return max(4 * rig.spec.monitoring.scrape_interval_s, MIN_RATE_WINDOW_S)


def exporter_settings(rig: RigConfig) -> str:
    """What the exporter on the rig reads (JSON). On the LAN it wants the models' key, which its unit
    copies for it at each start (exporter_unit): the settings name the copy, never hold the key."""
    monitoring = rig.spec.monitoring
    lan = exporter_on_lan(rig)
    return json.dumps({
        "rig": rig.name,
        "address": "0.0.0.0" if lan else "127.0.0.1",
        "key_file": EXPORTER_KEY_PATH if lan else None,
        "port": monitoring.exporter_port,
        "gpus": sorted(g.index for g in rig.spec.gpus),
        "models": {m.name: sorted(m.spec.gpus) for m in rig.models},
        "policy_path": GPU_POLICY_PATH,
        "keeper_state_path": GPU_KEEPER_STATE_PATH,
        "idle_energy_path": IDLE_ENERGY_PATH,
        "watchdog_state_dir": WATCHDOG_STATE_DIR,
        "verify_summary_dir": VERIFY_SUMMARY_DIR,
        "stacks_dir": STACKS_DIR,
        "nvml_read_s": EXPORTER_NVML_READ_S,
    }, indent=1, sort_keys=True) + "\n"


def exporter_unit(rig: RigConfig) -> str:
    """The exporter runs as a user of its own (systemd's DynamicUser, `rigkit-exporter`). On the LAN it needs
    the models' key file, which is root's only: at each start a privileged ExecStartPre copies it into the
    exporter's runtime folder (mode 700, the copy 400, both that user's; systemd removes the folder when the
    exporter stops). Not systemd's LoadCredential=: with it the exporter did not start on the simulated rig
    (systemd in a container)."""
    lan = exporter_on_lan(rig)
    return render("monitoring/rigkit-exporter.service.j2", exporter_path=EXPORTER_PATH,
                  config_path=EXPORTER_CONFIG_PATH, watchdog_s=EXPORTER_WATCHDOG_S,
                  key_source=SECRETS_ENV_FILE if lan else None, key_path=EXPORTER_KEY_PATH,
                  runtime_dir=EXPORTER_RUNTIME_DIR_NAME)


def prometheus_args(rig: RigConfig) -> str:
    """/etc/default/prometheus: Debian's unit runs `prometheus $ARGS`. Loopback only, retention set."""
    monitoring = rig.spec.monitoring
    args = (f"--web.listen-address=127.0.0.1:{monitoring.prometheus_port} "
            f"--storage.tsdb.retention.time={monitoring.retention_days}d")
    return ("# Rendered by rigkit (roles/monitoring.py) from the rig file's `monitoring`; edits are overwritten.\n"
            f'ARGS="{args}"\n')


def prometheus_config(rig: RigConfig, scraped: list[ScrapedRig] | None = None) -> str:
    """`scraped`: what this Prometheus scrapes (rigkit.monitoring.fleet; default: the rig's own).
    A keyed rig's targets get its key as a bearer token from a file (never in this file)."""
    monitoring = rig.spec.monitoring
    interval = f"{monitoring.scrape_interval_s}s"
    scraped = own_rig(rig) if scraped is None else scraped
    jobs = []
    for job in (EXPORTER_JOB, VLLM_JOB):
        open_targets = [c for r in scraped if not r.key_file for c in _static_configs(job, r)]
        if open_targets:
            jobs.append({"job_name": job, "static_configs": open_targets})
        for r in scraped:  # one authorization per scrape config: a keyed rig's targets get one of their own,
            if r.key_file and (targets := _static_configs(job, r)):  # its series keeping the job's name
                jobs.append({"job_name": f"{job}/{r.label}", "static_configs": targets,
                             "authorization": {"type": "Bearer", "credentials_file": r.key_file},
                             "relabel_configs": [{"target_label": "job", "replacement": job}]})
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [PROMETHEUS_RULES_PATH],
        "scrape_configs": jobs,
    }
    return ("# Rendered by rigkit (roles/monitoring.py) from the rig file; edits are overwritten.\n"
            + yaml.safe_dump(config, sort_keys=False))


def _static_configs(job: str, rig: ScrapedRig) -> list[dict]:
    if job == EXPORTER_JOB:
        return [{"targets": [f"{rig.address}:{rig.exporter_port}"], "labels": {"rig": rig.label}}] \
            if rig.exporter_port else []
    return [{"targets": [f"{rig.address}:{port}"], "labels": {"rig": rig.label, "model": name}}
            for name, port in rig.models]


def recording_rules(rig: RigConfig, scraped: list[ScrapedRig] | None = None) -> str:
    """Energy per output token per model (the GPUs' energy counter over the window divided by the
    generated tokens over the same window), and the power headroom against the PSU budget of each
    scraped rig that runs an exporter (`scraped` as for prometheus_config)."""
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
    ]
    for scraped_rig in own_rig(rig) if scraped is None else scraped:  # each rig its own PSU budget
        rules.append({"record": "rigkit:rig_gpu_power_budget_watts", "expr": f"vector({scraped_rig.gpu_budget_w:g})",
                      "labels": {"rig": scraped_rig.label}})
    rules.append({"record": "rigkit:rig_psu_headroom_watts",
                  "expr": "rigkit:rig_gpu_power_budget_watts - on (rig) rigkit:rig_gpu_power_watts"})
    document = {"groups": [{"name": "rigkit", "rules": rules}]}
    return ("# Rendered by rigkit (roles/monitoring.py); edits are overwritten. docs/monitoring.md#recording-rules\n"
            + yaml.safe_dump(document, sort_keys=False, width=200))
