"""The monitoring exporter's metric set (rigkit.rigside.metrics), without a rig or Docker.

Simulated: NVML, by a small object with pynvml's function names (`FakeNvml`: one RTX 4090 at 300 W of
a 330 W enforced limit; calls missing or NotSupported where a GeForce card or an old binding has
none), and the rig's state files as the keeper, the watchdog and the verify role write them. The
families go through the real prometheus-client (the version Debian 12 ships) and its own parser
reads the exposition back.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import core
from prometheus_client.parser import text_string_to_metric_families

from rigkit.rigside import metrics, xid

REPO = Path(__file__).resolve().parents[1]


class NotSupported(Exception):
    pass


class FakeNvml:
    """pynvml's calls, as the exporter makes them, for one GPU."""

    def __init__(self, enforced_mw=330_000, ecc=False, event_reasons_name=True):
        self.enforced_mw = enforced_mw
        self.ecc = ecc
        if event_reasons_name:
            self.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4
        else:  # nvidia-ml-py before 12.535 names it "throttle reasons"
            self.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetPowerUsage(self, h):
        return 300_123

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return 330_000

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 450_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self.enforced_mw

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {1: 2190, 2: 10501}[clock]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return 3105

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 66

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123_456_789

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        if not self.ecc:
            raise NotSupported("Not Supported")
        return 7 if kind == 0 else 0

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-1234"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA GeForce RTX 4090"


POLICY = """# rigkit GPU policy for rig sim. Rendered by rigkit
# index  power_limit_w  clock_lock_mhz  [clock_offsets_mhz memory,graphics]
0 330 0,2200
1 default default 1000,0
"""
KEEPER = {"counts": {"resume": 1, "driver": 0, "reset": 0, "changed-by-hand": 2},
          "events": [{"time": "2026-12-02T01:00:00+00:00", "cause": "changed-by-hand", "ok": True}], "holding": None}
NOW = 1_790_000_000.0


