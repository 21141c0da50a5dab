"""The Windows rig's watchdog (rigkit.windows.watchdog): its task's XML, its settings, and its
PowerShell script checked on the script's syntax tree (tree-sitter-powershell).

No PowerShell runs here, so the script's decisions are checked statically: which statements guard
the restart (the hourly cap, the rollout lock, both signals for wedged_after_s), that docker is
reached only through the bounded call, and that the API key reaches no command line. Its run on
Windows is not tested (docs/windows.md). Simulates nothing.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from rigkit.config.loader import load_rig
from rigkit.serving.watchdog import watchdog_config
from rigkit.windows.bundle import render_bundle
from rigkit.windows.names import API_KEY_FILE, ROLLOUT_LOCK, TASK_WATCHDOG
from rigkit.windows.watchdog import LOAD_NAMES, PROGRESS_NAMES, schedule
from tests.conftest import DATA, TEST_CATALOG
from tests.ps51_rules import PARSER, _Script, findings
from tests.test_watchdog import load_watchdog

WIN_RIG = DATA / "rigs" / "windows.yml"
NS = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}


def rig_with(tmp_path, catalog_change: tuple[str, str] | None = None, extra: str = ""):
    catalog = tmp_path / "models"
    catalog.mkdir(exist_ok=True)
    for source in TEST_CATALOG.glob("*.yml"):
        text = source.read_text()
        if catalog_change and source.stem == "win-alpha":
            text = text.replace(*catalog_change)
        (catalog / source.name).write_text(text)
    rig_file = tmp_path / "win.yml"
    rig_file.write_text(WIN_RIG.read_text() + extra)
    return load_rig(rig_file, catalog)


@pytest.fixture
def script() -> str:
    return render_bundle(load_rig(WIN_RIG, TEST_CATALOG))["scripts/rigkit-watchdog.ps1"]


def text(node) -> str:
    return node.text.decode("utf-8")


def walk(node):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def function(root, name: str):
    for node in walk(root):
        if node.type == "function_statement" and text(node.child_by_field_name("name") or next(
                c for c in node.children if c.type == "function_name")).lower() == name.lower():
            return node
    raise AssertionError(f"no function {name}")


def statements(function_node) -> list:
    """The function body's top-level statements, in order."""
    body = next(n for n in walk(function_node) if n.type == "statement_list")
    return [c for c in body.children if c.is_named]


def calls(root, command: str) -> list:
    return [n for n in walk(root) if n.type == "command" and text(n).split()[0].lower() == command.lower()]


def top_statement(function_node, node):
    return next(s for s in statements(function_node) if s.start_byte <= node.start_byte < s.end_byte)


def condition(if_node) -> str:
    return text(next(c for c in if_node.children if c.type == "pipeline"))


def test_the_signals_and_settings_are_the_linux_watchdogs(tmp_path):
    linux = load_watchdog()
    assert PROGRESS_NAMES == linux.PROGRESS and LOAD_NAMES == linux.LOAD
    rig = load_rig(WIN_RIG, TEST_CATALOG)
    bundle = render_bundle(rig)
    windows = json.loads(bundle["scripts/watchdog.json"])
    assert windows["models"] == json.loads(watchdog_config(rig, with_api_key=False))["models"]  # same thresholds
    assert windows["state_dir"] == "C:\\ProgramData\\rigkit\\watchdog" and windows["api_key_env_file"] is None
    for name in PROGRESS_NAMES + LOAD_NAMES:
        assert f"'{name}'" in bundle["scripts/rigkit-watchdog.ps1"]
    keyed = render_bundle(rig_with(tmp_path, extra=f"api_key_file: {tmp_path / 'k'}\n"))
    assert json.loads(keyed["scripts/watchdog.json"])["api_key_env_file"] == str(API_KEY_FILE)


