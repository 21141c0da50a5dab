"""Scripts and files as Windows runs them (#31): every file reaches a Windows rig under a temporary
name and is moved into place in one step; the watchdog replaces its state the same way and bounds a
lock it cannot read; every command rigkit sends fits cmd.exe's command line or goes as a file.

Nothing runs PowerShell: the rendered and sent scripts are parsed with tree-sitter-powershell
(tests/ps51_rules.py) and their statements checked on the syntax tree. Simulates nothing.
"""

from __future__ import annotations

import re
from io import BytesIO

from pyinfra.api import FileUploadCommand

from rigkit.config.loader import load_rig
from rigkit.plumbing.render import ps_quote
from rigkit.windows.bundle import render_bundle
from rigkit.windows.upload import move_function, place_script, temporary_name, upload
from tests.conftest import DATA, REPO, TEST_CATALOG
from tests.ps51_rules import PARSER, findings
from tests.test_ps51_rules import HOSTILE
from tests.test_windows_watchdog import calls, function, statements, text, walk

WIN_RIG = DATA / "rigs" / "windows.yml"


def bundle() -> dict[str, str]:
    return render_bundle(load_rig(WIN_RIG, TEST_CATALOG))


# ----- 1. every file to a temporary name, then moved into place -------------------------------


def direct_uploads(source: str) -> list[str]:
    """Lines of a module of rigkit.windows that build an upload themselves (not through upload.py)."""
    return [line.strip() for line in source.splitlines() if re.search(r"\bFileUploadCommand\(", line)]


def test_every_upload_to_a_windows_rig_goes_through_the_one_temporary_name_and_move():
    """rigkit.windows.upload is the only module that uploads; the rule sees a planted direct upload."""
    folder = REPO / "rigkit" / "windows"
    offenders = {path.name: direct_uploads(path.read_text()) for path in folder.glob("*.py") if path.name != "upload.py"}
    assert {name: lines for name, lines in offenders.items() if lines} == {}
    assert direct_uploads("    yield FileUploadCommand(BytesIO(data), dest)\n")  # what operations.file did


def test_an_upload_lands_beside_its_destination_and_is_moved_over_it_with_the_shared_function():
    dest = f"C:\\ProgramData\\rigkit\\{HOSTILE}\\rigkit-watchdog.ps1"
    commands = list(upload(b"data", dest))
    assert len(commands) == 2 and isinstance(commands[0], FileUploadCommand)
    temporary = temporary_name(dest)
    assert commands[0].dest == temporary != dest
    assert temporary.rsplit("\\", 1)[0] == dest.rsplit("\\", 1)[0]  # same folder: same volume, one rename
    assert isinstance(commands[0].src, BytesIO) and commands[0].src.getvalue() == b"data"
    script = commands[1]
    assert script.splitlines()[0] == f"# rigkit: place-file {ps_quote(temporary)} {ps_quote(dest)}"
    assert script.rstrip().splitlines()[-1] == f"Move-IntoPlace {ps_quote(temporary)} {ps_quote(dest)}"
    assert move_function() in script
    assert findings(script) == [], findings(script)


def test_move_into_place_replaces_in_one_step_and_moves_a_leftover_complete_file_in():
    """On its syntax tree: [IO.File]::Replace where the destination exists (with a real null backup
    name), [IO.File]::Move where it does not; after a failure, the (complete) temporary file is moved
    in only where the destination is gone, else the error names both paths. Never Move-Item."""
    root = PARSER.parse(move_function().encode()).root_node
    move = function(root, "Move-IntoPlace")
    body = text(move)
    assert "Move-Item" not in body and "Remove-Item" not in body
    branch = next(n for n in walk(move) if n.type == "if_statement")
    assert "[IO.File]::Exists($Destination)" in text(branch).splitlines()[0]
    assert "[IO.File]::Replace($Temporary, $Destination, [NullString]::Value)" in text(branch)
    assert "[IO.File]::Move($Temporary, $Destination)" in text(next(c for c in branch.children if c.type == "else_clause"))
    catch = next(n for n in walk(move) if n.type == "catch_clause")
    recovery = next(n for n in walk(catch) if n.type == "if_statement")
    assert text(recovery).startswith("if ([IO.File]::Exists($Temporary) -and -not [IO.File]::Exists($Destination))")
    assert "throw" in text(catch)