def scrape(readings, **kwargs):
    """The exposition text prometheus-client writes for one scrape, parsed back by its own parser."""
    args = dict(policy=metrics.parse_policy(POLICY), keeper_state=KEEPER, watchdog_states={}, verifications={},
                model_gpus={}, now=NOW)
    args.update(kwargs)
    families = metrics.build(readings, **args)

    class Collector:
        def collect(self):
            return metrics.to_prometheus(families, core)

    registry = CollectorRegistry()
    registry.register(Collector())
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def value(samples, name, **labels):
    found = [v for (n, ls), v in samples.items() if n == name and all(dict(ls).get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_a_gpu_is_exposed_under_dcgm_names_in_dcgm_units():
    text, samples = scrape([metrics.read_gpu(FakeNvml(), 0)])
    gpu = dict(gpu="0", UUID="GPU-1234", modelName="NVIDIA GeForce RTX 4090", device="nvidia0")
    assert value(samples, "DCGM_FI_DEV_POWER_USAGE", **gpu) == pytest.approx(300.123)
    assert value(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT", gpu="0") == 330
    assert value(samples, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu="0") == 330
    assert value(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", gpu="0") == 450
    assert value(samples, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 2190
    assert value(samples, "DCGM_FI_DEV_MEM_CLOCK", gpu="0") == 10501
    assert value(samples, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 66
    assert value(samples, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0") == 123_456_789  # mJ, DCGM's unit
    assert value(samples, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="0") == 4
    # DCGM's exact names: no `_total` added to its counters
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    # a GeForce card has no ECC: left out, not 0
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in text
    assert value(samples, "rigkit_exporter_nvml_up") == 1


def test_ecc_counts_and_the_older_throttle_call_are_read_where_nvml_has_them():
    _, samples = scrape([metrics.read_gpu(FakeNvml(ecc=True, event_reasons_name=False), 0)])
    assert value(samples, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu="0") == 7
    assert value(samples, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0") == 0
    assert value(samples, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="0") == 4


def test_configured_cap_and_lock_come_from_the_policy_file_and_drift_is_flagged():
    readings = [metrics.read_gpu(FakeNvml(enforced_mw=300_000), 0), metrics.read_gpu(FakeNvml(enforced_mw=450_000), 1)]
    text, samples = scrape(readings)
    assert value(samples, "rigkit_gpu_power_limit_configured_watts", gpu="0") == 330
    assert value(samples, "rigkit_gpu_clock_lock_floor_mhz", gpu="0") == 0
    assert value(samples, "rigkit_gpu_clock_lock_ceiling_mhz", gpu="0") == 2200
    assert value(samples, "rigkit_gpu_policy_drift", gpu="0") == 1  # 300 W enforced, 330 W configured
    # "default": the driver's default limit (450 W here), which GPU 1 has; no lock configured: no lock series
    assert value(samples, "rigkit_gpu_power_limit_configured_watts", gpu="1") == 450
    assert value(samples, "rigkit_gpu_policy_drift", gpu="1") == 0
    assert 'rigkit_gpu_clock_lock_ceiling_mhz{' in text and 'gpu="1"' not in text.split("rigkit_gpu_clock_lock_ceiling_mhz{")[-1].split("\n")[0]


def test_keeper_repairs_watchdog_restarts_and_the_last_verification_per_model():
    watchdog = {"alpha": {"restarts": [NOW - 4000, NOW - 100, NOW - 50], "last_restart": NOW - 50}}
    verified = {"alpha": metrics.verification_summary({
        "time": "2026-12-02T01:00:00+00:00", "passed": True, "telemetry_simulated": True,
        "figures": {"decode_tok_s": 101.5, "ttft_s": 0.52, "joules_per_output_token": 2.75}})}
    _, samples = scrape([metrics.read_gpu(FakeNvml(), 0)], watchdog_states=watchdog, verifications=verified,
                        model_gpus={"alpha": [0]})
    assert value(samples, "rigkit_gpu_policy_repairs_total", cause="changed-by-hand") == 2
    assert value(samples, "rigkit_gpu_policy_repairs_total", cause="resume") == 1
    assert value(samples, "rigkit_gpu_policy_last_repair_ok") == 1
    assert value(samples, "rigkit_gpu_policy_keeper_holding") == 0
    assert value(samples, "rigkit_watchdog_restarts_last_hour", model="alpha") == 2  # the one 4000 s ago is out
    assert value(samples, "rigkit_verify_decode_tokens_per_second", model="alpha") == 101.5
    assert value(samples, "rigkit_verify_ttft_seconds", model="alpha") == 0.52
    assert value(samples, "rigkit_verify_joules_per_output_token", model="alpha") == 2.75
    assert value(samples, "rigkit_verify_passed", model="alpha") == 1
    assert value(samples, "rigkit_model_gpu_info", model="alpha", gpu="0") == 1


def test_the_last_proven_start_per_model_its_phases_and_its_compile_cache():
    """The startup table rigkit-stack keeps (rigside.startup, from a real vLLM start's log) as series."""
    from rigkit.rigside.startup import stamp, startup
    from tests.test_startup_table import COLD, COLD_STARTED

    start = startup(COLD, COLD_STARTED, ready_at=COLD_STARTED + 52.0)
    _, samples = scrape(None, starts={"alpha": start, "beta": {"phases": ["x"], "total_s": "long"}})
    assert value(samples, "rigkit_model_start_seconds", model="alpha") == 52.0
    assert value(samples, "rigkit_model_start_timestamp_seconds", model="alpha") == stamp("2026-12-04T17:48:28.77559812Z")
    assert 24 <= value(samples, "rigkit_model_start_phase_seconds", model="alpha", phase="compile") <= 25
    assert value(samples, "rigkit_model_start_compile_cache_hit", model="alpha") == 0
    assert not [v for (n, ls), v in samples.items() if dict(ls).get("model") == "beta"]  # a broken file: nothing


def test_nvml_down_says_so_and_still_serves_rigkits_own_figures():
    text, samples = scrape(None)
    assert value(samples, "rigkit_exporter_nvml_up") == 0
    assert "DCGM_FI_DEV_POWER_USAGE" not in text
    assert value(samples, "rigkit_gpu_policy_repairs_total", cause="changed-by-hand") == 2


def test_broken_state_files_leave_their_metrics_out():
    """A state file half-written by hand or of another shape: nothing from it, no crash."""
    _, samples = scrape([metrics.read_gpu(FakeNvml(), 0)], keeper_state={"counts": {"resume": "many"}, "events": ["x"]},
                        watchdog_states={"alpha": {"restarts": ["soon"], "last_restart": "yesterday"}},
                        verifications={"alpha": {"decode_tok_s": "fast", "passed": "yes"}})
    assert not [k for k in samples if k[0] == "rigkit_gpu_policy_repairs_total" and dict(k[1])["cause"] == "resume"]
    assert value(samples, "rigkit_watchdog_restarts_last_hour", model="alpha") == 0
    assert not [k for k in samples if k[0].startswith("rigkit_verify_")]


def test_policy_file_parsing_matches_what_the_deploy_renders():
    """The exporter reads the policy file the gpu_policy role renders (templates/gpu_policy/gpu-policy.conf.j2)."""
    from rigkit.config.loader import load_rig
    from rigkit.plumbing.render import render

    rig = load_rig(REPO / "tests/data/rigs/serving.yml", REPO / "tests/data/models")
    text = render("gpu_policy/gpu-policy.conf.j2", rig_name=rig.name, rig_file=rig.file, gpus=rig.spec.gpus)
    assert metrics.parse_policy(text) == {0: {"limit": "330", "lock": (0, 2200)}, 1: {"limit": "330", "lock": (0, 2200)}}


def test_the_exporter_script_builds_its_metrics_from_the_runtime():
    """The script on the rig takes names and the metric set from the shipped runtime, and reads
    NVML only inside a scrape (nothing at import or registration)."""
    source = (REPO / "templates/monitoring/rigkit-exporter.py").read_text()
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "rigside"
                for alias in node.names}
    assert {"metrics", "names", "atomic"} <= imported
    assert "def describe(self):" in source  # REGISTRY.register then does not call collect()
    from tests.test_layout import code_strings

    spelled = [(line, text) for line, text in code_strings(source) for name in metrics.METRICS if name in text]
    assert not spelled, f"metric names spelled in the script (they belong in rigside.metrics): {spelled}"


def exporter_module(monkeypatch):
    """templates/monitoring/rigkit-exporter.py loaded as a module, on the runtime and the fake NVML."""
    import sys

    monkeypatch.setenv("RIGKIT_LIB_DIR", str(REPO / "rigkit"))
    monkeypatch.setitem(sys.modules, "rigside", importlib.import_module("rigkit.rigside"))
    for name in ("atomic", "keyfile", "metrics", "names", "sdnotify", "xid"):
        monkeypatch.setitem(sys.modules, f"rigside.{name}", importlib.import_module(f"rigkit.rigside.{name}"))
    fake = FakeNvml()
    fake.nvmlInit = lambda: None
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    spec = importlib.util.spec_from_file_location("rigkit_exporter", REPO / "templates/monitoring/rigkit-exporter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def collector_on_files(module, tmp_path, nvml_read_s: float) -> CollectorRegistry:
    """A registry holding the script's collector for GPU 0 and model alpha, its policy and keeper state
    written in tmp_path (POLICY, KEEPER)."""
    import json

    (tmp_path / "policy").write_text(POLICY)
    (tmp_path / "keeper.json").write_text(json.dumps(KEEPER))
    settings = {"gpus": [0], "models": {"alpha": [0]}, "policy_path": str(tmp_path / "policy"),
                "keeper_state_path": str(tmp_path / "keeper.json"), "watchdog_state_dir": str(tmp_path),
                "verify_summary_dir": str(tmp_path), "stacks_dir": str(tmp_path), "nvml_read_s": nvml_read_s}
    registry = CollectorRegistry()
    registry.register(module.RigCollector(settings, xid.XidCounts()))
    return registry


def test_the_exporter_collects_through_prometheus_client_with_a_fake_nvml(tmp_path, monkeypatch):
    """The script's collector, loaded as a module, on the fake NVML and state files in tmp_path."""
    registry = collector_on_files(exporter_module(monkeypatch), tmp_path, nvml_read_s=1)
    text = generate_latest(registry).decode()
    assert 'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-1234",device="nvidia0",gpu="0",modelName="NVIDIA GeForce RTX 4090"} 300.123' in text
    assert 'rigkit_gpu_policy_repairs_total{cause="changed-by-hand"} 2.0' in text


def test_on_the_lan_the_exporter_wants_the_key_and_never_starts_without_it(tmp_path, monkeypatch, capsys):
    """The key as the unit hands it over (a copy of the models' env file): a request
    without it, with another or with it in another form gets 401; with it, the metrics. Settings that
    ask for a key systemd did not pass: the exporter stops before it listens (exit 2, saying why)."""
    import json
    from wsgiref.util import setup_testing_defaults

    from prometheus_client import make_wsgi_app

    module = exporter_module(monkeypatch)
    key = "k $HOME #x"
    (tmp_path / "api-key.env").write_text(f"VLLM_API_KEY={key}\n")
    assert module.lan_key(str(tmp_path / "api-key.env")) == key
    registry = CollectorRegistry()
    registry.register(module.RigCollector({"gpus": [0], "models": {}, "policy_path": "/nonexistent",
                                           "keeper_state_path": "/nonexistent", "watchdog_state_dir": "/nonexistent",
                                           "verify_summary_dir": "/nonexistent", "stacks_dir": "/nonexistent"}, xid.XidCounts()))
    app = module.keyed(make_wsgi_app(registry), key)

    def get(header):
        environ = {"PATH_INFO": "/metrics", **({"HTTP_AUTHORIZATION": header} if header is not None else {})}
        setup_testing_defaults(environ)
        answer = {}
        body = b"".join(app(environ, lambda status, headers: answer.update(status=status)))
        return answer["status"], body.decode()

    for header in (None, "Bearer other", f"bearer {key}", key, f"Bearer {key} "):
        assert get(header) == ("401 Unauthorized", '{"error": "Unauthorized"}'), header
    status, body = get(f"Bearer {key}")
    assert status.startswith("200") and "DCGM_FI_DEV_POWER_USAGE" in body

    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"address": "127.0.0.1", "port": 1, "gpus": [0], "models": {},
                                    "key_file": str(tmp_path / "missing.env")}))
    assert module.main(["rigkit-exporter", str(settings)]) == 2
    said = capsys.readouterr().out
    assert "missing.env (No such file or directory)" in said and "not serving the LAN without it" in said, said


def test_a_hung_nvml_costs_one_bounded_wait_then_none_and_rigkits_own_series_stay(tmp_path, monkeypatch):
    """Simulated: NVML hung (the fake's power read blocks until released, as a wedged driver's call does). The
    first scrape waits `nvml_read_s` for the read it started, then answers with nvml_up 0 and the keeper's
    series; the next scrapes find that read still going and answer at once, starting no second one; once it
    returns (the driver answers again), a scrape reads the GPUs again."""
    import sys
    import threading
    import time

    module = exporter_module(monkeypatch)
    fake = sys.modules["pynvml"]
    released, calls = threading.Event(), []

    def hung_power(handle):
        calls.append(handle)
        released.wait(30)
        return 300_123
    fake.nvmlDeviceGetPowerUsage = hung_power
    registry = collector_on_files(module, tmp_path, nvml_read_s=0.5)
    try:
        started = time.monotonic()
        first = generate_latest(registry).decode()
        took_first = time.monotonic() - started
        started = time.monotonic()
        later = [generate_latest(registry).decode() for _ in range(3)]
        took_later = time.monotonic() - started
        for text in (first, *later):
            assert "rigkit_exporter_nvml_up 0.0" in text and "DCGM_FI_DEV_POWER_USAGE{" not in text, text
            assert 'rigkit_gpu_policy_repairs_total{cause="changed-by-hand"} 2.0' in text
        assert 0.4 < took_first < 3 and took_later < 0.5, (took_first, took_later)
        assert len(calls) == 1  # one read, stuck; no second one started beside it
    finally:
        released.set()
    deadline = time.monotonic() + 10
    while "rigkit_exporter_nvml_up 1.0" not in (text := generate_latest(registry).decode()):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    assert 'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-1234",device="nvidia0",gpu="0",modelName="NVIDIA GeForce RTX 4090"}' in text
