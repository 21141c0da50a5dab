"""The gateway's LiteLLM config, rendered offline from an inventory, and the bind-address rule.

Nothing is simulated: the config is loaded by LiteLLM's own proxy config loader (litellm[proxy]
from PyPI, in its own venv: tests/gateway/venv.py), and the CLI runs as a user runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rigkit.config.errors import ConfigError
from rigkit.config.inventory import GATEWAY_HEALTH_CHECK_INTERVAL_S
from rigkit.config.loader import load_rig
from rigkit.plumbing.render import template_path
from tests.gateway.venv import litellm_python

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "inventory" / "models"
KEY_B = "sk-rig-b $ecret #1"  # $ and # would break a key that reached a shell or Compose unquoted

RIG = """\
os: linux
psu_w: 1200
system_w: 200
gpus:
  - {index: 0, model: RTX 4090}
  - {index: 1, model: RTX 4090}
models: [MODELS]
"""


def model_file(folder: Path, name: str, port: int, served: str | None = None, fallbacks=()) -> None:
    text = (f"image: rigkit-vllm-standin:sim\nweights: {{source: /srv/x/{name}}}\ngpus: [0]\nport: {port}\n"
            f"shared_gpus: true\n")
    if served:
        text += f"vllm: {{served_model_name: {served}}}\n"
    if fallbacks:
        text += f"gateway_fallbacks: {list(fallbacks)}\n"
    (folder / f"{name}.yml").write_text(text)


def private(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def fleet(tmp_path):
    """Two rigs: rig-a runs the gateway and serves chat replica 0 and a coder; rig-b (with a key,
    models on every interface) serves chat replica 1."""
    catalog = tmp_path / "models"
    catalog.mkdir()
    model_file(catalog, "chat-r0", 18101, served="chat", fallbacks=["coder"])
    model_file(catalog, "chat-r1", 18102, served="chat", fallbacks=["coder"])
    model_file(catalog, "coder", 18103)
    rigs = tmp_path / "rigs"
    rigs.mkdir()
    (rigs / "rig-a.yml").write_text(RIG.replace("MODELS", "chat-r0, coder"))
    key_b = private(tmp_path / "key-b", KEY_B)
    (rigs / "rig-b.yml").write_text(RIG.replace("MODELS", "chat-r1") +
                                    f"api_key_file: {key_b}\nserve_address: 0.0.0.0\n")
    master = private(tmp_path / "master", "sk-master-1")
    inventory = tmp_path / "inv.py"
    inventory.write_text(f"""
