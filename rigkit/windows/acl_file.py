"""A secret on a Windows rig (the API key's env file): `private_file`, the Windows counterpart of
rigkit/plumbing/private_file.py, and the fact it compares with.

The file lives in a folder whose ACL grants only SYSTEM and Administrators, without inherited
entries (C:\\ProgramData grants Users read, and a new folder inherits that), owned by Administrators
(an owner may always rewrite the ACL; rigkit.windows.install_dir secures the whole install folder
first). Owner and ACL are set with icacls by SID (`*S-1-5-18`, `*S-1-5-32-544`), which works in any
display language, and read back through .NET before anything is written. The content then travels over SFTP to a temporary name
inside that folder (so it is never readable by anyone else, not even for a moment), gets the same
ACL explicitly, and is moved over the destination (rigkit.windows.upload, the one way files are put). It is never put in a script or on a command line,
and compared by SHA-256 only (`WindowsPrivateFile` reads the digest, the owner and the ACL, never the
content).
"""

from __future__ import annotations

import hashlib
from pathlib import PureWindowsPath

from pyinfra import host
from pyinfra.api import FactBase, operation

from rigkit.plumbing.render import ps_quote
from rigkit.windows.facts import ABSENT
from rigkit.windows.upload import place_script as upload_place_script
from rigkit.windows.upload import temporary_name, upload

SYSTEM_SID = "S-1-5-18"
ADMINISTRATORS_SID = "S-1-5-32-544"
ALLOWED_SIDS = (SYSTEM_SID, ADMINISTRATORS_SID)

# icacls as a native program: under the connector's 'Stop', stderr must not be redirected into
# errors (Windows PowerShell 5.1); 'Continue' is local to the function, the exit code decides.
# Called with ONE array (`Invoke-Icacls @('a', 'b')`): a simple function binds only the first of
# several positional arguments to $Arguments, the rest land unseen in $args.
ICACLS_FUNCTION = (
    "function Invoke-Icacls([string[]] $Arguments) {\n"
    "    $ErrorActionPreference = 'Continue'\n"
    "    $out = & icacls.exe @Arguments 2>&1 | ForEach-Object { [string] $_ }\n"
    "    if ($LASTEXITCODE -ne 0) { throw ('icacls {0} failed (exit {1}): {2}' -f ($Arguments -join ' '), "
    "$LASTEXITCODE, ($out -join ' ')) }\n"
    "}\n"
)
# icacls /grant:r replaces the entries of the SIDs it names only: anyone else's explicit entry (an
# `icacls /grant Users:R` behind rigkit's back) is removed by SID.
_REMOVE_OTHERS = (
    "function Remove-Others([string] $Path) {\n"
    f"    $allowed = @({', '.join(ps_quote(s) for s in ALLOWED_SIDS)})\n"
    "    $others = @((Get-Acl -LiteralPath $Path).GetAccessRules($true, $false, [Security.Principal.SecurityIdentifier]) | "
    "ForEach-Object { $_.IdentityReference.Value } | Where-Object { $allowed -notcontains $_ } | Sort-Object -Unique)\n"
    "    foreach ($sid in $others) { Invoke-Icacls @($Path, '/remove', ('*' + $sid)) }\n"
    "}\n"
)
# Reads the ACL back: owned by SYSTEM or Administrators (an owner may always rewrite the ACL),
# protected (no inherited entries) and only the allowed SIDs, else it throws.
_ASSERT_PRIVATE = (
    "function Assert-Private([string] $Path) {\n"
    f"    $allowed = @({', '.join(ps_quote(s) for s in ALLOWED_SIDS)})\n"
    "    $acl = Get-Acl -LiteralPath $Path\n"
    "    $owner = $acl.GetOwner([Security.Principal.SecurityIdentifier]).Value\n"
    "    $sids = @($acl.GetAccessRules($true, $true, [Security.Principal.SecurityIdentifier]) | "
    "ForEach-Object { $_.IdentityReference.Value })\n"
    "    $others = @($sids | Where-Object { $allowed -notcontains $_ })\n"
    "    if ($allowed -notcontains $owner) {\n"
    "        throw ('{0}: owned by {1}, who may change its ACL at will; only SYSTEM or Administrators may own it' -f "
    "$Path, $owner)\n"
    "    }\n"
    "    if (-not $acl.AreAccessRulesProtected -or $others.Count -gt 0) {\n"
    "        throw ('{0}: its ACL still grants {1} (inherited: {2}); only SYSTEM and Administrators may read it' -f "
    "$Path, ($others -join ', '), (-not $acl.AreAccessRulesProtected))\n"
    "    }\n"
    "}\n"
)
_FUNCTIONS = ICACLS_FUNCTION + _REMOVE_OTHERS + _ASSERT_PRIVATE


