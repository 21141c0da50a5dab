"""Who owns C:\\ProgramData\\rigkit, and who may change it: the install folder secured before
rigkit puts anything in it, and the fact it is compared with.

C:\\ProgramData lets every user create a folder, and the creator owns it: a user who makes
C:\\ProgramData\\rigkit (or secrets\\, watchdog\\, ...) before the first deploy could change its ACL
at will, replace rigkit-watchdog.ps1 (run as SYSTEM) or open secrets\\ again. So, before any file
goes there, `secure_install_dir`:

1. refuses a link (reparse point) at the folder itself (it could lead anywhere), and makes it;
2. `icacls <folder> /setowner *S-1-5-32-544 /T /C /L`: Administrators own all of it (first: a
   user's ACL may deny Administrators everything but what an owner always may, rewrite the ACL);
3. `icacls <folder> /inheritance:r /grant:r *S-1-5-18:(OI)(CI)F *S-1-5-32-544:(OI)(CI)F /T /C /L`:
   no inherited entries (C:\\ProgramData grants Users), SYSTEM and Administrators full control;
4. makes the subfolders rigkit uses (`SUBFOLDERS`) and takes ownership again (their creator may
   own them, by local policy), so each starts as rigkit's;
5. refuses any link found inside, then removes, with `icacls <folder> /remove *SID /T /C /L`, every
   other SID an entry still names (a user's own explicit entries survive step 3);
6. reads everything back (`Get-Acl`: owner and access rules, by SID) and fails, naming each path,
   unless every item is owned by Administrators or SYSTEM and grants only those two, and the
   folder itself is protected.

`WindowsInstallDir` reads the same for the folder and `SUBFOLDERS` (read-only, never the files'
content); the operation runs only when it reports a problem, so a second deploy sends no icacls.
SIDs, not names: names are translated per display language. /L acts on a link itself, never on
where it leads.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FactBase, operation

from rigkit.plumbing.facts_once import read_once
from rigkit.plumbing.render import ps_quote
from rigkit.windows.facts import ABSENT
from rigkit.windows.acl_file import ADMINISTRATORS_SID, ALLOWED_SIDS, ICACLS_FUNCTION
from rigkit.windows.names import INSTALL_DIR, SUBFOLDERS

ROOT = "."  # the install folder itself, in the fact's answer

_ALLOWED = "@(" + ", ".join(ps_quote(s) for s in ALLOWED_SIDS) + ")"
# One line per folder: owner, protected, the SIDs its access rules name, link, folder; or why not readable.
_STATE_LINE = (
    "        $acl = Get-Acl -LiteralPath $path\n"
    "        $sids = @($acl.GetAccessRules($true, $true, [Security.Principal.SecurityIdentifier]) | "
    "ForEach-Object { $_.IdentityReference.Value } | Sort-Object -Unique)\n"
    "        '{0}|owner={1}|protected={2}|sids={3}|link={4}|folder={5}' -f $name, "
    "$acl.GetOwner([Security.Principal.SecurityIdentifier]).Value, $acl.AreAccessRulesProtected, ($sids -join ','), "
    "[bool] ($item.Attributes -band [IO.FileAttributes]::ReparsePoint), $item.PSIsContainer\n"
)


def _folders_line() -> str:
    return " ".join(ps_quote(name) for name in (ROOT, *SUBFOLDERS))


class WindowsInstallDir(FactBase):
    """{folder: state} for INSTALL_DIR ("." ) and each of SUBFOLDERS that exists, or None where
    INSTALL_DIR does not. state: {"owner": SID, "protected": bool, "sids": [SID], "link": bool,
    "folder": bool}, or {"unreadable": why} where Get-Acl failed (a user's ACL may lock
    Administrators out until they take ownership)."""

    def command(self) -> str:
        return install_dir_state_script()

    def process(self, output) -> dict | None:
        lines = [line.strip() for line in output if line.strip()]
        if lines == [ABSENT]:
            return None
        return dict(_parse_line(line) for line in lines if "|" in line)


def install_dir_state_script() -> str:
    root = ps_quote(INSTALL_DIR)
    return (
        f"# rigkit: install-dir-state {root} {_folders_line()}\n"
        f"$root = {root}\n"
        f"if (-not (Test-Path -LiteralPath $root)) {{ {ps_quote(ABSENT)}; exit 0 }}\n"
        f"foreach ($name in @({', '.join(ps_quote(n) for n in (ROOT, *SUBFOLDERS))})) {{\n"
        f"    $path = if ($name -eq {ps_quote(ROOT)}) {{ $root }} else {{ Join-Path $root $name }}\n"
        "    if (-not (Test-Path -LiteralPath $path)) { continue }\n"
        "    try {\n"
        "        $item = Get-Item -LiteralPath $path -Force\n"
        + _STATE_LINE
        + "    } catch {\n"
        "        '{0}|unreadable={1}' -f $name, $_.Exception.Message\n"
        "    }\n"
        "}"
    )


def _parse_line(line: str) -> tuple[str, dict]:
    name, rest = line.split("|", 1)
    if rest.startswith("unreadable="):
        return name, {"unreadable": rest.removeprefix("unreadable=")}
    values = dict(part.split("=", 1) for part in rest.split("|") if "=" in part)
    return name, {
        "owner": values.get("owner", ""),
        "protected": values.get("protected", "").lower() == "true",
        "sids": sorted(s for s in values.get("sids", "").split(",") if s),
        "link": values.get("link", "").lower() == "true",
        "folder": values.get("folder", "").lower() == "true",
    }


def install_dir_problems(state: dict | None) -> list[str]:
    """What is not as `secure_install_dir` leaves it, one line per problem; [] when secure.
    Subfolders may inherit (rigkit makes some later, under the secured folder); the folder may not."""
    if state is None:
        return [f"{INSTALL_DIR} does not exist yet"]
    problems = []
    for name, folder in state.items():
        path = str(INSTALL_DIR if name == ROOT else INSTALL_DIR / name)
        if "unreadable" in folder:
            problems.append(f"{path}: its ACL cannot be read ({folder['unreadable']})")
            continue
        if folder["link"]:
            problems.append(f"{path} is a link (reparse point)")
        if not folder["folder"]:
            problems.append(f"{path} is not a folder")
        if folder["owner"] not in ALLOWED_SIDS:
            problems.append(f"{path} is owned by {folder['owner'] or 'nobody'}, not Administrators or SYSTEM")
        if set(folder["sids"]) != set(ALLOWED_SIDS):
            problems.append(f"{path} grants {', '.join(folder['sids']) or 'nobody'}, not SYSTEM and Administrators only")
        if name == ROOT and not folder["protected"]:
            problems.append(f"{path} inherits entries from {INSTALL_DIR.parent}")
    return problems


def _icacls(*arguments: str) -> str:
    return "Invoke-Icacls @(" + ", ".join(ps_quote(a) for a in arguments) + ")\n"


# The read-back: every item owned by an allowed SID, naming only allowed SIDs; the folder protected.
_ASSERT_INSTALL_DIR = (
    "function Assert-InstallDir {\n"
    "    $wrong = @()\n"
    "    foreach ($item in Get-Tree) {\n"
    "        $acl = Get-Acl -LiteralPath $item.FullName\n"
    "        $owner = $acl.GetOwner([Security.Principal.SecurityIdentifier]).Value\n"
    "        $sids = @($acl.GetAccessRules($true, $true, [Security.Principal.SecurityIdentifier]) | "
    "ForEach-Object { $_.IdentityReference.Value } | Sort-Object -Unique)\n"
    "        $others = @($sids | Where-Object { $allowed -notcontains $_ })\n"
    "        if ($allowed -notcontains $owner -or $others.Count -gt 0) {\n"
    "            $wrong += ('{0} (owner {1}, grants {2})' -f $item.FullName, $owner, ($sids -join ', '))\n"
    "        }\n"
    "    }\n"
    "    if (-not (Get-Acl -LiteralPath $root).AreAccessRulesProtected) { $wrong += ('{0} (inherits)' -f $root) }\n"
    "    if ($wrong.Count -gt 0) {\n"
    "        throw ('not secured, so nothing was put there: {0}; only SYSTEM and Administrators may own it or be "
    "granted anything' -f ($wrong -join '; '))\n"
    "    }\n"
    "    'secured: {0} owned by Administrators, SYSTEM and Administrators only' -f $root\n"
    "}\n"
)


def secure_install_script() -> str:
    """The module docstring's steps, for INSTALL_DIR (also the offline bundle's install.ps1's first
    step, without this marker line)."""
    root = str(INSTALL_DIR)
    grants = (f"*{sid}:(OI)(CI)F" for sid in ALLOWED_SIDS)
    subfolders = ", ".join(ps_quote(n) for n in SUBFOLDERS)
    take_ownership = _icacls(root, "/setowner", f"*{ADMINISTRATORS_SID}", "/T", "/C", "/L", "/Q")
    return (
        f"# rigkit: secure-install-dir {ps_quote(root)} {_folders_line()}\n"
        + ICACLS_FUNCTION
        + f"$root = {ps_quote(root)}\n"
        f"$allowed = {_ALLOWED}\n"
        "function Get-Tree { @(Get-Item -LiteralPath $root -Force) + @(Get-ChildItem -LiteralPath $root -Recurse -Force) }\n"
        "function Test-Link($Item) { [bool] ($Item.Attributes -band [IO.FileAttributes]::ReparsePoint) }\n"
        + _ASSERT_INSTALL_DIR
        + "if ((Test-Path -LiteralPath $root) -and (Test-Link (Get-Item -LiteralPath $root -Force))) {\n"
        "    throw ('{0} is a link (reparse point): it could lead anywhere. Remove the link itself "
        "(not what it points to), then try again' -f $root)\n"
        "}\n"
        "New-Item -ItemType Directory -Force -Path $root | Out-Null\n"
        # Owner first: a user's ACL may deny Administrators everything but what an owner always has.
        + take_ownership
        + _icacls(root, "/inheritance:r", "/grant:r", *grants, "/T", "/C", "/L", "/Q")
        + f"foreach ($name in @({subfolders})) {{ New-Item -ItemType Directory -Force -Path (Join-Path $root $name) | Out-Null }}\n"
        # Again, for the subfolders just made: their creator may own them (a local security policy).
        + take_ownership
        + "$links = @(Get-Tree | Where-Object { Test-Link $_ } | ForEach-Object { $_.FullName })\n"
        "if ($links.Count -gt 0) {\n"
        "    throw ('links (reparse points) inside {0}: {1}. A link can lead out of the secured folder; remove "
        "each link itself, then try again' -f $root, ($links -join ', '))\n"
        "}\n"
        # A user's explicit entries survive /inheritance:r; each other SID goes, everywhere below.
        "$others = @(Get-Tree | ForEach-Object { (Get-Acl -LiteralPath $_.FullName).GetAccessRules($true, $false, "
        "[Security.Principal.SecurityIdentifier]) } | ForEach-Object { $_.IdentityReference.Value } | "
        "Where-Object { $allowed -notcontains $_ } | Sort-Object -Unique)\n"
        "foreach ($sid in $others) { Invoke-Icacls @($root, '/remove', ('*' + $sid), '/T', '/C', '/L', '/Q') }\n"
        "Assert-InstallDir\n"
    )


@operation()
def secure_install_dir():
    """Secure INSTALL_DIR (the module's docstring) unless `WindowsInstallDir` finds it so already."""
    state = read_once(WindowsInstallDir)
    problems = install_dir_problems(state)
    if not problems:
        host.noop(f"{INSTALL_DIR} is owned by Administrators, SYSTEM and Administrators only")
        return
    if state is not None:  # an existing folder that is not as rigkit leaves it: say what was found
        for problem in problems:
            logger.warning(f"{host.print_prefix}{problem}; securing {INSTALL_DIR}")
    yield secure_install_script()