def test_the_private_key_and_install_ps1_use_the_same_move():
    from rigkit.windows.acl_file import place_script as private_place

    key = private_place("C:\\s\\.k.rigkit-upload", "C:\\s\\k")
    assert move_function() in key and "Move-Item" not in key
    lines = key.splitlines()
    moved = lines.index("Move-IntoPlace 'C:\\s\\.k.rigkit-upload' 'C:\\s\\k'")
    icacls = [n for n, line in enumerate(lines) if line.startswith("Invoke-Icacls @(")]
    assert icacls and min(icacls) < moved < max(icacls)  # the temporary file's ACL set before it takes the key's place
    install = bundle()["install.ps1"]
    root = PARSER.parse(install.encode()).root_node
    assert "function Move-IntoPlace" in install and "Copy-Item -LiteralPath $item.FullName -Destination $temporary" in install
    copies = calls(root, "Copy-Item")
    assert len(copies) == 1 and "$temporary" in text(copies[0])  # nothing copied over an installed file
    assert len(calls(root, "Move-IntoPlace")) == 1


def test_move_into_place_is_written_once():
    """The function is defined in templates/windows/_replace.ps1.j2 only; the Python side renders it."""
    definitions = [path.relative_to(REPO).as_posix() for path in [*(REPO / "templates").rglob("*"), *(REPO / "rigkit").rglob("*.py")]
                   if path.is_file() and "function Move-IntoPlace" in path.read_text(errors="replace")]
    assert definitions == ["templates/windows/_replace.ps1.j2"]
    assert bundle()["scripts/rigkit-watchdog.ps1"].count("function Move-IntoPlace") == 1


# ----- 2. the watchdog's state replaced atomically; the lock bounded ---------------------------


def watchdog():
    script = bundle()["scripts/rigkit-watchdog.ps1"]
    return script, PARSER.parse(script.encode()).root_node


def test_the_watchdog_writes_its_state_only_whole_and_on_disk_then_moves_it_in():
    script, root = watchdog()
    assert "Move-Item" not in script and "Set-Content" not in script
    check = function(root, "Invoke-Check")
    writes = calls(check, "Write-FileAtomically")
    assert [text(c) for c in writes] == ["Write-FileAtomically $path ($State | ConvertTo-Json -Depth 5 -Compress)"]
    write = function(root, "Write-FileAtomically")
    body = text(write)
    assert "$temporary = $Path + '.tmp'" in body and "[IO.FileOptions]::WriteThrough" in body
    order = [body.index(part) for part in ("$stream.Write(", "$stream.Flush($true)", "$stream.Dispose()",
                                           "Move-IntoPlace $temporary $Path")]
    assert order == sorted(order)  # on disk and closed before it takes the state's place


def test_a_state_file_left_by_a_stopped_run_is_recovered_when_whole_and_removed_when_not():
    _, root = watchdog()
    read = function(root, "Read-State")
    body = statements(read)
    leftover = body[1]
    assert text(body[0]) == "$temporary = $Path + '.tmp'"
    assert leftover.type == "if_statement" and condition_text(leftover) == "Test-Path -LiteralPath $temporary -PathType Leaf"
    decision = next(n for n in walk(leftover) if n.type == "if_statement" and n is not leftover)
    assert condition_text(decision) == "$left -is [hashtable]"  # whole JSON (a part does not parse)
    whole = next(c for c in decision.children if c.type == "statement_block")
    part = next(c for c in decision.children if c.type == "else_clause")
    assert "Move-IntoPlace $temporary $Path" in text(whole) and "Write-Log" in text(whole)
    assert "Remove-Item -LiteralPath $temporary -Force" in text(part) and "Write-Log" in text(part)
    # The recovery runs before the state is read, so the state read is the newest.
    reads = [n for n in walk(read) if n.type == "command" and text(n).startswith("Get-Content -Raw -Encoding UTF8 -LiteralPath $Path")]
    assert reads and all(r.start_byte > leftover.end_byte for r in reads)
    assert len(calls(function(root, "Invoke-Check"), "Read-State")) == 1


