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
from rigkit.render import ps_quote
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
    from rigkit.windows.private_file import place_script as private_place

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
