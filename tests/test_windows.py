"""Windows rigs: rendered scheduled tasks, PowerShell and the offline bundle.

Nothing here runs on Windows. The PowerShell is parsed with a real PowerShell grammar
(tree-sitter-powershell); the task XML is parsed and its settings asserted. What was and
was not verified on a real Windows machine: README, "Windows rigs".
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import tree_sitter_powershell
from tree_sitter import Language, Parser

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.plumbing.render import ps_quote
from rigkit.windows.bundle import installed_files, render_bundle, same_task
from rigkit.windows.names import INSTALL_DIR, TASK_BOOTSTRAP, TASK_POWER, task_xml_path
from tests.conftest import REPO

NS = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}
PARSER = Parser(Language(tree_sitter_powershell.language()))
WIN_RIG = REPO / "inventory/rigs/win-2x4090-48gb.yml"
CATALOG = REPO / "inventory/models"


HOSTILE = "it's ‘odd’ $(rm -rf x)"


def bundle(tmp_path=None, rig_text=None):
    """The shipped Windows rig's bundle; with `rig_text`, that rig file instead, and the rig's
    name replaced by a hostile one after loading (the loader refuses such a name: the
    templates must still quote it)."""
    if rig_text is None:
        return render_bundle(load_rig(WIN_RIG, CATALOG))
    rig_file = tmp_path / "rig.yml"
    rig_file.write_text(rig_text)
    return render_bundle(replace(load_rig(rig_file, CATALOG), name=HOSTILE))


def test_a_hostile_rig_name_is_refused_at_load(tmp_path):
    rig_file = tmp_path / f"{HOSTILE}.yml"
    rig_file.write_text(WIN_RIG.read_text())
    with pytest.raises(ConfigError, match="names may use lowercase letters"):
        load_rig(rig_file, CATALOG)


def parse_errors(source: str) -> list[str]:
    tree = PARSER.parse(source.encode())
    errors, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            errors.append(f"line {node.start_point[0] + 1}: {node.text[:60]!r}")
        stack.extend(node.children)
    return errors


@pytest.mark.parametrize("name", ["scripts/gpu-power-policy.ps1", "scripts/llm-bootstrap.ps1", "install.ps1",
                                  "uninstall.ps1"])
def test_every_rendered_powershell_file_parses(name):
    source = bundle()[name]
    assert parse_errors(source) == []


def test_the_grammar_catches_a_broken_script():
    assert parse_errors("$x = @{ a = 1\nif ($x) {") != []


def test_hostile_names_stay_inside_single_quoted_literals(tmp_path):
    files = bundle(tmp_path, WIN_RIG.read_text())
    script = files["scripts/llm-bootstrap.ps1"]
    assert parse_errors(script) == []
    assert "'it''s ‘‘odd’’ $(rm -rf x)'" in script  # quotes doubled, nothing expandable left outside
    assert ps_quote("a'b\u2019c") == "'a''b\u2019\u2019c'"


def task(xml: str) -> ET.Element:
    return ET.fromstring(xml)


def test_power_policy_task_is_elevated_at_logon_with_no_delay():
    root = task(bundle()[f"tasks/{TASK_POWER}.xml"])
    trigger = root.find("t:Triggers/t:LogonTrigger", NS)
    assert trigger is not None and trigger.find("t:Delay", NS) is None
    assert root.find("t:Principals/t:Principal/t:RunLevel", NS).text == "HighestAvailable"
    assert "gpu-power-policy.ps1" in root.find("t:Actions/t:Exec/t:Arguments", NS).text
    assert root.find("t:Settings/t:ExecutionTimeLimit", NS).text == "PT5M"


def test_bootstrap_task_delay_limit_restart_and_user_context():
    root = task(bundle()[f"tasks/{TASK_BOOTSTRAP}.xml"])
    assert root.find("t:Triggers/t:LogonTrigger/t:Delay", NS).text == "PT20S"
    principal = root.find("t:Principals/t:Principal", NS)
    assert principal.find("t:RunLevel", NS).text == "HighestAvailable"
    assert principal.find("t:LogonType", NS).text == "InteractiveToken"  # the logged-in user's Docker context
    settings = root.find("t:Settings", NS)
    # 180 s Docker wait + 900 s (qwen3-27b-awq's default ready timeout) + 120 + 60 s margin = 1260 s
    assert settings.find("t:ExecutionTimeLimit", NS).text == "PT21M"
    assert settings.find("t:RestartOnFailure/t:Interval", NS).text == "PT2M"
    assert settings.find("t:RestartOnFailure/t:Count", NS).text == "1"


def test_bootstrap_script_does_what_the_field_notes_ask():
    script = bundle()["scripts/llm-bootstrap.ps1"]
    assert "& $PowerScript\n" in script and "$PowerScript = 'C:\\ProgramData\\rigkit\\gpu-power-policy.ps1'" in script
    assert "'-pl'" not in script and "'-lgc'" not in script  # GPU-PowerPolicy's script alone sets them
    assert "Start-Process -FilePath $DockerDesktop" in script
    # Each warm-up is the one-token probe (max_tokens 1), 30 s at most, retried up to the model's ready_timeout_s.
    assert "max_tokens = 1" in script and "$ProbeTimeoutS = 30 " in script
    assert "Invoke-OneToken $stack.Port $stack.Model $ApiKey $ProbeTimeoutS | Out-Null" in script


def test_power_policy_script_is_declarative_like_linux():
    script = bundle()["scripts/gpu-power-policy.ps1"]
    assert "applied (not queryable - verify under load)" in script and "not elevated?" in script
    assert "@{ Index = 0; PowerLimitW = 330; ClockLock = '0,2200' }" in script
    assert "'--query-gpu=power.limit,power.default_limit'" in script  # an uncapped GPU gets its default
    assert "@('-i', $i, '-rgc')" in script and "@('-i', $i, '-lgc', $gpu.ClockLock)" in script
    assert "param([switch] $Reset)" in script


def test_uncapped_unlocked_gpus_are_rendered_as_such(tmp_path):
    text = "\n".join(line for line in WIN_RIG.read_text().splitlines() if "clock_lock" not in line and
                     "power_limit_w" not in line)
    script = bundle(tmp_path, text)["scripts/gpu-power-policy.ps1"]
    assert "@{ Index = 1; PowerLimitW = $null; ClockLock = $null }" in script


def test_uninstall_resets_through_the_policy_script_then_unregisters_and_removes():
    script = bundle()["uninstall.ps1"]
    assert "& $PowerScript -Reset" in script
    assert "Unregister-ScheduledTask -TaskName $task -TaskPath '\\' -Confirm:$false" in script
    assert "@('GPU-PowerPolicy', 'LocalLLM-Bootstrap', 'LocalLLM-Watchdog')" in script
    assert "Remove-Item -LiteralPath $InstallDir -Recurse -Force" in script
    assert script.index("-Reset") < script.index("Unregister-ScheduledTask") < script.index("Remove-Item")


def test_xml_values_are_escaped(tmp_path):
    root = task(bundle(tmp_path, WIN_RIG.read_text())[f"tasks/{TASK_POWER}.xml"])
    assert root.find("t:RegistrationInfo/t:Description", NS).text.endswith("it's ‘odd’ $(rm -rf x)")


def test_same_task_ignores_what_windows_adds_and_sees_real_differences():
    rendered = bundle()[f"tasks/{TASK_BOOTSTRAP}.xml"]
    exported = rendered.replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="UTF-16"?>').replace(
        "<RegistrationInfo>", "<RegistrationInfo>\n    <Date>2026-11-29T10:00:00</Date><Author>RIG\\owner</Author>"
    ).replace("RIGKIT-INSTALLING-USER", "RIG\\owner").replace("    ", "  ")
    assert same_task(exported, rendered)
    assert not same_task(exported.replace("PT20S", "PT30S"), rendered)


def test_same_task_compares_the_user_of_a_task_rendered_for_system():
    """The watchdog's task names SYSTEM itself: a task moved to another user is not the rendered one."""
    rendered = bundle()["tasks/LocalLLM-Watchdog.xml"]
    assert "<UserId>S-1-5-18</UserId>" in rendered
    assert same_task(rendered.replace("    ", "  "), rendered)
    assert not same_task(rendered.replace("S-1-5-18", "RIG\\owner"), rendered)