def icacls_arguments(path: str, folder: bool) -> list[str]:
    """What icacls gets: inherited entries removed, full control for SYSTEM and Administrators only
    (inherited by what the folder holds). SIDs, not names: names are translated per language."""
    inherit = "(OI)(CI)" if folder else ""
    return [path, "/inheritance:r", "/grant:r", *(f"*{sid}:{inherit}F" for sid in ALLOWED_SIDS)]


def owner_arguments(path: str) -> list[str]:
    """Administrators take ownership (before the ACL is rewritten: an owner may always rewrite it)."""
    return [path, "/setowner", f"*{ADMINISTRATORS_SID}"]


def _icacls_lines(path: str, folder: bool) -> str:
    """Owner, then the two grants, then nobody else."""
    return "".join("Invoke-Icacls @(" + ", ".join(ps_quote(a) for a in arguments) + ")\n"
                   for arguments in (owner_arguments(path), icacls_arguments(path, folder))
                   ) + f"Remove-Others {ps_quote(path)}\n"


def secure_folder_script(folder: str) -> str:
    """The folder made (if needed) and given its ACL, read back; run before any content is sent."""
    return (
        f"# rigkit: secure-folder {ps_quote(folder)}\n"
        + _FUNCTIONS
        + f"New-Item -ItemType Directory -Force -Path {ps_quote(folder)} | Out-Null\n"
        + _icacls_lines(folder, folder=True)
        + f"Assert-Private {ps_quote(folder)}\n"
    )


def place_script(temporary: str, dest: str) -> str:
    """The uploaded temporary file: its own ACL, moved over `dest` (rigkit.windows.upload's one move),
    and `dest`'s ACL set and read back."""
    return upload_place_script("place-private-file", temporary, dest,
                               before=_FUNCTIONS + _icacls_lines(temporary, folder=False),
                               after=_icacls_lines(dest, folder=False) + f"Assert-Private {ps_quote(dest)}\n")


def protect_script(dest: str) -> str:
    """Only the ACL of a file whose content is already right."""
    return (
        f"# rigkit: protect-file {ps_quote(dest)}\n"
        + _FUNCTIONS
        + _icacls_lines(dest, folder=False)
        + f"Assert-Private {ps_quote(dest)}\n"
    )


class WindowsPrivateFile(FactBase):
    """{"sha256": lower-case hex, "private": bool, "owner": SID} of a file on the rig, or None where
    there is none. private: owned by SYSTEM or Administrators, and its ACL has no inherited entries
    and grants only those two."""

    def command(self, path: str) -> str:
        name = ps_quote(path)
        return (
            f"# rigkit: private-file-state {name}\n"
            f"if (-not (Test-Path -LiteralPath {name} -PathType Leaf)) {{ {ps_quote(ABSENT)}; exit 0 }}\n"
            f"'sha256={{0}}' -f (Get-FileHash -Algorithm SHA256 -LiteralPath {name}).Hash\n"
            f"$acl = Get-Acl -LiteralPath {name}\n"
            "'owner={0}' -f $acl.GetOwner([Security.Principal.SecurityIdentifier]).Value\n"
            "'protected={0}' -f $acl.AreAccessRulesProtected\n"
            "'sids={0}' -f ((@($acl.GetAccessRules($true, $true, [Security.Principal.SecurityIdentifier]) | "
            "ForEach-Object { $_.IdentityReference.Value }) | Sort-Object -Unique) -join ',')"
        )

    def process(self, output) -> dict | None:
        lines = [line.strip() for line in output if line.strip()]
        if lines == [ABSENT]:
            return None
        values = dict(line.split("=", 1) for line in lines if "=" in line)
        sids = {s for s in values.get("sids", "").split(",") if s}
        owner = values.get("owner", "")
        return {
            "sha256": values.get("sha256", "").lower(),
            "owner": owner,
            "private": owner in ALLOWED_SIDS and values.get("protected", "").lower() == "true"
            and sids == set(ALLOWED_SIDS),
        }


@operation()
def private_file(dest: str, data: bytes):
    """Put `data` at `dest`, readable by SYSTEM and Administrators only, unless it is already
    there with that ACL (compared by SHA-256); never shows or sends the data in a script."""
    state = host.get_fact(WindowsPrivateFile, path=dest)
    same = state is not None and state["sha256"] == hashlib.sha256(data).hexdigest()
    if same and state["private"]:
        host.noop(f"{dest} is up to date, SYSTEM and Administrators only (compared by SHA-256)")
        return
    if same:
        yield protect_script(dest)
        return
    yield secure_folder_script(str(PureWindowsPath(dest).parent))
    yield from upload(data, dest, place_script(temporary_name(dest), dest))