rigs = [
    ("rig-a", {{"ssh_hostname": "127.0.0.1", "rig_file": "{rigs / 'rig-a.yml'}", "catalog_dir": "{catalog}",
               "gateway": {{"port": 4111, "master_key_file": "{master}", "num_retries": 3, "cooldown_s": 20}}}}),
    ("rig-b", {{"ssh_hostname": "10.1.2.3", "rig_file": "{rigs / 'rig-b.yml'}", "catalog_dir": "{catalog}"}}),
]
""")
    return inventory


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigkit.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_gateway_config_prints_every_replica_without_secrets(fleet):
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 0, run.stderr
    assert KEY_B not in run.stdout and "sk-master-1" not in run.stdout
    config = yaml.safe_load(run.stdout)
    chat = [d for d in config["model_list"] if d["model_name"] == "chat"]
    assert {d["litellm_params"]["api_base"] for d in chat} == {"http://127.0.0.1:18101/v1", "http://10.1.2.3:18102/v1"}
    assert "callbacks" not in config["litellm_settings"]  # a user's own LiteLLM has no drain filter...
    keys = {d["litellm_params"]["api_base"]: d["litellm_params"]["api_key"] for d in chat}
    assert keys["http://10.1.2.3:18102/v1"] == "os.environ/RIGKIT_KEY_RIG_B"  # ...so it reads the rig's key itself


def test_rendered_config_passes_litellms_own_loader(fleet, tmp_path):
    """LiteLLM reads the config the role deploys (drain filter beside it) and resolves the master key's reference."""
    from rigkit.config.schema import GatewaySpec
    from rigkit.gateway.config import BACKEND_KEY, BESIDE_CONFIG, render_config
    from rigkit.gateway.plan import RigView, plan as make_plan

    text = fleet.read_text()
    catalog = Path(text.split('"catalog_dir": "')[1].split('"')[0])
    rig_a, rig_b = (load_rig(Path(text.split('"rig_file": "')[n].split('"')[0]), catalog) for n in (1, 2))
    gateway = GatewaySpec(port=4111, master_key_file="/unused", num_retries=3, cooldown_s=20,
                          health_check_interval_s=GATEWAY_HEALTH_CHECK_INTERVAL_S)
    plan = make_plan([RigView("rig-a", rig_a, "127.0.0.1", gateway=gateway), RigView("rig-b", rig_b, "10.1.2.3")])
    folder = tmp_path / "gateway"
    folder.mkdir()
    (folder / "config.yaml").write_text(render_config(plan))
    for module in BESIDE_CONFIG:  # the drain filter and the key check, as the deployed gateway has them
        shutil.copy(template_path(module), folder / Path(module).name)
    env = {**os.environ, "LITELLM_MASTER_KEY": "sk-master-1"}
    run = subprocess.run([str(litellm_python()), str(REPO / "tests/gateway/litellm_load.py"),
                          str(folder / "config.yaml")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    by_id = {d["id"]: d for d in seen["deployments"]}
    assert set(by_id) == {"rig-a.chat-r0", "rig-a.coder", "rig-b.chat-r1"}
    assert by_id["rig-b.chat-r1"]["api_key"] == BACKEND_KEY  # the rig's key is sent by rigkit's callback
    assert by_id["rig-b.chat-r1"]["model"] == "openai/chat" and by_id["rig-b.chat-r1"]["rig"] == "rig-b"
    # Background health checks, as LiteLLM's own loader read them: on, at the inventory default, steering
    # routing; each a 1-token completion.
    assert seen["background_health_checks"] is True
    assert seen["health_check_interval"] == GATEWAY_HEALTH_CHECK_INTERVAL_S
    assert seen["health_check_routing"] is True
    assert {(d["health_check_mode"], d["health_check_max_tokens"]) for d in seen["deployments"]} == {("completion", 1)}
    assert by_id["rig-a.chat-r0"]["timeout"] == 900  # a long prefill fits
    assert seen["num_retries"] == 3 and seen["cooldown_time"] == 20 and seen["allowed_fails"] == 1
    assert seen["fallbacks"] == [{"chat": ["coder"]}]
    assert seen["master_key_set"]
    assert "RigkitDrain" in seen["callbacks"]


def test_remote_loopback_models_are_refused_with_the_way_out(fleet):
    text = fleet.read_text()
    rig_b = Path(text.split('"rig_file": "')[2].split('"')[0])
    rig_b.write_text(rig_b.read_text().replace("serve_address: 0.0.0.0\n", ""))
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{rig_b}: serve_address: '127.0.0.1'" in run.stderr
    assert "gateway_address" in run.stderr and "rig-a cannot reach them" in run.stderr


def test_unknown_fallback_and_bad_gateway_fields_are_refused(fleet):
    catalog = Path(fleet.read_text().split('"catalog_dir": "')[1].split('"')[0])
    model_file(catalog, "coder", 18103, fallbacks=["nope"])
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 2 and "coder.yml: gateway_fallbacks[0]: 'nope': no rig" in run.stderr
    model_file(catalog, "coder", 18103)
    fleet.write_text(fleet.read_text().replace('"num_retries": 3', '"num_retrys": 3').replace('"port": 4111', '"port": 80'))
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "gateway.num_retrys: unknown key" in run.stderr and "gateway.port: 80:" in run.stderr


def test_health_checks_are_on_at_the_inventory_default_and_cost_one_token(fleet):
    """The inventory leaves health_check_interval_s out: the declared default applies."""
    config = yaml.safe_load(cli("gateway-config", str(fleet)).stdout)
    assert config["general_settings"]["background_health_checks"] is True
    assert config["general_settings"]["health_check_interval"] == GATEWAY_HEALTH_CHECK_INTERVAL_S == 30
    assert config["general_settings"]["enable_health_check_routing"] is True
    for deployment in config["model_list"]:
        assert deployment["model_info"]["mode"] == "completion"  # /v1/completions: no chat template needed
        assert deployment["model_info"]["health_check_max_tokens"] == 1
        assert "health_check_model" not in deployment["model_info"]  # it asks the deployment's own model


def test_health_check_interval_is_set_or_turned_off_and_bad_values_are_refused(fleet):
    text = fleet.read_text()
    fleet.write_text(text.replace('"cooldown_s": 20', '"cooldown_s": 20, "health_check_interval_s": 90'))
    assert yaml.safe_load(cli("gateway-config", str(fleet)).stdout)["general_settings"]["health_check_interval"] == 90
    fleet.write_text(text.replace('"cooldown_s": 20', '"cooldown_s": 20, "health_check_interval_s": 0'))
    config = yaml.safe_load(cli("gateway-config", str(fleet)).stdout)
    assert not {"background_health_checks", "health_check_interval", "enable_health_check_routing"} & set(config["general_settings"])
    assert all("health_check_max_tokens" not in d["model_info"] for d in config["model_list"])
    fleet.write_text(text.replace('"cooldown_s": 20', '"cooldown_s": 20, "health_check_interval_s": -5'))
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "gateway.health_check_interval_s: -5:" in run.stderr and "greater than or equal to 0" in run.stderr


def test_an_on_demand_model_behind_health_checks_or_a_shorter_timeout_is_refused(fleet, tmp_path):
    """A model served on demand (docs/on-demand.md) would be loaded by every health check, never parked; a request
    its rig holds while it loads must outlast no gateway timeout."""
    rig_a = tmp_path / "rigs" / "rig-a.yml"
    rig_a.write_text(rig_a.read_text() + "on_demand:\n  hold_s: 300\n  models:\n    - {name: coder}\n")
    run = cli("gateway-config", str(fleet))  # health checks at the inventory default
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert (f"host rig-a: coder is served on demand ({rig_a}: on_demand), and the gateway's background health "
            f"checks (health_check_interval_s: {GATEWAY_HEALTH_CHECK_INTERVAL_S}) would load it every") in run.stderr
    text = fleet.read_text()
    fleet.write_text(text.replace('"cooldown_s": 20', '"cooldown_s": 20, "health_check_interval_s": 0, '
                                                      '"request_timeout_s": 300'))
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 2 and ("its rig holds a request up to 300 s (on_demand.hold_s) while the model loads, but "
                                    "the gateway gives up on a request after request_timeout_s: 300") in run.stderr
    fleet.write_text(text.replace('"cooldown_s": 20', '"cooldown_s": 20, "health_check_interval_s": 0'))
    assert cli("gateway-config", str(fleet)).returncode == 0  # 900 s outlasts the hold


def test_two_gateways_or_one_address_twice_are_refused(fleet):
    two = fleet.read_text().replace('"catalog_dir": "', '"gateway": {"master_key_file": "/x"}, "catalog_dir": "', 2)
    fleet.write_text(two)
    run = cli("gateway-config", str(fleet))
    assert run.returncode == 2 and "one host runs the gateway" in run.stderr


def test_serve_address_beyond_loopback_needs_a_key(tmp_path):
    rig = tmp_path / "open.yml"
    rig.write_text(RIG.replace("[MODELS]", "[]") + "serve_address: 0.0.0.0\n")
    with pytest.raises(ConfigError) as caught:
        load_rig(rig, CATALOG)
    assert f"{rig}: serve_address: '0.0.0.0': models listening on every interface need an API key" in str(caught.value)
    run = cli("check", str(rig), "--catalog", str(CATALOG))
    assert run.returncode == 2 and "serve_address: '0.0.0.0'" in run.stderr and "Traceback" not in run.stderr


def test_vllm_listens_where_the_rig_says(fleet):
    from rigkit.serving.compose import vllm_args

    rig = load_rig(Path(fleet.read_text().split('"rig_file": "')[2].split('"')[0]),
                   Path(fleet.read_text().split('"catalog_dir": "')[1].split('"')[0]))
    args = vllm_args(rig.models[0], rig.spec.serve_address)
    assert args[args.index("--host") + 1] == "0.0.0.0"


DRAIN_CHECK = """
import asyncio, json, os, shutil, sys, time
folder = sys.argv[1]
sys.path.insert(0, folder)
import rigkit_drain
deployments = [{"model_info": {"id": f"{rig}.m", "rigkit_rig": rig}} for rig in ("rig-a", "rig-b")]
def kept():
    return [d["model_info"]["id"] for d in asyncio.run(rigkit_drain.handler.async_filter_deployments("m", deployments, None))]
seen = [kept()]
for rigs in (["rig-a"], ["rig-a", "rig-b"], []):
    with open(os.path.join(folder, "drained.json.tmp"), "w") as f:
        json.dump({"rigs": rigs}, f)
    os.replace(os.path.join(folder, "drained.json.tmp"), os.path.join(folder, "drained.json"))
    seen.append(kept())
print(json.dumps(seen))
"""


def test_drain_filter_skips_drained_rigs_inside_litellm(tmp_path):
    """The filter LiteLLM loads, run by LiteLLM's own CustomLogger base class: a rig listed in drained.json
    gets no request; when every replica is drained, all are kept (a slow answer beats none)."""
    shutil.copy(template_path("gateway/rigkit_drain.py"), tmp_path / "rigkit_drain.py")
    run = subprocess.run([str(litellm_python()), "-c", DRAIN_CHECK, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [
        ["rig-a.m", "rig-b.m"], ["rig-b.m"], ["rig-a.m", "rig-b.m"], ["rig-a.m", "rig-b.m"]]


def test_compose_file_carries_the_config_inline_with_no_secret_and_no_interpolation(fleet, tmp_path):
    """The compose file Compose will read: the config and drain filter as inline configs (copied into the
    container, nothing bind-mounted), the master key only through the raw env file, the rigs' keys in a file
handed to the running proxy, every `$` doubled."""
    from rigkit.config.schema import GatewaySpec
    from rigkit.gateway.config import BACKEND_KEY
    from rigkit.gateway.stack import backend_keys, env_file, render_compose, settings
    from rigkit.gateway.plan import RigView, plan as make_plan

    text = fleet.read_text()
    catalog = Path(text.split('"catalog_dir": "')[1].split('"')[0])
    rig_a, rig_b = (load_rig(Path(text.split('"rig_file": "')[n].split('"')[0]), catalog) for n in (1, 2))
    plan = make_plan([RigView("rig-a", rig_a, "127.0.0.1", gateway=GatewaySpec(master_key_file="/x")),
                      RigView("rig-b", rig_b, "10.1.2.3")])
    compose_text = render_compose(plan, None)
    compose = yaml.safe_load(compose_text)
    service = compose["services"]["litellm"]
    assert service["env_file"] == [{"path": "/etc/rigkit/secrets/gateway.env", "format": "raw"}]
    assert "volumes" not in service and service["network_mode"] == "host"
    assert service["command"][:2] == ["--config", "/etc/litellm/config.yaml"]
    inline = yaml.safe_load(compose["configs"]["litellm_config"]["content"].replace("$$", "$"))
    assert inline["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert "$" not in compose_text.replace("$$", "")  # no single `$` left for Compose to interpolate
    assert env_file("sk-master") == b"LITELLM_MASTER_KEY=sk-master\n"  # no rig's key: a rotation recreates nothing
    sent = json.loads(backend_keys(plan, {"RIGKIT_KEY_RIG_B": KEY_B}))["keys"]
    assert sent == {"http://10.1.2.3:18102/v1": KEY_B}  # rig-a's models want no key
    assert inline["model_list"][-1]["litellm_params"]["api_key"] == BACKEND_KEY
    assert KEY_B not in compose_text and "sk-master" not in compose_text
    replicas = json.loads(settings(plan))["replicas"]
    assert {r["metrics"] for r in replicas} == {"http://127.0.0.1:18101/metrics", "http://127.0.0.1:18103/metrics",
                                                "http://10.1.2.3:18102/metrics"}
    with pytest.raises(Exception, match="must start with sk-"):
        env_file("master")


def test_gateway_config_names_a_missing_or_broken_inventory_in_one_line(tmp_path, capsys):
    from rigkit.cli import main

    broken = tmp_path / "inventory.py"
    broken.write_text("rigs = [(\n")
    assert main(["gateway-config", str(broken)]) == 2
    assert f"{broken}: cannot be loaded: SyntaxError" in capsys.readouterr().err
    assert main(["gateway-config", str(tmp_path / "none.py")]) == 2
    assert "no such inventory file" in capsys.readouterr().err


def test_key_variable_names_are_safe_for_any_host_name():
    from rigkit.gateway.plan import key_env_name

    assert key_env_name("rig-1.lan") == "RIGKIT_KEY_RIG_1_LAN"
    assert key_env_name("Bad Name=1") == "RIGKIT_KEY_BAD_NAME_1"


def surfaces_of(inventory: Path) -> dict:
    """Each rig's firewall plan, as a deploy computes it before any rig is touched (deploy.py)."""
    from rigkit.config.inventory import load_inventory, validate_host
    from rigkit.gateway.plan import gateway_plan
    from rigkit.surface.fleet import fleet_surfaces

    hosts = list(load_inventory(str(inventory)))
    rigs = {host.name: validate_host(host) for host in hosts}
    return fleet_surfaces(hosts, rigs, gateway_plan(hosts, rigs))


def test_the_gateways_rig_is_let_in_where_its_models_listen_on_every_interface(fleet):
    """rig-b serves on 0.0.0.0 behind the gateway on rig-a (at 127.0.0.1 in this inventory): rig-a is let in."""
    plans = surfaces_of(fleet)
    assert plans["rig-a"] is None  # it serves on loopback
    assert plans["rig-b"].ports == (18102,) and plans["rig-b"].allowed == ("127.0.0.1/32",)


def test_a_gateway_address_that_does_not_resolve_stops_only_rigs_that_need_it(fleet):
    """The gateway rig's name is resolved only for the rigs it must be let into; rigs on loopback never ask.
    With serve_clients naming the gateway, an unresolvable name is no error either."""
    text = fleet.read_text().replace('("rig-a", {"ssh_hostname": "127.0.0.1"', '("rig-a", {"ssh_hostname": "gpu-a.invalid"')
    fleet.write_text(text)
    rig_b = Path(text.split('"rig_file": "')[2].split('"')[0])
    from rigkit.config.inventory import RigConfigError

    with pytest.raises(RigConfigError) as refused:
        surfaces_of(fleet)
    assert "host rig-a: its address 'gpu-a.invalid' has no IPv4 address here" in str(refused.value)
    assert f"or name the gateway's address in serve_clients of {rig_b}" in str(refused.value)
    # Rig files are read once per path in a process: the variants below are files of their own.
    with_clients = rig_b.with_name("rig-b-clients.yml")
    with_clients.write_text(rig_b.read_text() + "serve_clients: [10.1.2.40]\n")
    clients_inventory = fleet.with_name("inv-clients.py")  # inventories too are read once per path
    clients_inventory.write_text(text.replace(str(rig_b), str(with_clients)))
    assert surfaces_of(clients_inventory)["rig-b"].allowed == ("10.1.2.40/32",)
    on_loopback = rig_b.with_name("rig-b-loopback.yml")
    on_loopback.write_text(rig_b.read_text().replace("serve_address: 0.0.0.0\n", ""))
    loopback_inventory = fleet.with_name("inv-loopback.py")
    loopback_inventory.write_text(text.replace(str(rig_b), str(on_loopback)).replace(
        '"ssh_hostname": "10.1.2.3", ', '"ssh_hostname": "10.1.2.3", "gateway_address": "10.1.2.3", '))
    assert surfaces_of(loopback_inventory) == {"rig-a": None, "rig-b": None}  # nothing beyond loopback: nothing resolved


def test_the_gateways_own_rig_on_every_interface_for_no_one_else_is_refused_with_its_own_reason(tmp_path):
    from rigkit.surface.plan import SurfaceError, surface_plan

    rig = RIG.replace("MODELS", "chat-r0")
    catalog = tmp_path / "models"
    catalog.mkdir()
    model_file(catalog, "chat-r0", 18101)
    key = private(tmp_path / "key", KEY_B)
    (tmp_path / "rig.yml").write_text(rig + f"api_key_file: {key}\nserve_address: 0.0.0.0\n")
    loaded = load_rig(tmp_path / "rig.yml", catalog)
    with pytest.raises(SurfaceError) as refused:
        surface_plan("rig-a", loaded, (), runs_gateway=True)
    assert "the gateway on rig rig-a reaches its models on 127.0.0.1, and no other host needs them" in str(refused.value)
    assert "Serve on 127.0.0.1, or list the other hosts" in str(refused.value)
    (tmp_path / "rig.yml").write_text(RIG.replace("MODELS", "") + f"api_key_file: {key}\nserve_address: 0.0.0.0\n")
    assert surface_plan("rig-a", load_rig(tmp_path / "rig.yml", catalog), ()) is None  # no models: nothing to close


def compose_hash(compose_text: str, folder: Path) -> str:
    """Compose's own config hash of the proxy's service (`docker compose config --hash`, what `up -d` compares
    with the running container's label to decide a recreate). The env file is a stand-in path here."""
    env = folder.parent / "gateway.env"  # one path for all: it is in the hash
    env.write_text("LITELLM_MASTER_KEY=sk-x\n")
    folder.mkdir()
    (folder / "compose.yml").write_text(compose_text.replace("/etc/rigkit/secrets/gateway.env", str(env)))
    done = subprocess.run(["docker", "compose", "-f", str(folder / "compose.yml"), "config", "--hash", "litellm"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI and its Compose plugin")
def test_a_changed_litellm_config_or_certificate_changes_composes_hash_so_up_recreates_the_proxy(fleet, tmp_path):
    """Compose leaves inline configs' content out of its config hash (docker/compose#13045): a changed config
    would be written to the rig and never served. The service's label of their SHA-256 puts it in. Through the
    real Compose CLI (no engine needed for `config`)."""
    from rigkit.config.schema import GatewaySpec
    from rigkit.gateway.stack import CONFIGS_LABEL, render_compose
    from rigkit.gateway.plan import RigView, plan as make_plan

    text = fleet.read_text()
    catalog = Path(text.split('"catalog_dir": "')[1].split('"')[0])
    rig_a, rig_b = (load_rig(Path(text.split('"rig_file": "')[n].split('"')[0]), catalog) for n in (1, 2))

    def rendered(address: str, chain: bytes | None = None) -> str:
        return render_compose(make_plan([RigView("rig-a", rig_a, "127.0.0.1", gateway=GatewaySpec(master_key_file="/x")),
                                         RigView("rig-b", rig_b, address)]), chain)

    base, moved = rendered("10.1.2.3"), rendered("10.1.2.4")
    issued, renewed = (rendered("10.1.2.3", f"-----BEGIN CERTIFICATE-----\n{body}\n".encode()) for body in ("MIIB", "MIIC"))
    labels = [yaml.safe_load(t)["services"]["litellm"]["labels"][CONFIGS_LABEL] for t in (base, moved)]
    assert labels[0] != labels[1] and all(len(label) == 64 for label in labels), labels
    pairs = {"same": (base, base), "moved replica": (base, moved), "renewed certificate": (issued, renewed)}
    for what, (one, other) in pairs.items():
        hashes = [compose_hash(t, tmp_path / f"{what}-{n}") for n, t in enumerate((one, other))]
        unlabelled = [yaml.safe_load(t) for t in (one, other)]
        for document in unlabelled:
            del document["services"]["litellm"]["labels"]
        without = [compose_hash(json.dumps(d), tmp_path / f"{what}-without-{n}") for n, d in enumerate(unlabelled)]
        assert without[0] == without[1], what  # Compose alone sees no change in any: the reason for the label
        if what == "same":
            assert hashes[0] == hashes[1]  # the same files: no recreate (a second deploy changes nothing)
        else:
            assert hashes[0] != hashes[1], what  # recreated
