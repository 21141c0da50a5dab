"""The Windows PowerShell 5.1 rules (tests/ps51_rules.py): each catches its planted pitfall and
passes the fixed form; every script rigkit renders or sends passes every rule.

Nothing runs PowerShell: scripts are parsed with tree-sitter-powershell. Simulates nothing.
"""

from __future__ import annotations

import pytest

from tests.ps51_rules import RULES, findings

STOP = "$ErrorActionPreference = 'Stop'\n"

# (rule, a script with the pitfall, the same script fixed)
PLANTED = [
    ("native-stderr-under-stop",
     STOP + "$out = & docker.exe compose up -d 2>&1 | Out-String",
     STOP + "$ErrorActionPreference = 'Continue'\n$out = & docker.exe compose up -d 2>&1 | Out-String"),
    ("native-stderr-under-stop",
     STOP + "nvidia-smi -rgc 2> $null",
     STOP + "nvidia-smi -rgc"),
    ("native-stderr-under-stop",  # a function inherits its caller's Stop
     STOP + "function Test-Docker { & docker info *>&1 | Out-Null }",
     STOP + "function Test-Docker { $ErrorActionPreference = 'Continue'; & docker info *>&1 | Out-Null }"),
    ("native-stderr-under-stop",  # Continue set only in a branch that may not run
     STOP + "if ($x) { $ErrorActionPreference = 'Continue' }\n& $smi -L 2>&1",
     STOP + "if ($x) { $y = 1 }\n$ErrorActionPreference = 'Continue'\n& $smi -L 2>&1"),
    ("native-stderr-under-stop",  # Stop set again later in the loop the call is in
     "foreach ($i in 1..2) { & nvidia-smi.exe -L 2>&1; $ErrorActionPreference = 'Stop' }",
     "foreach ($i in 1..2) { & nvidia-smi.exe -L 2>&1; $ErrorActionPreference = 'Continue' }"),
    ("write-error-under-stop",
     STOP + "if (-not $admin) {\n    Write-Error 'Not elevated'\n    exit 1\n}",
     STOP + "if (-not $admin) {\n    [Console]::Error.WriteLine('Not elevated')\n    exit 1\n}"),
    ("write-error-under-stop",  # an explicit Continue on the call is fine
     STOP + "function F { Write-Error 'x' }",
     STOP + "function F { Write-Error 'x' -ErrorAction Continue }"),
    ("file-encoding",
     "'x' | Out-File -FilePath 'C:\\log.txt'",
     "'x' | Out-File -FilePath 'C:\\log.txt' -Encoding UTF8"),
    ("file-encoding",
     "Write-Output 'x' >> 'C:\\log.txt'",
     "Write-Output 'x' > $null"),
    ("file-encoding",
     "Add-Content -LiteralPath $log -Value $line",
     "Add-Content -LiteralPath $log -Value $line -Encoding UTF8"),
    ("file-encoding",
     "Set-Content -LiteralPath $f -Value 'x'",
     "Set-Content -LiteralPath $f -Value 'x' -Encoding ASCII"),
    ("file-encoding",
     "Get-Content -Raw -LiteralPath $f",
     "Get-Content -Raw -Encoding UTF8 -LiteralPath $f"),
    ("literal-path",
     "Test-Path $script",
     "Test-Path -LiteralPath $script"),
    ("literal-path",
     "Remove-Item -Path 'C:\\rigs\\[2x4090]' -Recurse",
     "Remove-Item -LiteralPath 'C:\\rigs\\[2x4090]' -Recurse"),
    ("literal-path",
     "Get-FileHash -Algorithm SHA256 -Path $path",
     "Get-FileHash -Algorithm SHA256 -LiteralPath $path"),
    ("literal-path",
     "Copy-Item -Path (Join-Path $Here 'scripts\\*') -Destination $d",
     "Get-ChildItem -LiteralPath (Join-Path $Here 'scripts') | Copy-Item -Destination $d"),
    ("not-in-5.1", "docker info && Write-Output up", "docker info; if ($LASTEXITCODE -eq 0) { Write-Output up }"),
    ("not-in-5.1", "docker info || exit 1", "docker info; if ($LASTEXITCODE -ne 0) { exit 1 }"),
    ("not-in-5.1", "$w = $cap ? $cap : 450", "$w = if ($cap) { $cap } else { 450 }"),
    ("not-in-5.1", "$w = $cap ?? 450", "$w = if ($null -ne $cap) { $cap } else { 450 }"),
    ("not-in-5.1", "$w ??= 450", "if ($null -eq $w) { $w = 450 }"),
    ("not-in-5.1", "$n = $gpu?.Name", "$n = $gpu.Name"),
    ("not-in-5.1", "function F { process { $_ } clean { x } }", "function F { process { $_ } end { x } }"),
    ("not-in-5.1", "$Gpus | ForEach-Object -Parallel { $_ }", "$Gpus | ForEach-Object { $_ }"),
    ("not-in-5.1", "Get-Content -LiteralPath $f -AsByteStream", "Get-Content -LiteralPath $f -Encoding Byte"),
    ("not-in-5.1", "Write-Output $PSStyle.Reset", "Write-Output ''"),
    ("not-in-5.1", "Join-Path $dir 'stacks' 'compose.yml'", "Join-Path (Join-Path $dir 'stacks') 'compose.yml'"),
    ("not-in-5.1", "$h = $json | ConvertFrom-Json -AsHashtable", "$h = $json | ConvertFrom-Json"),
    ("not-in-5.1", "Set-Content -LiteralPath $f -Value 'x' -Encoding utf8NoBOM",
     "Set-Content -LiteralPath $f -Value 'x' -Encoding UTF8"),
    ("non-atomic-replace",  # what the watchdog's state write did
     "Move-Item -LiteralPath $temporary -Destination $path -Force",
     "Move-IntoPlace $temporary $path"),
    ("non-atomic-replace",  # what install.ps1 did: the installed scripts rewritten in place
     "Get-ChildItem -LiteralPath $src | Copy-Item -Destination $InstallDir -Recurse -Force",
     "Copy-Item -LiteralPath $item.FullName -Destination $temporary -Force\nMove-IntoPlace $temporary $target"),
    ("replace-null-backup",
     "[IO.File]::Replace($temporary, $path, $null)",
     "[IO.File]::Replace($temporary, $path, [NullString]::Value)"),
    ("replace-null-backup",
     "[System.IO.File]::Replace($a, $b, $NULL)",
     "[System.IO.File]::Replace($a, $b, $backup)"),
    ("lock-catch-all",  # what the watchdog did: any error read as "a rollout holds it"
     "function Enter-RolloutLock {\n    try {\n        return [IO.File]::Open($LockFile, [IO.FileMode]::OpenOrCreate, "
     "[IO.FileAccess]::ReadWrite, [IO.FileShare]::None)\n    } catch {\n        return $null\n    }\n}",
     "function Test-HeldByAnother($e) { @(32, 33) -contains ($e.Exception.GetBaseException().HResult -band 0xFFFF) }\n"
     "function Enter-RolloutLock {\n    try {\n        return @{ Handle = [IO.File]::Open($LockFile, [IO.FileMode]::OpenOrCreate, "
     "[IO.FileAccess]::ReadWrite, [IO.FileShare]::None) }\n    } catch {\n        if (Test-HeldByAnother $_) { return @{ Held = $true } }\n"
     "        return @{ Error = $_.Exception.Message }\n    }\n}"),
    ("lock-catch-all",
     "try { $l = [IO.File]::Open($f, 'OpenOrCreate', 'ReadWrite', [IO.FileShare]::None) } catch { Start-Sleep 1 }",
     "try { $l = [IO.File]::Open($f, 'OpenOrCreate', 'ReadWrite', [IO.FileShare]::None) } "
     "catch { if (($_.Exception.GetBaseException().HResult -band 0xFFFF) -ne 32) { throw } }"),
    ("unbounded-wait",
     "while (-not (Test-Docker)) { Start-Sleep -Seconds 3 }",
     "$deadline = (Get-Date).AddSeconds(180)\nwhile (-not (Test-Docker)) {\n"
     "    if ((Get-Date) -gt $deadline) { exit 1 }\n    Start-Sleep -Seconds 3\n}"),
    ("positional-binding",  # what rigkit's key upload sent until the install folder's owner was checked
     "function Invoke-Icacls([string[]] $Arguments) { & icacls.exe @Arguments }\n"
     "Invoke-Icacls 'C:\\x' '/inheritance:r' '/grant:r' '*S-1-5-18:F'",
     "function Invoke-Icacls([string[]] $Arguments) { & icacls.exe @Arguments }\n"
     "Invoke-Icacls @('C:\\x', '/inheritance:r', '/grant:r', '*S-1-5-18:F')"),
    ("positional-binding",
     "function Write-Log { param([string] $Message)\n Add-Content -LiteralPath $l -Value $Message -Encoding UTF8 }\n"
     "Write-Log 'GPU' 0 'applied'",
     "function Write-Log { param([string] $Message)\n Add-Content -LiteralPath $l -Value $Message -Encoding UTF8 }\n"
     "Write-Log ('GPU {0} applied' -f 0)"),
]