def test_the_task_runs_as_system_on_a_repetition_with_a_bounded_time_limit(tmp_path):
    rig = load_rig(WIN_RIG, TEST_CATALOG)
    root = ET.fromstring(render_bundle(rig)[f"tasks/{TASK_WATCHDOG}.xml"])
    principal = root.find("t:Principals/t:Principal", NS)
    assert principal.find("t:UserId", NS).text == "S-1-5-18"
    assert principal.find("t:RunLevel", NS).text == "HighestAvailable"
    assert principal.find("t:LogonType", NS) is None  # SYSTEM: no user need be logged on
    trigger = root.find("t:Triggers/t:TimeTrigger", NS)
    assert trigger.find("t:Repetition/t:Interval", NS).text == "PT1M"  # Task Scheduler's shortest
    assert trigger.find("t:Repetition/t:Duration", NS) is None  # repeats indefinitely
    settings = root.find("t:Settings", NS)
    # one run: 60 s of passes + one pass at every deadline (probe 15 + /metrics 5 + 2 docker calls of 60) + 60 s
    assert settings.find("t:ExecutionTimeLimit", NS).text == "PT5M"
    assert settings.find("t:MultipleInstancesPolicy", NS).text == "IgnoreNew"
    assert settings.find("t:Enabled", NS).text == "true"
    assert "rigkit-watchdog.ps1" in root.find("t:Actions/t:Exec/t:Arguments", NS).text

    slow = rig_with(tmp_path, ("ready_timeout_s: 30\n", "ready_timeout_s: 30\nwatchdog: {interval_s: 90}\n"))
    assert (schedule(slow).pass_interval_s, schedule(slow).repeat, schedule(slow).limit) == (90, "PT2M", "PT6M")
    off = rig_with(tmp_path, ("ready_timeout_s: 30\n", "ready_timeout_s: 30\nwatchdog: {enabled: false}\n"))
    assert ET.fromstring(render_bundle(off)[f"tasks/{TASK_WATCHDOG}.xml"]).find("t:Settings/t:Enabled", NS).text == "false"


def test_the_script_passes_the_51_rules_with_hostile_names(tmp_path):
    rig = load_rig(WIN_RIG, TEST_CATALOG)
    hostile = "it's ‘odd’ [2x] $(rm -rf x)"
    for variant in (rig, replace(rig, name=hostile, models=tuple(replace(m, name=hostile) for m in rig.models))):
        rendered = render_bundle(variant)["scripts/rigkit-watchdog.ps1"]
        assert findings(rendered) == [], "\n".join(map(str, findings(rendered)))


def test_a_restart_is_guarded_by_the_cap_then_the_lock(script):
    root = PARSER.parse(script.encode()).root_node
    restarts = calls(root, "Restart-Model")
    assert len(restarts) == 1
    wedged = function(root, "Invoke-Action")
    assert wedged.start_byte <= restarts[0].start_byte < wedged.end_byte
    body = statements(wedged)
    at = body.index(top_statement(wedged, restarts[0]))
    before = body[:at]
    ifs = [s for s in before if s.type == "if_statement"]
    cap = next(s for s in ifs if "max_restarts_per_hour" in condition(s))
    assert "$recent.Count -ge" in condition(cap) and "return 'capped'" in text(cap)
    assert any("$HourS" in text(s) and "$recent =" in text(s) for s in before)  # the rolling hour
    take = next(i for i, s in enumerate(before) if text(s).startswith("$lock = Enter-RolloutLock"))
    assert text(before[take + 1]) == "$access = Get-LockAccess $lock $State $Now"
    held, unreadable = before[take + 2], before[take + 3]  # a rollout, then a lock not openable within its bound
    assert held.type == "if_statement" and condition(held) == "$access -eq 'rollout'" and "return 'held_off'" in text(held)
    assert condition(unreadable) == "$access -eq 'unreadable'" and "return 'held_off'" in text(unreadable)
    assert "suspect_since" not in text(unreadable)  # the suspicion is kept: the restart follows once the bound is reached
    assert body.index(cap) < take  # a capped model does not even take the lock
    guarded = body[at]
    assert guarded.type == "try_statement" and "$lock.Handle.Dispose()" in text(guarded.child_by_field_name("finally") or next(
        c for c in guarded.children if c.type == "finally_clause"))
    assert "$State['restarts'] = [double[]] @($recent + $Now)" in script  # counted for the cap once done


def test_a_stopped_model_is_started_within_the_cap_and_the_lock_and_docker_is_asked_only_when_unanswered(script):
    """The Linux watchdog's DOWN, on Windows: `docker start` is reached only through Invoke-Action (after its cap
    and lock, as the restart), with 'DOWN'; Get-Stopped is asked only when the probe went unanswered."""
    root = PARSER.parse(script.encode()).root_node
    starts = calls(root, "Start-Model")
    assert len(starts) == 1
    action = function(root, "Invoke-Action")
    assert action.start_byte <= starts[0].start_byte < action.end_byte
    assert "if ($What -eq 'DOWN') { $done = Start-Model $Model } else { $done = Restart-Model $Model }" in text(action)
    [asked] = calls(root, "Get-Stopped")
    guard = asked.parent
    while guard.type != "if_statement":
        guard = guard.parent
    assert condition(guard) == "-not $probe.Answered", condition(guard)
    stopped = text(function(root, "Get-Stopped"))
    assert "@('exited', 'dead', 'created') -notcontains $state" in stopped and "return ''" in stopped
    assert "--format', '{{.State}}'" in stopped  # rendered from the template's raw block, no space to split on