def condition_text(if_node) -> str:
    return text(next(c for c in if_node.children if c.type == "pipeline"))


def test_the_lock_tells_a_holder_from_a_lock_it_cannot_open():
    script, root = watchdog()
    enter = function(root, "Enter-RolloutLock")
    catch = next(n for n in walk(enter) if n.type == "catch_clause")
    assert "if (Test-HeldByAnother $_) { return @{ Held = $true } }" in text(catch)
    assert "return @{ Error = $_.Exception.GetBaseException().Message }" in text(catch)
    held = function(root, "Test-HeldByAnother")
    assert "@(32, 33) -contains ($cause.HResult -band 0xFFFF)" in text(held)  # ERROR_SHARING/LOCK_VIOLATION
    assert "[IO.IOException]" in text(held)
    bootstrap = bundle()["scripts/llm-bootstrap.ps1"]
    assert "if (-not $RolloutLock.Held) { Stop-WithError ('cannot open the rollout lock" in bootstrap


def test_holding_off_is_bounded_in_time_for_a_held_and_for_an_unreadable_lock(tmp_path):
    """Get-LockAccess returns 'rollout' or 'unreadable' (hold off) only after the time the lock has not
    been taken was compared with its bound ('overdue': act); the bound for a held lock is the
    bootstrap's whole time (its task limit and stop), for an unreadable one LOCK_UNREADABLE_LIMIT_S."""
    from rigkit.windows.timing import bootstrap_budget
    from rigkit.windows.watchdog import LOCK_UNREADABLE_LIMIT_S

    script, root = watchdog()
    access = function(root, "Get-LockAccess")
    body = statements(access)
    kinds = [text(s) for s in body]
    overdue = next(i for i, s in enumerate(kinds) if s == "if ($blockedS -ge $limitS) { return 'overdue' }")
    holds = [i for i, s in enumerate(kinds) if "return 'rollout'" in s or s == "return 'unreadable'"]
    assert holds and min(holds) > overdue
    assert "$blockedS = $Now - [double] $State['lock_blocked_since']" in kinds
    assert "if ($Lock.Held) { $limitS = $RolloutMaxS }" in kinds and "$limitS = $LockUnreadableLimitS" in kinds
    taken = body[0]
    assert condition_text(taken) == "$null -ne $Lock.Handle" and "$State['lock_blocked_since'] = $null" in text(taken)
    rig = load_rig(WIN_RIG, TEST_CATALOG)
    assert f"$RolloutMaxS = {bootstrap_budget(rig).deploy_wait_s} " in script
    assert f"$LockUnreadableLimitS = {LOCK_UNREADABLE_LIMIT_S} " in script
    # 'overdue' restarts, and says so; nothing else is taken to mean "act".
    wedged = function(root, "Invoke-Action")
    said = next(s for s in statements(wedged) if s.type == "if_statement" and condition_text(s) == "$access -eq 'overdue'")
    assert "acting without it" in text(said) and "return" not in text(said)


# ----- 3. every command under cmd.exe's 8191 characters, or sent as a file ---------------------


def sent_markers() -> set[str]:
    """The `# rigkit: <what>` of every script rigkit.windows can send (its source's literal markers,
    and the two built from a name: a fact's file read and an upload's move)."""
    found = set()
    for path in (REPO / "rigkit" / "windows").glob("*.py"):
        found |= set(re.findall(r"# rigkit: ([a-z][a-z0-9-]+)", path.read_text()))
    return found | {"file-sha256", "read-text", "place-file", "place-private-file"}