@pytest.mark.parametrize("rule, pitfall, fixed", PLANTED, ids=[f"{r}-{n}" for n, (r, _, _) in enumerate(PLANTED)])
def test_each_rule_catches_its_planted_pitfall_and_passes_the_fix(rule, pitfall, fixed):
    assert rule in {f.rule for f in findings(pitfall)}, findings(pitfall)
    assert findings(fixed) == [], findings(fixed)


def test_every_rule_has_a_reason_and_a_planted_example():
    assert {rule for rule, _, _ in PLANTED} == set(RULES)
    assert all(len(reason) > 60 for reason in RULES.values())


def test_the_grammar_parses_pipeline_chains_so_the_rule_looks_for_them():
    """tree-sitter-powershell knows PowerShell 7's && and ||: they parse (no ERROR node) and
    only the pipeline-chain rule catches them; ternaries and ?? do not parse."""
    assert [f.message for f in findings("a && b")] == ["pipeline chain && (PowerShell 7 only)"]
    assert "does not parse" in findings("$x = $a ? 1 : 2")[0].message


def test_a_native_call_with_continue_around_it_passes():
    script = STOP + (
        "function Invoke-Native([string[]] $Arguments) {\n"
        "    $ErrorActionPreference = 'Continue'\n"
        "    $out = & nvidia-smi.exe @Arguments 2>&1 | Out-String\n"
        "    return $LASTEXITCODE\n"
        "}\n"
        "& docker.exe info\n"  # no redirection: stderr is not turned into errors
    )
    assert findings(script) == []