def test_a_model_is_probed_only_while_no_rollout_holds_the_lock(script):
    root = PARSER.parse(script.encode()).root_node
    check = function(root, "Invoke-Check")
    lock = next(s for s in statements(check) if s.type == "if_statement" and condition(s) == "$access -eq 'rollout'")
    then_block = next(c for c in lock.children if c.type == "statement_block")
    assert "'held_off'" in text(then_block) and "Test-Completion" not in text(then_block)
    assert "Test-Completion" in text(next(c for c in lock.children if c.type == "else_clause"))
    assert statements(check).index(lock) > next(i for i, s in enumerate(statements(check))
                                                if text(s) == "$access = Get-LockAccess $lock $State $now")
    acted = calls(root, "Invoke-Action")
    branches = []
    for call in acted:
        branch = call.parent
        while branch.type not in ("if_statement", "elseif_clause"):
            branch = branch.parent
        branches.append(condition(branch))
    assert sorted(branches) == ["$down", "$verdict -eq 'wedged'"], branches  # a stopped model, a wedged one
    # The lock is the bootstrap's: the same file, opened without sharing by both.
    bootstrap = render_bundle(load_rig(WIN_RIG, TEST_CATALOG))["scripts/llm-bootstrap.ps1"]
    for source in (script, bootstrap):
        assert f"$LockFile = '{ROLLOUT_LOCK}'" in source
        assert "[IO.File]::Open($LockFile, [IO.FileMode]::OpenOrCreate, [IO.FileAccess]::ReadWrite, [IO.FileShare]::None)" in source


def test_wedged_needs_both_signals_for_wedged_after_s(script):
    root = PARSER.parse(script.encode()).root_node
    verdict = function(root, "Get-Verdict")
    body = statements(verdict)
    stalled = next(s for s in body if text(s).startswith("$stalled ="))
    assert "($busy -gt 0)" in text(stalled) and "($moved.Count -eq 0)" in text(stalled) and "$shared.Count -gt 0" in text(stalled)
    clear = next(s for s in body if s.type == "if_statement" and condition(s) == "$Answered -or -not $stalled")
    wedged = next(s for s in body if s.type == "if_statement" and "'wedged'" in text(s))
    assert body.index(stalled) < body.index(clear) < body.index(wedged)
    assert "wedged_after_s" in condition(wedged) and "$Now - $since -ge" in condition(wedged)
    assert "'wedged'" not in text(clear)


def test_docker_is_reached_only_through_the_bounded_call_and_never_with_the_key(script):
    root = PARSER.parse(script.encode()).root_node
    parsed = _Script(root)
    natives = [c for c in parsed.commands if parsed.is_native(c)]
    # no `& docker.exe` or `& $anything` (unbounded, stderr under Stop): docker runs as a process with a deadline
    assert not [c for c in natives if "docker" in c.name or c.invoked_by_expression]
    invoke = function(root, "Invoke-Docker")
    assert "WaitForExit($DockerTimeoutS * 1000)" in text(invoke) and "$process.Kill()" in text(invoke)
    assert script.count("'docker.exe'") == 1 and "'docker.exe'" in text(invoke)
    docker_calls = calls(root, "Invoke-Docker")
    inside = [function(root, name) for name in ("Restart-Model", "Start-Model", "Get-Stopped")]
    assert docker_calls and all(any(f.start_byte <= c.start_byte < f.end_byte for f in inside) for c in docker_calls)
    for call in docker_calls:
        assert "$key" not in text(call).lower()
    # The key: read from its file, handed between the script's own functions, sent only as a request header.
    lines = {script.encode()[:n.start_byte].count(b"\n") for n in walk(root)
             if n.type == "variable" and text(n).lower() == "$key"}
    assert sorted(script.splitlines()[n].strip() for n in lines) == [
        "$answer = Invoke-OneToken $Model.port $Model.served_model_name $Key $Model.probe_timeout_s",
        "$key = Read-ApiKey $config",
        "$probe = Test-Completion $Model $Key",
        "function Invoke-Check($Model, $Key, [string] $StateDir) {",
        "function Invoke-OneToken([int] $Port, [string] $Model, [string] $Key, [int] $TimeoutS) {",
        "function Test-Completion($Model, $Key) {",
        "if ($Key) { $headers['Authorization'] = 'Bearer ' + $Key }",
        "if ((Invoke-Check $model $key $stateDir) -eq 'failed') { $failed = $true }",
    ]
    read = function(root, "Read-ApiKey")
    assert "Get-Content -LiteralPath $Config.api_key_env_file -Encoding UTF8" in text(read)