def test_windows_bundle_cli_writes_crlf_scripts_with_a_bom(tmp_path, capsys):
    from rigkit.cli import main

    assert main(["windows-bundle", str(WIN_RIG), "--out", str(tmp_path), "--catalog", str(CATALOG)]) == 0
    script = (tmp_path / "scripts/llm-bootstrap.ps1").read_bytes()
    assert script.startswith(b"\xef\xbb\xbf") and b"\r\n" in script
    assert (tmp_path / "scripts/stacks/qwen3-27b-awq/compose.yml").is_file()
    assert (tmp_path / "install.ps1").is_file() and (tmp_path / f"tasks/{TASK_POWER}.xml").is_file()
    assert main(["windows-bundle", str(REPO / "inventory/rigs/linux-4x3090.yml"), "--out", str(tmp_path / "x"),
                 "--catalog", str(CATALOG)]) == 2


def test_a_keyed_rigs_bundle_names_the_key_file_but_never_carries_the_key(tmp_path):
    """The offline bundle of a rig with api_key_file: compose files reference the key's env file, the
    bootstrap sends it as a header, install.ps1 refuses to run without it; the key is in no file."""
    import os

    from rigkit.windows.bundle import write_bundle
    from rigkit.windows.names import API_KEY_FILE

    key_file = tmp_path / "key"
    key_file.write_text("rk-bundle-secret-0042\n")
    os.chmod(key_file, 0o600)
    rig_file = tmp_path / "rig.yml"
    rig_file.write_text(WIN_RIG.read_text() + f"api_key_file: {key_file}\n")
    written = write_bundle(load_rig(rig_file, CATALOG), tmp_path / "bundle")
    assert all(b"rk-bundle-secret" not in path.read_bytes() for path in written)
    compose = (tmp_path / "bundle/scripts/stacks/qwen3-27b-awq/compose.yml").read_text()
    assert '"format": "raw"' in compose and str(API_KEY_FILE).replace("\\", "\\\\") in compose
    install = (tmp_path / "bundle/install.ps1").read_text(encoding="utf-8-sig")
    assert f"$KeyFile = '{API_KEY_FILE}'" in install and "if (-not (Test-Path -LiteralPath $KeyFile -PathType Leaf))" in install
    bootstrap = (tmp_path / "bundle/scripts/llm-bootstrap.ps1").read_text(encoding="utf-8-sig")
    assert "$ApiKey = Read-ApiKey @{ api_key_env_file = $KeyFile" in bootstrap  # read on the rig, from its file
    assert "Invoke-OneToken $stack.Port $stack.Model $ApiKey" in bootstrap  # sent by the probe, as a header:
    assert "if ($Key) { $headers['Authorization'] = 'Bearer ' + $Key }" in bootstrap
    unkeyed = render_bundle(load_rig(WIN_RIG, CATALOG))
    assert "$KeyFile" not in unkeyed["install.ps1"] and "env_file" not in unkeyed["scripts/stacks/qwen3-27b-awq/compose.yml"]