# ----- every script rigkit renders or sends --------------------------------------------

HOSTILE = "it's ‘odd’ [2x] $(rm -rf x)"


def rig_variants(tmp_path) -> list:
    """The shipped example rig and the test rig, each as it is, with hostile rig and model
    names, without caps or clock locks, with gpu_policy: remove, and with an API key. The loader refuses
    hostile names (rigkit.config.names); they are put in after loading, so the templates'
    quoting is checked even for values that can no longer reach them."""
    from dataclasses import replace

    from rigkit.config.loader import load_rig
    from tests.conftest import DATA, REPO

    rigs = []
    shipped = [(REPO / "inventory/rigs/win-2x4090-48gb.yml", REPO / "inventory/models"),
               (DATA / "rigs/windows.yml", DATA / "models")]
    for n, (rig_file, catalog) in enumerate(shipped):
        text = rig_file.read_text()
        rig = load_rig(rig_file, catalog)
        rigs.append(rig)
        rigs.append(replace(rig, name=HOSTILE, models=tuple(replace(m, name=HOSTILE) for m in rig.models)))
        folder = tmp_path / f"rig{n}"
        folder.mkdir(parents=True)
        variants = {
            "uncapped.yml": "\n".join(line for line in text.splitlines()
                                      if "power_limit_w" not in line and "clock_lock_mhz" not in line) + "\n",
            "remove.yml": text + "gpu_policy: remove\n",
            "keyed.yml": text + "api_key_file: /nonexistent/key\n",  # the key's branches of the scripts
        }
        for name, variant in variants.items():
            (folder / name).write_text(variant)
            rigs.append(load_rig(folder / name, catalog))
    return rigs


