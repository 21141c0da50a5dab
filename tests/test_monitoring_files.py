"""The monitoring pack's rig file section and rendered files, without a rig or Docker.

The Prometheus config and recording rules are checked by Debian's own `promtool` (2.42, taken
out of the real prometheus .deb the simulated rig's apt repository serves: tests/simrig/aptrepo.py
downloads it once with the host's apt), so a rule Prometheus would refuse fails here too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.monitoring import files
from rigkit.rigside import metrics
from rigkit.rigside.names import PROMETHEUS_KEYS_DIR, PROMETHEUS_RULES_PATH, SECRETS_ENV_FILE
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
        # Unpacked beside and renamed into place whole: `./run quick`'s processes may ask at once, and
        # unpacking over a promtool another process is running fails it with "Text file busy" (seen).
        part = root.with_name(f"{root.name}.{os.getpid()}.part")
        shutil.rmtree(part, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(part)], check=True)
        try:
            part.rename(root)
        except OSError:  # another process put it there first
            shutil.rmtree(part, ignore_errors=True)
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
    assert "SUCCESS: 6 rules found" in done.stdout + done.stderr, done.stdout + done.stderr


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
    budget = [r for r in yaml.safe_load(rules)["groups"][0]["rules"] if r["record"] == "rigkit:rig_gpu_power_budget_watts"]
    assert budget == [{"record": "rigkit:rig_gpu_power_budget_watts", "expr": "vector(760)", "labels": {"rig": "mon"}}]
    assert files.prometheus_args(rig).endswith(
        'ARGS="--web.listen-address=127.0.0.1:19090 --storage.tsdb.retention.time=30d"\n')


def test_exporter_settings_and_unit(tmp_path):
    import json

    rig = load_rig(rig_with(tmp_path, "monitoring: {enabled: true}\n"), CATALOG)
    settings = json.loads(files.exporter_settings(rig))
    assert settings["address"] == "127.0.0.1" and settings["port"] == 9835
    assert settings["models"] == {"test-alpha": [0], "test-beta": [1]}
    unit = files.exporter_unit(rig)
    assert "\nDynamicUser=yes\nUser=rigkit-exporter\n" in unit and "User=nobody" not in unit
    assert "WatchdogSec=30" in unit and "Type=notify" in unit
    assert settings["key_file"] is None and "ExecStartPre" not in unit and "RuntimeDirectory" not in unit


KEYED = "api_key_file: rig.key\nserve_address: 0.0.0.0\n"


def test_on_the_lan_the_exporter_listens_everywhere_and_gets_the_key_from_systemd_not_from_a_file(tmp_path):
    """A rig serving its models on every interface (with a key): the exporter listens there too and
    its unit copies the models' key file (root's) for it at each start, into its runtime folder; its
    settings and unit name files, never the key."""
    import json

    rig = load_rig(rig_with(tmp_path, KEYED + "monitoring: {enabled: true}\n"), CATALOG)
    settings = json.loads(files.exporter_settings(rig))
    assert (settings["address"], settings["key_file"]) == ("0.0.0.0", "/run/rigkit-exporter/api-key.env")
    unit = files.exporter_unit(rig)
    assert "\nRuntimeDirectory=rigkit-exporter\nRuntimeDirectoryMode=0700\n" in unit and "User=rigkit-exporter" in unit
    assert (f"\nExecStartPre=+/bin/sh -c 'install -m 400 {SECRETS_ENV_FILE} /run/rigkit-exporter/api-key.env && "
            "chown --reference=/run/rigkit-exporter /run/rigkit-exporter/api-key.env'\n") in unit
    # a key file but models on 127.0.0.1: the exporter stays there, wanting nothing
    loopback = load_rig(rig_with(tmp_path, "api_key_file: rig.key\nmonitoring: {enabled: true}\n"), CATALOG)
    assert json.loads(files.exporter_settings(loopback))["address"] == "127.0.0.1"
    assert "ExecStartPre" not in files.exporter_unit(loopback)


def promtool_check(promtool, tmp_path, config_text: str, rules_text: str) -> str:
    """promtool check config on the rendered config, its rule file and key files pointed into tmp_path
    (promtool stats every credentials_file); returns its output, failing on a refusal."""
    config = yaml.safe_load(config_text)
    rules = tmp_path / "rules.yml"
    rules.write_text(rules_text)
    config["rule_files"] = [str(rules)]
    for job in config["scrape_configs"]:
        if "authorization" in job:
            key = tmp_path / Path(job["authorization"]["credentials_file"]).name
            key.write_text("the key")
            job["authorization"]["credentials_file"] = str(key)
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    done = subprocess.run([str(promtool), "check", "config", str(checked)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_keyed_rig_is_scraped_with_its_key_from_a_file_only_prometheus_reads(tmp_path, promtool):
    rig = load_rig(rig_with(tmp_path, KEYED + "monitoring: {enabled: true}\n"), CATALOG)
    text = files.prometheus_config(rig)
    config = yaml.safe_load(text)
    key_file = f"{PROMETHEUS_KEYS_DIR}/mon.key"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"rigkit-exporter/mon", "vllm/mon"}
    for name, job in (("rigkit-exporter", jobs["rigkit-exporter/mon"]), ("vllm", jobs["vllm/mon"])):
        assert job["authorization"] == {"type": "Bearer", "credentials_file": key_file}
        assert job["relabel_configs"] == [{"target_label": "job", "replacement": name}]  # series keep the job's name
    assert jobs["rigkit-exporter/mon"]["static_configs"] == [{"targets": ["127.0.0.1:9835"], "labels": {"rig": "mon"}}]
    assert "SUCCESS" in promtool_check(promtool, tmp_path, text, files.recording_rules(rig))


def views(tmp_path, c_text: str = ""):
    """Rig a runs the gateway (models on 127.0.0.1, no key); b serves on every interface with a key;
    c (when given) runs an exporter and no model."""
    from rigkit.config.inventory import RigView
    from rigkit.config.schema import GatewaySpec

    folder = tmp_path / "fleet"
    folder.mkdir(exist_ok=True)
    texts = {"a": RIG + "monitoring: {enabled: true}\n",
             "b": RIG.replace("psu_w: 1200", "psu_w: 1600") + KEYED + "monitoring: {enabled: true, exporter_port: 9900}\n"}
    if c_text:
        texts["c"] = RIG.replace("models: [test-alpha, test-beta]", "models: []") + c_text
    out = []
    for name, text in texts.items():
        (folder / f"{name}.yml").write_text(text)
        out.append(RigView(host=f"rig-{name}", rig=load_rig(folder / f"{name}.yml", CATALOG), address=f"10.0.0.{len(out) + 1}",
                           gateway=GatewaySpec(master_key_file="master.key") if name == "a" else None))
    return out


def test_the_gateway_rigs_prometheus_scrapes_every_rigs_exporter_and_models(tmp_path, promtool):
    from rigkit.monitoring.fleet import fleet

    rigs = views(tmp_path)
    scraped = fleet(rigs, "rig-a")
    text = files.prometheus_config(rigs[0].rig, scraped)
    config = yaml.safe_load(text)
    targets = {(job["job_name"], t, tuple(sorted(c["labels"].items())))
               for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert targets == {
        ("rigkit-exporter", "127.0.0.1:9835", (("rig", "rig-a"),)),
        ("vllm", "127.0.0.1:18101", (("model", "test-alpha"), ("rig", "rig-a"))),
        ("vllm", "127.0.0.1:18102", (("model", "test-beta"), ("rig", "rig-a"))),
        ("rigkit-exporter/rig-b", "10.0.0.2:9900", (("rig", "rig-b"),)),
        ("vllm/rig-b", "10.0.0.2:18101", (("model", "test-alpha"), ("rig", "rig-b"))),
        ("vllm/rig-b", "10.0.0.2:18102", (("model", "test-beta"), ("rig", "rig-b"))),
    }
    keyed = [job for job in config["scrape_configs"] if "authorization" in job]
    assert {job["authorization"]["credentials_file"] for job in keyed} == {f"{PROMETHEUS_KEYS_DIR}/rig-b.key"}
    rules = files.recording_rules(rigs[0].rig, scraped)
    # each rig's headroom against its own PSU: a 1200 W * 0.8 - 200 = 760 W, b 1600 W * 0.8 - 200 = 1080 W
    budgets = {r["labels"]["rig"]: r["expr"] for r in yaml.safe_load(rules)["groups"][0]["rules"]
               if r["record"] == "rigkit:rig_gpu_power_budget_watts"}
    assert budgets == {"rig-a": "vector(760)", "rig-b": "vector(1080)"}
    checked = promtool_check(promtool, tmp_path, text, rules)
    assert "SUCCESS: 7 rules found" in checked and "inconsistency" not in checked, checked


def test_a_fleet_rig_whose_exporter_the_gateway_cannot_reach_is_refused_in_one_line(tmp_path):
    from rigkit.config.inventory import RigConfigError
    from rigkit.monitoring.fleet import fleet

    with pytest.raises(RigConfigError) as caught:
        fleet(views(tmp_path, "monitoring: {enabled: true}\n"), "rig-a")
    message = str(caught.value)
    assert "\n" not in message and "c.yml" in message and "cannot reach the exporter of rig rig-c" in message
    assert "serve_address: 0.0.0.0 (with api_key_file)" in message, message
    # the same rig with its monitoring off has nothing to scrape: left out
    assert [r.label for r in fleet(views(tmp_path, "monitoring: {enabled: false}\n"), "rig-a")] == ["rig-a", "rig-b"]