def test_every_script_rigkit_sends_fits_cmd_exes_line_or_goes_as_a_file(tmp_path):
    """Each script, for every rig variant (hostile names, keyed, remove), through plan_command with a
    long home folder: the line sshd gets is at most COMMAND_LINE_MAX (8191 less room for the shell's
    path); a script sent as a file is exactly what the encoded command would have run, with a BOM,
    and its stager names its SHA-256."""
    import base64
    import hashlib

    from rigkit.windows.connector import (
        CMD_LINE_MAX,
        COMMAND_LINE_MAX,
        FILE_COMMAND_MARK,
        plan_command,
        powershell_command_line,
        wrap,
    )
    from tests.test_ps51_rules import raw_sent_scripts, rig_variants

    assert CMD_LINE_MAX == 8191 and COMMAND_LINE_MAX <= CMD_LINE_MAX - 260
    home = "/C:/Users/" + "a-rather-long-user-name" * 3
    as_files, kinds = set(), set()
    for rig in rig_variants(tmp_path):
        for kind, script in raw_sent_scripts(rig).items():
            first = script.splitlines()[0] if script else ""
            kinds.add(first.split()[2] if first.startswith("# rigkit: ") else kind)
            planned = plan_command(script, lambda: home)
            assert len(planned.line) <= COMMAND_LINE_MAX, (rig.file, kind, len(planned.line))
            if planned.upload is None:
                assert planned.line == powershell_command_line(script)
                continue
            as_files.add(kind)
            relative, data = planned.upload
            assert data == b"\xef\xbb\xbf" + wrap(script).encode("utf-8")
            digest = hashlib.sha256(data).hexdigest()
            assert relative == f".rigkit-commands/{digest}.ps1"
            stager = base64.b64decode(planned.line.rsplit(" ", 1)[1]).decode("utf-16-le")
            assert f"{FILE_COMMAND_MARK} 'C:\\Users\\{'a-rather-long-user-name' * 3}\\.rigkit-commands\\{digest}.ps1' " \
                   f"{digest.upper()}" in stager
            assert findings(stager) == [] and findings(data.decode("utf-8-sig")) == []
    assert sent_markers() <= kinds, sent_markers() - kinds  # every script rigkit.windows sends was checked
    assert "secure-install-dir" in as_files  # too long for the line: the file path is exercised


def test_a_long_script_goes_as_a_file_and_a_short_one_never_asks_for_the_home_folder():
    """A planted long script: its encoded line would exceed the limit, so it is sent as a file."""
    from rigkit.windows.connector import COMMAND_LINE_MAX, plan_command, powershell_command_line

    long_script = "# rigkit: planted\n" + "Write-Output 'x'\n" * 300
    assert len(powershell_command_line(long_script)) > COMMAND_LINE_MAX
    planned = plan_command(long_script, lambda: "/C:/Users/you")
    assert planned.upload is not None and len(planned.line) <= COMMAND_LINE_MAX

    def no_home():
        raise AssertionError("a short script needs no upload")

    assert plan_command("Write-Output 'x'", no_home).upload is None


def test_the_stager_runs_the_file_only_while_holding_it_and_after_its_digest_matched():
    from rigkit.windows.connector import file_stager

    script = file_stager("C:\\Users\\you\\.rigkit-commands\\x.ps1", "ab" * 32)
    root = PARSER.parse(script.encode()).root_node
    guarded = next(n for n in walk(root) if n.type == "try_statement")
    body = text(guarded)
    order = [body.index(part) for part in ("ComputeHash($hold)", f"if ($sha -ne '{'AB' * 32}') {{ throw", "& $path",
                                          "$hold.Dispose()", "Remove-Item -LiteralPath $path")]
    assert order == sorted(order)
    assert "[IO.FileShare]::Read)" in script and script.index("$hold = ") < guarded.start_byte
    assert script.rstrip().endswith("exit $code")