def sent_scripts(rig) -> dict[str, str]:
    """Every script the facts and operations send for `rig`, as the connector wraps it and
    powershell.exe decodes it."""
    import base64

    from rigkit.windows.connector import powershell_command_line

    decode = lambda line: base64.b64decode(line.rsplit(" ", 1)[1]).decode("utf-16-le")  # noqa: E731
    return {kind: decode(powershell_command_line(script)) for kind, script in raw_sent_scripts(rig).items()}


def raw_sent_scripts(rig) -> dict[str, str]:
    """Every script the facts and operations send for `rig` (hostile names and paths), before the
    connector wraps it; and the connector's own: an empty script, and the stager of a long one."""
    from rigkit.windows import facts, install_dir
    from rigkit.windows import operations as winops
    from rigkit.windows import acl_file, upload
    from rigkit.windows.bundle import render_bundle
    from rigkit.windows.names import LOG_PATH, TASK_BOOTSTRAP, TASK_POWER
    from rigkit.windows.connector import file_stager

    path = f"C:\\ProgramData\\rigkit\\{HOSTILE}\\x.ps1"
    scripts = {
        "file-sha256": facts.WindowsFileSha256().command(path=path),
        "read-text": facts.WindowsTextFile().command(path=path),
        "export-task": facts.ScheduledTaskXml().command(task_name=HOSTILE),
        "nvidia-smi": facts.WindowsNvidiaGpus().command(),
        "weights-check": facts.WindowsWeightsVolumeState().command(
            volume=f"rigkit-weights-{HOSTILE}", source=f"C:\\models\\{HOSTILE}", image=f"vllm/{HOSTILE}:1", copier=path),
        "register-task": winops.register_task_script(HOSTILE, path),
        "register-task as SYSTEM": winops.register_task_script(HOSTILE, path, as_connecting_user=False),
        "private-file-state": acl_file.WindowsPrivateFile().command(path=path),
        "install-dir-state": install_dir.WindowsInstallDir().command(),
        "secure-install-dir": install_dir.secure_install_script(),
        "secure-folder": acl_file.secure_folder_script(path),
        "place-private-file": acl_file.place_script(acl_file.temporary_name(path), path),
        "protect-file": acl_file.protect_script(path),
        "place-file": upload.place_script("place-file", upload.temporary_name(path), path),
        "run-task": winops.run_task_script(HOSTILE, path, "ab" * 32, 1320, str(LOG_PATH)),
        "windows-preflight": facts.WindowsPreflightFacts().command(
            image=f"vllm/{HOSTILE}:1", sources={"m1": f"C:\\models\\{HOSTILE}", "m2": f"D:\\{HOSTILE}"}),
        "wsl-shutdown": winops.restart_wsl_script(),
        "uninstall": winops.uninstall_script(render_bundle(rig)["uninstall.ps1"], [TASK_POWER, TASK_BOOTSTRAP]),
        "connector wrapper": "",
        "file stager": file_stager(f"C:\\Users\\{HOSTILE}\\.rigkit-commands\\x.ps1", "ab" * 32),
    }
    return scripts


def test_every_script_rigkit_renders_or_sends_passes_every_rule(tmp_path):
    from rigkit.plumbing.render import ps_quote
    from rigkit.windows.bundle import render_bundle

    checked = 0
    for rig in rig_variants(tmp_path):
        scripts = {name: text for name, text in render_bundle(rig).items() if name.endswith(".ps1")}
        assert set(scripts) == {"scripts/gpu-power-policy.ps1", "scripts/llm-bootstrap.ps1", "install.ps1",
                                "uninstall.ps1", "scripts/rigkit-watchdog.ps1"}
        if rig.name == HOSTILE:  # the names reached the scripts, as quoted literals
            assert ps_quote(HOSTILE) in scripts["scripts/llm-bootstrap.ps1"]
            assert ps_quote(f"C:\\ProgramData\\rigkit\\stacks\\{HOSTILE}\\compose.yml") in scripts["scripts/llm-bootstrap.ps1"]
        scripts.update(sent_scripts(rig))
        for name, script in scripts.items():
            assert findings(script) == [], f"{rig.file} {name}:\n" + "\n".join(map(str, findings(script)))
            checked += 1
    assert checked == 10 * 25