def test_windows_bundle_cli_says_in_one_line_why_it_cannot_write(tmp_path, capsys, monkeypatch):
    from rigkit.cli import main

    a_file = tmp_path / "bundle"
    a_file.write_text("")
    for out in (a_file, a_file / "inside"):
        assert main(["windows-bundle", str(WIN_RIG), "--out", str(out), "--catalog", str(CATALOG)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rigkit windows-bundle: cannot write the bundle to {out}: ") and err.count("\n") == 1

    def refuse(self, data):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr("pathlib.Path.write_bytes", refuse)  # not writable (tests run as root: chmod would not do)
    assert main(["windows-bundle", str(WIN_RIG), "--out", str(tmp_path / "ro"), "--catalog", str(CATALOG)]) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and err.count("\n") == 1


def test_a_deploy_over_ssh_installs_what_the_tasks_and_scripts_refer_to():
    rig = load_rig(WIN_RIG, CATALOG)
    installed = installed_files(render_bundle(rig))
    files = bundle()
    for task in (TASK_POWER, TASK_BOOTSTRAP):
        assert installed[task_xml_path(task)] == files[f"tasks/{task}.xml"].replace("\n", "\r\n").encode()
        arguments = ET.fromstring(files[f"tasks/{task}.xml"]).find(".//t:Exec/t:Arguments", NS).text
        assert arguments.split('-File "', 1)[1].rstrip('"') in installed  # the task runs a script that is put there
    for stack in rig.models:
        assert str(INSTALL_DIR / "stacks" / stack.name / "compose.yml") in installed  # where the bootstrap looks
        assert str(INSTALL_DIR / "stacks" / stack.name / "compose.yml") in files["scripts/llm-bootstrap.ps1"]
    assert "install.ps1" not in " ".join(installed)  # nor uninstall.ps1
    assert all(data.startswith(b"\xef\xbb\xbf") for path, data in installed.items() if path.endswith(".ps1"))


def test_the_bootstrap_time_limit_is_derived_from_the_docker_wait_and_the_models():
    from dataclasses import replace

    from rigkit.windows.timing import (
        TASK_LIMIT_MAX_S,
        BootstrapBudget,
        bootstrap_budget,
        timing_findings,
    )

    rig = load_rig(WIN_RIG, CATALOG)
    budget = bootstrap_budget(rig)
    assert budget.arithmetic() == ("Docker wait 180 s + ready_timeout_s 900 s (qwen3-27b-awq) + margin 180 s "
                                   "= 1260 s, a task limit of PT21M")
    assert budget.deploy_wait_s == 1260 + 60  # the deploy waits past the task's own limit
    assert [BootstrapBudget(0, (("m", s),), 0).task_duration() for s in (30, 1261, 3600, 5400, 72 * 3600)] == [
        "PT1M", "PT22M", "PT1H", "PT1H30M", "PT72H"]
    assert timing_findings(rig) == ([], [])

    many = replace(rig, models=rig.models * 300)  # 300 x 900 s: 75 h
    errors, _ = timing_findings(many)
    assert bootstrap_budget(many).limit_s > TASK_LIMIT_MAX_S
    assert "above Task Scheduler's 72 h limit; lower ready_timeout_s" in str(errors[0])


def test_rigkit_check_shows_the_bootstrap_arithmetic_when_it_does_not_fit(capsys, monkeypatch):
    from rigkit.cli import main

    monkeypatch.setattr("rigkit.windows.timing.LONG_WAIT_S", 600)
    assert main(["check", str(WIN_RIG), "--catalog", str(CATALOG)]) == 0
    assert "warning: " in capsys.readouterr().err
    monkeypatch.setattr("rigkit.windows.timing.TASK_LIMIT_MAX_S", 600)
    assert main(["check", str(WIN_RIG), "--catalog", str(CATALOG)]) == 2
    err = capsys.readouterr().err
    assert "Docker wait 180 s + ready_timeout_s 900 s (qwen3-27b-awq) + margin 180 s = 1260 s" in err
    assert main(["windows-bundle", str(WIN_RIG), "--out", "/nonexistent-never-written", "--catalog", str(CATALOG)]) == 2


def test_a_model_marked_after_a_new_copy_is_recreated_by_the_bootstrap_and_the_mark_removed_after():
    """The deploy marks a model whose weights it copied again (roles/windows.py); the bootstrap's
    `compose up` gets --force-recreate for a marked model only, and removes the mark only after
    that `up` succeeded (a failure stops the script first, leaving the mark for the next run)."""
    script = bundle()["scripts/llm-bootstrap.ps1"]
    assert ps_quote(str(INSTALL_DIR / "recreate" / "qwen3-27b-awq.txt")) in script
    up = script.index("$up = Invoke-Docker $arguments")
    assert script.index("$recreate = Test-Path -LiteralPath $stack.RecreateMarker -PathType Leaf") < up
    assert script.index("if ($recreate) { $arguments += '--force-recreate' }") < up
    failed = script.index("docker compose up failed", up)
    assert failed < script.index("Remove-Item -LiteralPath $stack.RecreateMarker -Force", up)
    assert script.count("--force-recreate") == 1


def test_windows_stacks_publish_on_loopback_instead_of_host_networking(tmp_path):
    """Docker Desktop reaches Windows' loopback through host networking only with a setting that is off
    by default: each Windows stack publishes its port on 127.0.0.1 (vLLM listening on the container's
    interface), checked by the real Compose CLI's `config`. Linux stacks keep host networking."""
    import json
    import subprocess

    import yaml

    rig = load_rig(WIN_RIG, CATALOG)
    [model] = rig.models
    path = tmp_path / "compose.yml"
    path.write_text(bundle()[f"scripts/stacks/{model.name}/compose.yml"])
    out = subprocess.run(["docker", "compose", "-f", str(path), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    service = json.loads(out.stdout)["services"]["vllm"]
    assert "network_mode" not in service
    assert service["ports"] == [{"mode": "ingress", "host_ip": "127.0.0.1", "target": model.spec.port,
                                 "published": str(model.spec.port), "protocol": "tcp"}]
    command = service["command"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    from rigkit.serving.compose import render_compose
    linux = yaml.safe_load(render_compose(model, with_api_key=False))["services"]["vllm"]
    assert linux["network_mode"] == "host" and "ports" not in linux
    assert linux["command"][linux["command"].index("--host") + 1] == "127.0.0.1"


def test_logon_tasks_fire_only_at_the_installing_users_logon():
    """Each logon trigger names the same user as the task's principal (filled in at install): a logon
    of another account does not start them (Task Scheduler's LogonTrigger/UserId)."""
    files = bundle()
    for task in (TASK_POWER, TASK_BOOTSTRAP):
        root = ET.fromstring(files[f"tasks/{task}.xml"])
        trigger = root.find("t:Triggers/t:LogonTrigger", NS)
        children = [child.tag.split("}")[1] for child in trigger]
        assert trigger.find("t:UserId", NS).text == root.find("t:Principals/t:Principal/t:UserId", NS).text
        assert children.index("UserId") > children.index("Enabled")  # the schema's order
        if "Delay" in children:
            assert children.index("UserId") < children.index("Delay")
    assert "$xml.Task.Triggers.LogonTrigger.UserId = $user" in files["install.ps1"]


def test_every_task_runs_its_script_past_the_execution_policy():
    """A Windows 11 client's default execution policy is Restricted (about_Execution_Policies): each
    task starts Windows PowerShell with `-ExecutionPolicy Bypass -File <its script>`, which applies to
    that process only and changes no setting."""
    files = bundle()
    for name in (n for n in files if n.startswith("tasks/")):
        exec_action = ET.fromstring(files[name]).find("t:Actions/t:Exec", NS)
        assert exec_action.find("t:Command", NS).text.lower().endswith("powershell.exe"), name
        arguments = exec_action.find("t:Arguments", NS).text.split()
        assert arguments[arguments.index("-ExecutionPolicy") + 1] == "Bypass" and "-File" in arguments, name


def test_power_policy_task_also_runs_on_resume_from_the_system_logs_power_events():
    """Parsed, not grepped: the task XML, then the event query inside its Subscription (itself XML),
    then each clause of the query's XPath, which must name the System log's resume events."""
    root = task(bundle()[f"tasks/{TASK_POWER}.xml"])
    (trigger,) = root.findall("t:Triggers/t:EventTrigger", NS)
    assert trigger.find("t:Enabled", NS).text == "true"
    assert trigger.find("t:Delay", NS).text == "PT10S"
    query_list = ET.fromstring(trigger.find("t:Subscription", NS).text)
    assert query_list.tag == "QueryList"
    (query,) = query_list.findall("Query")
    assert query.get("Path") == "System"
    (select,) = query.findall("Select")
    assert select.get("Path") == "System"
    clause = re.compile(r"\*\[System\[Provider\[@Name='([A-Za-z-]+)'\] and EventID=([0-9]+)\]\]")
    parts = select.text.split(" or ")
    assert all(clause.fullmatch(p) for p in parts), parts
    assert {clause.fullmatch(p).groups() for p in parts} == {
        ("Microsoft-Windows-Kernel-Power", "107"), ("Microsoft-Windows-Power-Troubleshooter", "1")}
    assert root.find("t:Triggers/t:LogonTrigger", NS) is not None  # still at logon
    # One resume writes both events: IgnoreNew runs the task once.
    assert root.find("t:Settings/t:MultipleInstancesPolicy", NS).text == "IgnoreNew"
