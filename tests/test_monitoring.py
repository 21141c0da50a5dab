"""Role monitoring end to end on the simulated rig: real pyinfra over SSH, real apt installing
Debian's real `prometheus` (2.42) and `python3-prometheus-client` from the local repository
(tests/simrig/aptrepo.py serves the .debs the host's apt downloaded), systemd running the exporter
and Prometheus, Prometheus scraping the exporter and the vLLM stand-in's /metrics.

The rig serves its models on every interface with an API key (`serve_address: 0.0.0.0`) to one client
(`serve_clients`), so the exporter listens there too and wants the key, Prometheus scrapes with it, and
the models' ports are closed by the rig's firewall to every other host (roles/surface.py; on the simulated
rig Debian's nft runs in a network namespace of the rig's own, tests/simrig/nft).

Simulated: the GPUs (NVML by tests/simrig/pynvml.py: steady draw at 92% of the enforced limit,
the energy counter consistent with it, Xid events from a file the test appends to; nvidia-smi by
tests/simrig/nvidia-smi) and vLLM (the stand-in). Assertions read Prometheus's HTTP API, the
exporter's HTTP answers and the rig's own nvidia-smi, stat and ps, not rigkit.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.conftest import ALONE_TEST_MODELS, RESULTS, alone_serving_rig, keeper_held_off, run_deploy
from tests.simrig.aptrepo import MONITORING_PACKAGES, AptRepos

pytestmark = pytest.mark.simrig

EXPORTER_PORT, PROMETHEUS_PORT = 19835, 19090  # the rig shares the host's network: not the defaults
MONITORING = (f"monitoring: {{enabled: true, exporter_port: {EXPORTER_PORT}, prometheus_port: {PROMETHEUS_PORT}, "
              "scrape_interval_s: 1}\n")
CLIENT = "127.0.0.7"  # the one host the rig file lets reach its models (serve_clients)
SERVED_MODELS = ALONE_TEST_MODELS  # the module runs beside the test models' (tests/conftest.py PROCESS_MODULES)
WAIT_S = 60
KEY = "mon key $HOME #x"  # kept byte for byte: `$` and `#` as Compose's raw env format keeps them


@pytest.fixture(scope="module")
def monitored(serving_rig, tmp_path_factory):
    """The serving rig with its apt pointed at the local repository (Debian's packages, no mirror),
    deployed once with monitoring on; yields (rig, rig file, first deploy's run)."""
    with AptRepos(debian=MONITORING_PACKAGES) as repos:
        code, out = serving_rig.exec(f"printf '%s' {shlex.quote(repos.distro_sources())} > /etc/apt/sources.list && "
                                     "rm -f /etc/apt/sources.list.d/* && apt-get update -q >/dev/null && "
                                     "apt-cache policy prometheus python3-prometheus-client")
        assert code == 0 and "Candidate: 2.42" in out and "Candidate: (none)" not in out, out
        folder = tmp_path_factory.mktemp("monitoring")
        key_file = folder / "rig.key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o600)
        path = alone_serving_rig(folder / "monitored.yml", f"serve_address: 0.0.0.0\napi_key_file: {key_file}\n"
                                 f"serve_clients: [{CLIENT}]\n" + MONITORING)
        first = run_deploy(serving_rig, path)
        if first.returncode != 0:  # what the services said, beside pyinfra's "Job ... failed"
            first.output += serving_rig.exec("journalctl -q --no-pager -n 40 -u rigkit-exporter -u prometheus")[1]
        yield serving_rig, path, first


def query(promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for(promql: str, what: str, timeout_s: float = WAIT_S) -> list[dict]:
    """The first non-empty answer to `promql` within timeout_s; fails saying what it waited for."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = query(promql)
        except OSError as exc:  # Prometheus not listening yet
            last = exc
        if isinstance(last, list) and last:
            return last
        time.sleep(0.5)
    pytest.fail(f"waited {timeout_s} s for {what} ({promql}); last answer: {last}")


def by_gpu(result: list[dict]) -> dict[str, float]:
    return {r["metric"]["gpu"]: float(r["value"][1]) for r in result}


def last_verification(folder):
    """The newest verification result file (named by its time); the rollout gate's and tune's
    documents beside it are named gate-* and tune-*."""
    return sorted(p for p in folder.glob("*.json") if not p.name.startswith(("gate-", "tune-")))[-1]


def exporter_answer(key: str | None) -> tuple[int, str]:
    """GET the exporter's /metrics at 127.0.0.2: a socket bound to 127.0.0.1 alone refuses it, one bound
    to every interface (what another machine on the LAN reaches) answers; tests stay on loopback."""
    request = urllib.request.Request(f"http://127.0.0.2:{EXPORTER_PORT}/metrics",
                                     headers={"Authorization": f"Bearer {key}"} if key is not None else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_deploy_installs_exporter_and_prometheus_which_scrapes_both_and_a_second_deploy_changes_nothing(monitored):
    rig, path, first = monitored
    assert first.returncode == 0, first.output[-5000:]
    code, out = rig.exec("dpkg-query -W -f '${Package} ${Version}\\n' prometheus python3-prometheus-client")
    assert code == 0 and "prometheus 2.42.0" in out, out
    code, out = rig.exec("systemctl is-active rigkit-exporter.service prometheus.service; "
                         "ss -ltnH | awk '{print $4}' | sort")
    assert out.split()[:2] == ["active", "active"], out
    # The models serve on every interface with a key: the exporter too; Prometheus stays on loopback
    assert f"0.0.0.0:{EXPORTER_PORT}" in out and f"127.0.0.1:{PROMETHEUS_PORT}" in out, out
    assert f"*:{PROMETHEUS_PORT}" not in out and f"0.0.0.0:{PROMETHEUS_PORT}" not in out, out

    # Every target up: the exporter (scraped with the key) and both models' /metrics (the stand-in's)
    up = wait_for('count(up == 1) == 3', "the exporter and both vLLM targets up")
    assert up
    assert query('up{job="rigkit-exporter", rig="monitored"}')[0]["value"][1] == "1"
    # Power and the configured cap, against the rig's nvidia-smi (an independent read of the limits; its
    # draw is an idle value, while the simulated NVML draws 92% of the enforced limit: docs/simulated-rig.md)
    code, out = rig.exec("nvidia-smi --query-gpu=index,power.draw,power.limit --format=csv,noheader,nounits")
    smi = {line.split(", ")[0]: (float(line.split(", ")[1]), float(line.split(", ")[2])) for line in out.splitlines()}
    power = by_gpu(wait_for("DCGM_FI_DEV_POWER_USAGE", "GPU power in Prometheus"))
    configured = by_gpu(wait_for("rigkit_gpu_power_limit_configured_watts", "the configured cap in Prometheus"))
    enforced = by_gpu(wait_for("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "the enforced limit in Prometheus"))
    for gpu in ("0", "1"):
        assert power[gpu] == pytest.approx(0.92 * smi[gpu][1], abs=0.5), (power, smi)
        assert enforced[gpu] == smi[gpu][1] == 330
        assert configured[gpu] == 330  # the rig file's power_limit_w
    assert by_gpu(query("rigkit_gpu_clock_lock_ceiling_mhz")) == {"0": 2200, "1": 2200}
    assert by_gpu(query("rigkit_gpu_policy_drift")) == {"0": 0, "1": 0}
    # The last verification's figures, as the deploy's result file has them
    result = json.loads(last_verification(RESULTS / path.stem / "alone-alpha").read_text())
    shown = wait_for('rigkit_verify_joules_per_output_token{model="alone-alpha"}', "the last verification's J/token")
    assert float(shown[0]["value"][1]) == pytest.approx(result["figures"]["joules_per_output_token"])
    # vLLM's own metrics arrive labelled with the catalog model
    assert {r["metric"]["model"] for r in wait_for("vllm:generation_tokens_total", "vLLM's token counter")} == \
        {"alone-alpha", "alone-beta"}

    second = run_deploy(rig, path)
    assert second.returncode == 0, second.output[-4000:]
    assert second.changed_operations() == 0, second.output[-6000:]


def test_on_the_lan_a_scrape_without_the_key_is_refused_and_the_key_is_in_no_world_readable_file(monitored):
    """From the LAN side: no key or a wrong one gets 401 (vLLM's answer), the key gets the metrics.
    On the rig: Prometheus's key file is its own, mode 600, in a folder only it enters; no file
    anyone may read holds the key (/etc, /usr/local, /var/lib, /run: systemd's credential copy
    included), and no command line or journal line shows it. The exporter's copy is readable by the
    exporter's own user alone (not nobody)."""
    rig, _, first = monitored
    assert first.returncode == 0, first.output[-3000:]
    assert exporter_answer(None)[0] == 401
    assert exporter_answer(KEY + "x")[0] == 401
    status, text = exporter_answer(KEY)
    assert status == 200 and "DCGM_FI_DEV_POWER_USAGE" in text
    code, out = rig.exec("stat -c '%a %U %G' /etc/prometheus/rigkit-keys /etc/prometheus/rigkit-keys/monitored.key")
    assert out.splitlines() == ["700 prometheus prometheus", "600 prometheus prometheus"], out
    code, out = rig.exec(f"grep -rlF -e {shlex.quote(KEY)} /etc /usr/local /var/lib /run 2>/dev/null "
                         "| xargs -r stat -c '%a %U %n'")
    holders = dict(line.split(" ", 1)[::-1] for line in out.splitlines())
    assert "prometheus /etc/prometheus/rigkit-keys/monitored.key" in holders, out  # the check finds keys at all
    assert all(int(mode[-1]) & 4 == 0 for mode in holders.values()), out  # none readable by others
    code, out = rig.exec("ps -eo args; journalctl -q --no-pager -u rigkit-exporter -u prometheus")
    assert code == 0 and KEY not in out and "Bearer" not in out, out
    # The exporter's copy is its own user's (systemd's DynamicUser), not nobody's, whom other services share.
    code, out = rig.exec("pid=$(systemctl show -p MainPID --value rigkit-exporter); stat -c '%u %U' /proc/$pid; "
                         "stat -c '%u %U %a' /run/rigkit-exporter/api-key.env")
    process, copy = out.splitlines()
    assert process.split()[0] == copy.split()[0] and "nobody" not in out and copy.endswith(" 400"), out


def test_an_xid_the_driver_reports_appears_in_prometheus(monitored):
    """Simulates the driver reporting Xid 79 (GPU fallen off the bus) on GPU 1, as an NVML event the
    exporter's watcher receives: Prometheus shows it counted on GPU 1 and as DCGM's last-Xid value;
    GPU 0 stays at 0."""
    rig, _, first = monitored
    assert first.returncode == 0, first.output[-3000:]
    wait_for('count(rigkit_gpu_xid_errors_total == 0) == 2', "both GPUs' Xid events watched, none yet")
    code, out = rig.exec("printf '1 79\\n' >> /run/nvidia-sim/xid-events")
    assert code == 0, out
    wait_for('rigkit_gpu_xid_errors_total{gpu="1"} == 1 and on (gpu) DCGM_FI_DEV_XID_ERRORS{gpu="1"} == 79',
             "Xid 79 on GPU 1 in Prometheus")
    assert by_gpu(query("rigkit_gpu_xid_errors_total")) == {"0": 0, "1": 1}
    assert by_gpu(query("DCGM_FI_DEV_XID_ERRORS")) == {"0": 0, "1": 79}


def test_a_limit_set_behind_rigkits_back_shows_as_drift_then_as_the_keepers_repair(monitored):
    """Simulates someone running `nvidia-smi -pl 300` on the rig: while the keeper holds off (as during
    a tune session) Prometheus sees the enforced limit 300 W against the configured 330 W; once the
    keeper may repair, its repair is counted (cause changed-by-hand) and the drift is gone."""
    rig, _, first = monitored
    assert first.returncode == 0, first.output[-3000:]
    before = query('sum(rigkit_gpu_policy_repairs_total{cause="changed-by-hand"})')
    before = float(before[0]["value"][1]) if before else 0.0
    with keeper_held_off(rig):
        code, out = rig.exec("nvidia-smi -i 0 -pl 300")
        assert code == 0, out
        wait_for('rigkit_gpu_policy_drift{gpu="0"} == 1 and on (gpu) DCGM_FI_DEV_ENFORCED_POWER_LIMIT{gpu="0"} == 300',
                 "GPU 0's drift (300 W enforced, 330 W configured) in Prometheus")
    wait_for(f'sum(rigkit_gpu_policy_repairs_total{{cause="changed-by-hand"}}) > {before}',
             "the keeper's repair counted in Prometheus")
    wait_for('rigkit_gpu_policy_drift{gpu="0"} == 0', "the drift gone after the repair")
    print(f"drift and repair seen in Prometheus", file=sys.stderr)


LOAD_S = 28  # back-to-back requests (about 9); the rule's window is 10 s (four 1 s scrapes, at least 10 s), so 13 s of full windows


def _verification_workload(port: int, seconds: float, key: str) -> int:
    """Verification's request (2048 prompt tokens, each prompt new so nothing is cached, 256 tokens out,
    streamed) sent back to back for `seconds`; returns how many completed."""
    import random

    import httpx

    done, deadline = 0, time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            words = " ".join(f"w{random.randrange(10**9)}" for _ in range(2048))
            with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions",
                               headers={"Authorization": f"Bearer {key}"},
                               json={"model": "alone-alpha", "prompt": words, "max_tokens": 256,
                                     "stream": True}) as response:
                assert response.status_code == 200
                for _ in response.iter_lines():
                    pass
            done += 1
    return done


def test_energy_per_token_from_prometheus_agrees_with_the_verification(monitored):
    """Simulates steady traffic of verification's own workload on alone-alpha for LOAD_S: Prometheus's
    rigkit:model_joules_per_output_token (the GPU's energy counter over the window divided by vLLM's
    generated tokens over it), averaged over the loaded part, agrees within 2% with the
    joules_per_output_token `rigkit verify` measured for one such request in this module's deploy."""
    rig, path, first = monitored
    assert first.returncode == 0, first.output[-3000:]
    verified = json.loads(last_verification(RESULTS / path.stem / "alone-alpha").read_text())
    expected = verified["figures"]["joules_per_output_token"]
    start = time.time()
    requests = _verification_workload(SERVED_MODELS["alone-alpha"], LOAD_S, KEY)
    end = time.time()
    # The rule's own samples, each stamped with its evaluation time: those of full windows inside the load
    # (15 s after it began: the windows reaching back before it are left out). Read as they are stamped, not
    # as of an instant, so a rule evaluated late on a loaded machine is still counted (a query at `end - 1`
    # once found none within 13 s before it).
    rule = 'rigkit:model_joules_per_output_token{model="alone-alpha"}'
    wait_for(f"count_over_time({rule}[{int(time.time() - start - 15) + 1}s]) > 0", "the energy-per-token rule's values")
    [series] = query(f"{rule}[{int(time.time() - start) + 2}s]")
    stamped = [(float(t) - start, float(v)) for t, v in series["values"]]
    loaded = [v for t, v in stamped if 15 <= t <= end - start]
    assert loaded, (f"no energy-per-token value stamped within the load's full windows (15 s to {end - start:.1f} s "
                    f"after it began); stamped at {[round(t, 1) for t, _ in stamped]} s")
    measured = sum(loaded) / len(loaded)
    print(f"energy per output token: Prometheus {measured:.4f} J, rigkit verify {expected:.4f} J "
          f"({measured / expected - 1:+.2%}); {requests} requests in {LOAD_S} s", file=sys.stderr)
    assert measured == pytest.approx(expected, rel=0.02)


def test_turning_it_off_removes_the_exporter_and_leaves_prometheus(monitored, tmp_path):
    """The rig file's monitoring.enabled set back to false: the exporter is stopped and its files removed;
    Debian's prometheus, a distribution package, stays installed; a second deploy changes nothing."""
    rig, path, first = monitored
    assert first.returncode == 0, first.output[-3000:]
    off = tmp_path / path.name  # same stem: the same rig
    off.write_text(path.read_text().replace("enabled: true", "enabled: false"))
    run = run_deploy(rig, off, verify=False)
    assert run.returncode == 0, run.output[-4000:]
    code, out = rig.exec("systemctl is-active rigkit-exporter.service; ls /usr/local/sbin/rigkit-exporter "
                         "/etc/rigkit/monitoring/exporter.json 2>&1; dpkg-query -W -f '${Status}' prometheus")
    assert out.splitlines()[0] in ("inactive", "failed", "unknown"), out
    assert out.count("No such file or directory") == 2 and "install ok installed" in out, out
    again = run_deploy(rig, off, verify=False)
    assert again.returncode == 0 and again.changed_operations() == 0, again.output[-4000:]


def test_the_models_ports_are_closed_to_every_host_but_the_rig_and_its_client_and_a_lost_table_comes_back(monitored):
    """The firewall rigkit loaded, as the rig's nft lists it (not rigkit's file): the models' ports, the client,
    the reset for everyone else; the unit that loads it at boot enabled; the deploy's warning about what the
    client reaches. A table flushed behind rigkit's back is loaded again by the next deploy, and only it; a
    reboot loads it at boot. Last in the module: it reboots the rig."""
    rig, path, first = monitored
    assert first.returncode == 0, first.output[-5000:]
    assert f"serve_clients {CLIENT}/32 reach the models' ports on every path" in first.output, first.output[-5000:]
    ports = ", ".join(str(p) for p in sorted(SERVED_MODELS.values()))
    code, listing = rig.exec("nft list table inet rigkit_surface; systemctl is-enabled rigkit-surface.service; "
                             "systemctl is-active rigkit-surface.service")
    assert code == 0, listing
    assert f"tcp dport {{ {ports} }} ip saddr {CLIENT} accept" in listing, listing
    assert f"tcp dport {{ {ports} }} reject with tcp reset" in listing, listing
    assert listing.split()[-2:] == ["enabled", "active"], listing

    assert run_deploy(rig, path).returncode == 0  # converged to this rig file (earlier tests deploy others)
    assert rig.exec("nft delete table inet rigkit_surface")[0] == 0  # as `nft flush ruleset` by hand would
    again = run_deploy(rig, path)
    assert again.returncode == 0, again.output[-4000:]
    assert again.changed_operations() == 1, again.output[-6000:]  # "Load the firewall now", nothing else
    assert rig.exec("nft list table inet rigkit_surface")[0] == 0
    assert run_deploy(rig, path).changed_operations() == 0

    # A reboot empties the kernel's ruleset; the unit loads it again before Docker starts the models.
    rig.reboot()
    code, listing = rig.exec("nft list table inet rigkit_surface")
    assert code == 0 and f"ip saddr {CLIENT} accept" in listing, listing

    # Back on loopback: nothing to close, so the table, the unit and the file go; then nothing changes.
    loopback = path.with_name("loopback.yml")
    loopback.write_text(path.read_text().replace("serve_address: 0.0.0.0\n", "").replace(f"serve_clients: [{CLIENT}]\n", ""))
    back = run_deploy(rig, loopback)
    assert back.returncode == 0, back.output[-4000:]
    assert rig.exec("nft list table inet rigkit_surface")[0] != 0
    code, left = rig.exec("ls /etc/rigkit/surface.nft /etc/systemd/system/rigkit-surface.service")
    assert code != 0 and left.count("No such file") == 2, left
    assert run_deploy(rig, loopback).changed_operations() == 0
