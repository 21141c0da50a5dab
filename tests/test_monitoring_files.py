"""The monitoring pack's rig file section and rendered files, without a rig or Docker.

The Prometheus config and recording rules are checked by Debian's own `promtool` (2.42, taken
out of the real prometheus .deb the simulated rig's apt repository serves: tests/simrig/aptrepo.py
downloads it once with the host's apt), so a rule Prometheus would refuse fails here too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.monitoring import files
from rigkit.rigside import metrics
from rigkit.rigside.names import PROMETHEUS_RULES_PATH
from tests.simrig.aptrepo import DEB_CACHE, MONITORING_PACKAGES, debian_debs

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "tests" / "data" / "models"
RIG = (REPO / "tests" / "data" / "rigs" / "serving.yml").read_text()


def rig_with(tmp_path, monitoring: str, os_line: str = "os: linux"):
    path = tmp_path / "mon.yml"
    path.write_text(RIG.replace("os: linux", os_line) + monitoring)
    return path


def refused(path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_rig(path, CATALOG)
    return "\n".join(str(p) for p in caught.value.problems)


def test_off_unless_the_rig_file_asks(tmp_path):
    rig = load_rig(rig_with(tmp_path, ""), CATALOG)
    assert rig.spec.monitoring.enabled is False
    on = load_rig(rig_with(tmp_path, "monitoring: {enabled: true}\n"), CATALOG).spec.monitoring
    assert (on.exporter_port, on.prometheus, on.prometheus_port, on.scrape_interval_s, on.retention_days) == \
        (9835, True, 9090, 15, 15)


@pytest.mark.parametrize("section, expected", [
    ("monitoring: {enabled: true, exporter_port: 80}\n", "monitoring.exporter_port"),
    ("monitoring: {enabled: true, scrape_interval_s: '15'}\n", "monitoring.scrape_interval_s"),
    ("monitoring: {enabled: true, retention: 15d}\n", "retention"),
    ("monitoring: {enabled: true, exporter_port: 9000, prometheus_port: 9000}\n",
     "port 9000 is the exporter_port too"),
    ("monitoring: {enabled: true, exporter_port: 18101}\n", "port 18101 is also the port of model test-alpha"),
], ids=["low-port", "quoted-number", "unknown-key", "same-port", "model-port"])
def test_bad_monitoring_sections_are_refused_with_file_and_field(tmp_path, section, expected):
    message = refused(rig_with(tmp_path, section))
    assert "mon.yml" in message and expected in message, message


def test_a_windows_rig_asking_for_monitoring_is_refused(tmp_path):
    text = RIG.replace("os: linux", "os: windows").replace("base: {install: false}\n", "")
    path = tmp_path / "win.yml"
    path.write_text(text + "monitoring: {enabled: true}\n")
    message = refused(path)
    assert "runs on Linux rigs only; Windows rigs are not covered (docs/monitoring.md)" in message, message


@pytest.fixture(scope="module")
def promtool(tmp_path_factory) -> Path:
    """Debian's promtool, out of the real prometheus .deb (downloaded once, cached)."""
    deb = next(d for d in debian_debs(MONITORING_PACKAGES) if d.name.startswith("prometheus_"))
    root = DEB_CACHE / f"{deb.stem}-root"
    if not (root / "usr/bin/promtool").is_file():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root / "usr/bin/promtool"


def test_prometheus_config_and_rules_pass_debians_promtool(tmp_path, promtool):
    rig = load_rig(rig_with(tmp_path, "monitoring: {enabled: true, scrape_interval_s: 5}\n"), CATALOG)
    config = yaml.safe_load(files.prometheus_config(rig))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["rigkit-exporter"]["static_configs"][0]["targets"] == ["127.0.0.1:9835"]
    assert [(c["targets"], c["labels"]["model"]) for c in jobs["vllm"]["static_configs"]] == \
        [(["127.0.0.1:18101"], "test-alpha"), (["127.0.0.1:18102"], "test-beta")]
    assert config["global"]["scrape_interval"] == "5s"
    rules = tmp_path / "rules.yml"
    rules.write_text(files.recording_rules(rig))
    assert "[20s]" in rules.read_text()  # four scrapes
    config["rule_files"] = [str(rules)]
    assert PROMETHEUS_RULES_PATH in files.prometheus_config(rig)
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    done = subprocess.run([str(promtool), "check", "config", str(checked)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout + done.stderr, done.stdout + done.stderr


def test_promtool_refuses_a_broken_rule(tmp_path, promtool):
    """The check can fail: a rule with a PromQL syntax error is refused (so the rig's check means something)."""
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n- name: x\n  rules:\n  - record: a:b\n    expr: sum by (model (x)\n")
    done = subprocess.run([str(promtool), "check", "rules", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


def test_rules_use_the_exporters_names_and_prometheus_listens_on_loopback(tmp_path):
    rig = load_rig(rig_with(tmp_path, "monitoring: {enabled: true, prometheus_port: 19090, retention_days: 30}\n"),
                   CATALOG)
    rules = files.recording_rules(rig)
    for name in ("rigkit_model_gpu_info", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_USAGE"):
        assert name in metrics.METRICS and name in rules
    # PSU budget of the test rig: 1200 W * (1 - 0.20) - 200 W system = 760 W for the GPUs
    assert "760 - rigkit:rig_gpu_power_watts" in rules
    assert files.prometheus_args(rig).endswith(
        'ARGS="--web.listen-address=127.0.0.1:19090 --storage.tsdb.retention.time=30d"\n')


def test_exporter_settings_and_unit(tmp_path):
    import json

    rig = load_rig(rig_with(tmp_path, "monitoring: {enabled: true}\n"), CATALOG)
    settings = json.loads(files.exporter_settings(rig))
    assert settings["address"] == "127.0.0.1" and settings["port"] == 9835
    assert settings["models"] == {"test-alpha": [0], "test-beta": [1]}
    unit = files.exporter_unit()
    assert "User=nobody" in unit and "WatchdogSec=30" in unit and "Type=notify" in unit
