"""The monitoring pack's Grafana dashboards (provisioning-ready JSON, Grafana's classic dashboard model):
one for a rig, one for a fleet. The files are templates/monitoring/rigkit-rig.json and
rigkit-fleet.json, written by `python -m rigkit.monitoring.dashboards`; tests/test_monitoring_dashboards.py
checks the files equal this module's output and type-checks them against Grafana's dashboard schema
(the npm package @grafana/schema). Every query names metrics the exporter, the recording rules or
vLLM expose (docs/monitoring.md#dashboards).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCHEMA_VERSION = 39  # Grafana 10.4/11's classic dashboard model
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILES = {"rig": "monitoring/rigkit-rig.json", "fleet": "monitoring/rigkit-fleet.json"}


def _panel(panel_id: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int,
           w: int = 12, h: int = 8, description: str = "", kind: str = "timeseries") -> dict:
    return {
        "id": panel_id, "type": kind, "title": title, "description": description, "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}} if kind == "timeseries" else {},
        "targets": [{"refId": chr(ord("A") + n), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                    for n, (expr, legend) in enumerate(targets)],
    }


def _variables(with_rig: bool) -> dict:
    variables = [{"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                  "hide": 0, "skipUrlSync": False}]
    if with_rig:
        variables.append({"name": "rig", "label": "Rig", "type": "query", "datasource": DATASOURCE,
                          "query": {"query": "label_values(rigkit_exporter_nvml_up, rig)", "refId": "rig"},
                          "refresh": 2, "hide": 0,
                          "includeAll": False, "multi": False, "skipUrlSync": False, "sort": 1})
    return {"list": variables}


def _dashboard(uid: str, title: str, description: str, panels: list[dict], with_rig: bool) -> dict:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["rigkit", "vllm", "gpu"],
        "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "timezone": "browser",
        "templating": _variables(with_rig), "annotations": {"list": []}, "links": [], "panels": panels,
    }


def rig_dashboard() -> dict:
    r = '{rig="$rig"}'
    rate = "[$__rate_interval]"
    panels = [
        _panel(1, "Decode tokens/s per model", "short", [
            (f"sum by (model) (rate(vllm:generation_tokens_total{r}{rate}))", "{{model}}")], 0, 0,
            description="Generated tokens per second, all requests of each model together (vLLM's counter)."),
        _panel(2, "Time to first token (p50, p95)", "s", [
            (f"histogram_quantile(0.5, sum by (le, model) (rate(vllm:time_to_first_token_seconds_bucket{r}{rate})))",
             "{{model}} p50"),
            (f"histogram_quantile(0.95, sum by (le, model) (rate(vllm:time_to_first_token_seconds_bucket{r}{rate})))",
             "{{model}} p95")], 12, 0, description="From vLLM's histogram: queueing and prefill together."),
        _panel(3, "Requests running and waiting", "short", [
            (f"sum by (model) (vllm:num_requests_running{r})", "{{model}} running"),
            (f"sum by (model) (vllm:num_requests_waiting{r})", "{{model}} waiting")], 0, 8,
            description="Waiting requests mean the engine is full: a queue in front of it."),
        _panel(4, "KV cache use", "percentunit", [
            (f"max by (model) (vllm:kv_cache_usage_perc{r} or vllm:gpu_cache_usage_perc{r})", "{{model}}")], 12, 8,
            description="Share of the KV cache blocks in use (vLLM v1's name, else v0's)."),
        _panel(5, "Power: draw vs enforced and configured cap", "watt", [
            (f"DCGM_FI_DEV_POWER_USAGE{r}", "GPU {{gpu}} draw"),
            (f"DCGM_FI_DEV_ENFORCED_POWER_LIMIT{r}", "GPU {{gpu}} enforced cap"),
            (f"rigkit_gpu_power_limit_configured_watts{r}", "GPU {{gpu}} configured cap")], 0, 16,
            description="An enforced cap away from the configured one is drift; draw pinned at the cap is the power limit at work."),
        _panel(6, "SM clock vs configured lock", "MHz", [
            (f"DCGM_FI_DEV_SM_CLOCK{r}", "GPU {{gpu}} SM clock"),
            (f"rigkit_gpu_clock_lock_ceiling_mhz{r}", "GPU {{gpu}} lock ceiling")], 12, 16,
            description="A lock cannot be read back: under load the clock should sit at or just below the ceiling."),
        _panel(7, "Energy per output token", "J", [
            (f"rigkit:model_joules_per_output_token{r}", "{{model}} (Prometheus)"),
            (f"rigkit_verify_joules_per_output_token{r}", "{{model}} (last verification)")], 0, 24,
            description="The model's GPUs' energy over the window divided by its generated tokens; idle time counts."),
        _panel(8, "Policy drift and keeper repairs", "short", [
            (f"sum(rigkit_gpu_policy_drift{r})", "GPUs drifted now"),
            (f"sum by (cause) (increase(rigkit_gpu_policy_repairs_total{r}[1h]))", "repairs/h: {{cause}}"),
            (f"sum by (model) (rigkit_watchdog_restarts_last_hour{r})", "watchdog restarts/h: {{model}}")], 12, 24,
            description="Drift: enforced cap differs from the rig file's. Repairs: the keeper re-applied the policy."),
        _panel(9, "Temperature and throttle reasons", "celsius", [
            (f"DCGM_FI_DEV_GPU_TEMP{r}", "GPU {{gpu}} °C"),
            (f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{r}", "GPU {{gpu}} reasons (bitmask)")], 0, 32,
            description="Reasons: 0x4 power cap, 0x20/0x40 thermal, 0x80 power brake."),
        _panel(10, "PSU headroom for the GPUs", "watt", [
            (f"rigkit:rig_psu_headroom_watts{r}", "headroom")], 12, 32,
            description="The rig file's PSU budget for the GPUs minus what they draw now."),
        _panel(11, "Xid errors", "short", [
            (f"increase(rigkit_gpu_xid_errors_total{r}[1h])", "GPU {{gpu}} Xids/h"),
            (f"DCGM_FI_DEV_XID_ERRORS{r}", "GPU {{gpu}} last Xid")], 0, 40, w=24,
            description="Xid errors the driver reported since the exporter started watching (NVML events); the last "
                        "one's number (e.g. 79: fallen off the bus). The kernel log has each: journalctl -k | grep Xid."),
    ]
    return _dashboard("rigkit-rig", "rigkit: rig", "One rig: throughput, latency, queue, KV cache, watts vs cap, "
                      "clocks vs lock, energy per token, drift (rigkit's monitoring pack).", panels, with_rig=True)


def fleet_dashboard() -> dict:
    rate = "[$__rate_interval]"
    panels = [
        _panel(1, "Decode tokens/s per rig", "short", [
            (f"sum by (rig) (rate(vllm:generation_tokens_total{rate}))", "{{rig}}")], 0, 0),
        _panel(2, "GPU power per rig", "watt", [("rigkit:rig_gpu_power_watts", "{{rig}}")], 12, 0),
        _panel(3, "Energy per output token", "J", [
            ("rigkit:model_joules_per_output_token", "{{rig}} {{model}}")], 0, 8),
        _panel(4, "PSU headroom per rig", "watt", [("rigkit:rig_psu_headroom_watts", "{{rig}}")], 12, 8),
        _panel(5, "Requests waiting per rig", "short", [
            ("sum by (rig) (vllm:num_requests_waiting)", "{{rig}}")], 0, 16),
        _panel(6, "Drifted GPUs and repairs per rig", "short", [
            ("sum by (rig) (rigkit_gpu_policy_drift)", "{{rig}} drifted now"),
            ("sum by (rig) (increase(rigkit_gpu_policy_repairs_total[1h]))", "{{rig}} repairs/h")], 12, 16),
        _panel(7, "Exporters answering NVML", "short", [("rigkit_exporter_nvml_up", "{{rig}}")], 0, 24, w=12,
               h=6, kind="stat"),
        _panel(8, "Xid errors per rig (last hour)", "short", [
            ("sum by (rig) (increase(rigkit_gpu_xid_errors_total[1h]))", "{{rig}}")], 12, 24, w=12, h=6, kind="stat"),
    ]
    return _dashboard("rigkit-fleet", "rigkit: fleet", "Every rig: throughput, power, energy per token, PSU "
                      "headroom, queue, drift and Xid errors (rigkit's monitoring pack).", panels, with_rig=False)


def dashboard_files() -> dict[str, str]:
    """{template path: JSON text} of both dashboards."""
    return {FILES["rig"]: json.dumps(rig_dashboard(), indent=2, ensure_ascii=False) + "\n",
            FILES["fleet"]: json.dumps(fleet_dashboard(), indent=2, ensure_ascii=False) + "\n"}


def main() -> int:
    from rigkit.plumbing.render import TEMPLATES

    for name, text in dashboard_files().items():
        Path(TEMPLATES, name).write_text(text)
        print(f"wrote {Path(TEMPLATES, name)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
