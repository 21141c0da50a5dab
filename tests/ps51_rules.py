"""Windows PowerShell 5.1 pitfalls, found on the parsed syntax tree of a script.

Task Scheduler and Windows' OpenSSH run `powershell.exe`, which is Windows PowerShell 5.1,
not PowerShell 7; no PowerShell runs here, so every script rigkit renders or sends is
parsed with a real PowerShell grammar (tree-sitter-powershell) and checked by the rules
below (`RULES`: each rule's name and the reason for it). tests/test_ps51_rules.py plants
each pitfall to show its rule catches it, and runs every rule on every script rigkit makes.

Kept under tests/, not in rigkit/: tree-sitter is a test dependency, and the scripts vary
only by values that reach them as quoted literals or validated integers, which cannot
change the syntax tree; so checking the templates and generators here, with hostile
values, covers what a check at `rigkit check` or bundle time would, without a compiled
grammar on every control machine.

The rules are deliberately strict and approximate where PowerShell is dynamic: a command
that is not a Verb-Noun cmdlet, a function defined in the script or a known alias is taken
to be a native program; `$ErrorActionPreference` is followed in source order, and an
assignment inside a branch or loop that may not run counts as "may be Stop".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tree_sitter_powershell
from tree_sitter import Language, Node, Parser

PARSER = Parser(Language(tree_sitter_powershell.language()))

RULES = {
    "native-stderr-under-stop": (
        "In Windows PowerShell 5.1 a native program's stderr redirected with 2>&1, 2> or *> becomes "
        "error records; with $ErrorActionPreference = 'Stop' the first stderr line ends the script "
        "(fixed only in PowerShell 7.2). docker compose writes progress to stderr, docker info writes "
        "there while Docker Desktop starts. Set 'Continue' around the call and read $LASTEXITCODE."
    ),
    "file-encoding": (
        "5.1 writes UTF-16LE with > , >> and Out-File, the ANSI code page with Set-Content/Add-Content, "
        "and reads a file without a BOM as ANSI; every file rigkit writes is read back (the log by the "
        "deploy, the applied digest by a fact). Name -Encoding on every read and write; redirect to a "
        "file never (only to $null)."
    ),
    "literal-path": (
        "-Path (and a positional path) is a wildcard pattern: a path with [ ] (a rig or model name, a "
        "user's folder) matches nothing or the wrong file. Use -LiteralPath, or pipe items in."
    ),
    "not-in-5.1": (
        "Syntax, commands, parameters and values that Windows PowerShell 5.1 does not have: &&/||, "
        "?:, ??, ??=, ?., clean {} (these do not parse, or parse as pipeline chains), "
        "ForEach-Object -Parallel, -AsByteStream, ConvertFrom-Json -AsHashtable, Join-Path with more "
        "than two children, $PSStyle/$IsWindows, -Encoding utf8NoBOM. 5.1 stops at parse time, so the "
        "whole script does not run."
    ),
    "write-error-under-stop": (
        "Write-Error while $ErrorActionPreference may be 'Stop' is a terminating error: the script ends "
        "there, and the `exit N` after it never runs, so the exit code is not the documented one (and a "
        "`catch` around it swallows the message). Write the message with [Console]::Error.WriteLine(...) "
        "(or Write-Error -ErrorAction Continue), then exit."
    ),
    "non-atomic-replace": (
        "Move-Item -Force over an existing file in 5.1 deletes the destination, then moves: in between "
        "there is no file (a state read finds none, a task starting its script fails); Copy-Item "
        "-Recurse -Force over installed files rewrites each in place, so the SYSTEM watchdog, started "
        "every minute, can run half a script. Write beside it and Move-IntoPlace ([IO.File]::Replace)."
    ),
    "replace-null-backup": (
        "[IO.File]::Replace(source, destination, $null): 5.1 passes $null to a .NET string parameter as "
        "'', and Replace refuses an empty backup name (ArgumentException), so the replace never happens. "
        "Pass [NullString]::Value."
    ),
    "lock-catch-all": (
        "A catch around opening a lock file without sharing ([IO.FileShare]::None) that takes every error "
        "for 'another process holds it': an ACL, a path that is no file or a full disk then reads as a "
        "rollout forever and the caller holds off without end. Tell a sharing or lock violation "
        "(HResult 32/33, Test-HeldByAnother) from the rest, and bound the wait."
    ),
    "unbounded-wait": (
        "A loop that sleeps (Start-Sleep) with no deadline in it: no Get-Date/Get-Now, deadline or "
        "stopwatch in its condition or body. A task waits until Task Scheduler kills it at its limit, "
        "silently, without the log line that says what it waited for."
    ),
    "positional-binding": (
        "A function defined in the script, called with more positional arguments than it declares "
        "parameters: a simple function binds them in order and the rest land unseen in $args, so "
        "`Invoke-Icacls 'C:\\x' '/grant:r' ...` runs icacls with the path alone, which only prints the "
        "ACL and exits 0. Pass one array: `Invoke-Icacls @('C:\\x', '/grant:r', ...)`."
    ),
}


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule}: {self.message}"


def findings(source: str) -> list[Finding]:
    """Every rule's findings in one script, in line order."""
    root = PARSER.parse(source.encode("utf-8")).root_node
    script = _Script(root)
    found = (_not_in_51(script) + _stderr_under_stop(script) + _encoding(script) + _literal_path(script)
             + _positional_binding(script) + _write_error_under_stop(script) + _non_atomic_replace(script)
             + _replace_null_backup(script) + _lock_catch_all(script) + _unbounded_wait(script))
    return sorted(set(found), key=lambda f: (f.line, f.rule, f.message))


# ----- the tree ----------------------------------------------------------------

_ALIASES = {"%", "?", "foreach", "where", "select", "sort", "measure", "echo", "write", "cd", "ls", "dir",
            "cat", "gc", "sc", "ac", "rm", "del", "cp", "copy", "mv", "move", "iex", "irm", "iwr", "sleep"}
# PowerShell's approved verbs (Get-Verb): a Verb-Noun name with one of these is a cmdlet or
# function; `nvidia-smi` has the same shape but no such verb.
_VERBS = set("""
add approve assert backup block build checkpoint clear close compare complete compress confirm connect
convert convertfrom convertto copy debug deny deploy disable disconnect dismount edit enable enter exit
expand export find format get grant group hide import initialize install invoke join limit lock measure
merge mount move new open optimize out ping pop protect publish push read receive redo register remove
rename repair request reset resize resolve restart restore resume revoke save search select send set
show skip split start step stop submit suspend switch sync test trace unblock undo uninstall unlock
unprotect unpublish unregister update use wait watch write
""".split())
_SWITCHES = {"-force", "-recurse", "-raw", "-nonewline", "-append", "-wait", "-passthru", "-whatif", "-confirm",
             "-compress", "-noprofile", "-parent", "-leaf", "-resolve", "-isvalid", "-asplaintext", "-usebasicparsing"}
_BLOCKS = {"statement_block", "script_block", "program"}
_LOOPS = {"foreach_statement", "while_statement", "do_statement", "for_statement"}


def _text(node: Node) -> str:
    return node.text.decode("utf-8")


def _line(node: Node) -> int:
    return node.start_point[0] + 1


def _walk(node: Node):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _contains(outer: Node, inner: Node) -> bool:
    return outer.start_byte <= inner.start_byte and inner.end_byte <= outer.end_byte


def _ancestor(node: Node, types: set[str]) -> Node | None:
    node = node.parent
    while node is not None and node.type not in types:
        node = node.parent
    return node


@dataclass
class _Command:
    node: Node
    name: str  # lower case, unquoted; "" for `& $variable`
    invoked_by_expression: bool
    parameters: dict[str, Node | None]  # lower-case name -> value node (None for a switch)
    positional: list[Node]
    redirections: list[tuple[str, str]]  # (operator, target text)


class _Script:
    def __init__(self, root: Node):
        self.root = root
        self.nodes = list(_walk(root))
        self.functions = {
            _text(n.child_by_field_name("name") or next(c for c in n.children if c.type == "function_name")).lower()
            for n in self.nodes if n.type == "function_statement"
        }
        self.commands = [self._command(n) for n in self.nodes if n.type == "command"]

    def _command(self, node: Node) -> _Command:
        name_node = next((c for c in node.children if c.type in ("command_name", "command_name_expr")), None)
        by_expression = name_node is not None and name_node.type == "command_name_expr" and (
            "$" in _text(name_node) or "(" in _text(name_node))
        name = "" if by_expression or name_node is None else _unquote(_text(name_node)).lower()
        parameters, positional, redirections = {}, [], []
        elements = next((c for c in node.children if c.type == "command_elements"), None)
        pending = None
        for child in elements.children if elements else ():
            if child.type == "command_argument_sep":
                continue
            if child.type == "redirection":
                operator = _text(child.children[0]).strip()
                target = _text(child.children[1]).strip() if len(child.children) > 1 else ""
                redirections.append((operator, target))
            elif child.type == "command_parameter":
                parameter = _text(child).split(":", 1)[0].lower()
                inline = next((c for c in child.children if c.type not in (":", "command_parameter")), None)
                parameters[parameter] = inline if ":" in _text(child) else None
                pending = None if (":" in _text(child) or parameter in _SWITCHES) else parameter
            elif pending is not None:
                parameters[pending] = child
                pending = None
            else:
                positional.append(child)
        return _Command(node, name, by_expression, parameters, positional, redirections)

    def is_native(self, command: _Command) -> bool:
        if command.invoked_by_expression:
            return True  # `& $path`: could be any program
        name = command.name
        if name.endswith((".exe", ".cmd", ".bat", ".com")):
            return True
        verb, dash, noun = name.partition("-")
        cmdlet = bool(dash) and verb in _VERBS and re.fullmatch(r"[a-z0-9]+", noun) is not None
        return not (cmdlet or name in self.functions or name in _ALIASES)


# ----- rules -------------------------------------------------------------------


def _stderr_under_stop(script: _Script) -> list[Finding]:
    assignments = _preference_assignments(script)
    found = []
    for command in script.commands:
        stderr = [op for op, _ in command.redirections if op.startswith(("2", "*"))]
        if not stderr or not script.is_native(command):
            continue
        if _may_be_stop(script, assignments, command.node):
            found.append(Finding("native-stderr-under-stop", _line(command.node),
                                 f"{_text(command.node).strip()[:70]!r}: {stderr[0]} on a native program "
                                 "while $ErrorActionPreference may be 'Stop'"))
    return found


def _write_error_under_stop(script: _Script) -> list[Finding]:
    assignments = _preference_assignments(script)
    found = []
    for command in script.commands:
        if command.name != "write-error":
            continue
        action = command.parameters.get("-erroraction") or command.parameters.get("-ea")
        if action is not None and _unquote(_text(action)).lower() in ("continue", "silentlycontinue", "ignore"):
            continue
        if _may_be_stop(script, assignments, command.node):
            found.append(Finding("write-error-under-stop", _line(command.node),
                                 f"{_text(command.node).strip()[:70]!r}: Write-Error while $ErrorActionPreference "
                                 "may be 'Stop' ends the script before its exit code"))
    return found


def _preference_assignments(script: _Script) -> list[tuple[Node, bool]]:
    """(assignment node, sets Stop?) for every assignment to $ErrorActionPreference, any scope.
    A value that is not a literal counts as Stop."""
    result = []
    for node in script.nodes:
        if node.type != "assignment_expression":
            continue
        left = _text(node.children[0]).strip().lower()
        if re.fullmatch(r"\$(global:|script:|local:)?erroractionpreference", left):
            value = _unquote(_text(node.children[-1])).lower()
            result.append((node, value not in ("continue", "silentlycontinue", "ignore")))
    return result


def _scope(node: Node) -> tuple[int, int] | None:
    """The function a node is in (its byte range), or None at script level."""
    function = _ancestor(node, {"function_statement"})
    return None if function is None else (function.start_byte, function.end_byte)


def _may_be_stop(script: _Script, assignments: list[tuple[Node, bool]], at: Node) -> bool:
    scope = _scope(at)
    # Script level starts at PowerShell's default, Continue; a function inherits its caller's
    # preference, so it may start at Stop if anything outside it sets Stop.
    stop = scope is not None and any(s for a, s in assignments if _scope(a) != scope)
    loop = _ancestor(at, _LOOPS)
    for node, sets_stop in assignments:
        if _scope(node) != scope:
            continue  # another function's own (local) preference
        before = node.end_byte <= at.start_byte
        in_same_loop = loop is not None and _contains(loop, node)
        if not (before or in_same_loop):
            continue
        block = _ancestor(node, _BLOCKS)
        # Definite: earlier, in a block that encloses the command, and not inside a loop the command is not in.
        definite = before and block is not None and _contains(block, at)
        if definite:
            stop = sets_stop
        elif sets_stop:
            stop = True  # a branch, or a later pass of a loop, may have set Stop
    return stop


_READERS_WRITERS = {"out-file", "set-content", "add-content", "get-content"}


def _encoding(script: _Script) -> list[Finding]:
    found = []
    for command in script.commands:
        if command.name in _READERS_WRITERS and "-encoding" not in command.parameters:
            found.append(Finding("file-encoding", _line(command.node),
                                 f"{_text(command.node).strip()[:70]!r}: no -Encoding"))
        if command.name == "tee-object" and ("-filepath" in command.parameters or "-literalpath" in command.parameters):
            found.append(Finding("file-encoding", _line(command.node), "Tee-Object to a file: 5.1 writes UTF-16, no -Encoding"))
        for operator, target in command.redirections:
            if operator.endswith(">") or operator.endswith(">>"):
                if target.lower() != "$null":
                    found.append(Finding("file-encoding", _line(command.node),
                                         f"{operator} {target}: a redirect to a file writes UTF-16 in 5.1"))
    return found


# Cmdlets whose -Path (or positional path; Out-File: -FilePath) is a wildcard pattern.
_WILDCARD_PATH = {
    "get-content": "-path", "set-content": "-path", "add-content": "-path", "clear-content": "-path",
    "test-path": "-path", "remove-item": "-path", "copy-item": "-path", "move-item": "-path",
    "rename-item": "-path", "get-item": "-path", "get-childitem": "-path", "get-filehash": "-path",
    "resolve-path": "-path", "get-itemproperty": "-path", "invoke-item": "-path", "out-file": "-filepath",
    "import-csv": "-path", "export-csv": "-path",
}
_WILDCARD_CHARS = re.compile(r"[*?\[\]]")


def _safe_literal(node: Node) -> bool:
    """A literal path with nothing a wildcard pattern or an expansion could change."""
    text = _text(node).strip()
    if text.startswith("'") or (text.startswith('"') and "$" not in text and "`" not in text) or re.fullmatch(
            r"[A-Za-z0-9_.:\\/-]+", text):
        return not _WILDCARD_CHARS.search(_unquote(text))
    return False


def _literal_path(script: _Script) -> list[Finding]:
    found = []
    for command in script.commands:
        parameter = _WILDCARD_PATH.get(command.name)
        if parameter is None or "-literalpath" in command.parameters:
            continue
        value = command.parameters.get(parameter, command.positional[0] if command.positional else None)
        if parameter in command.parameters or command.positional:
            if value is None or not _safe_literal(value):
                shown = _text(value).strip() if value is not None else ""
                found.append(Finding("literal-path", _line(command.node),
                                     f"{command.name} {parameter} {shown[:50]}: a wildcard pattern; use -LiteralPath"))
    return found


def _declared_parameters(script: _Script) -> dict[str, int]:
    """{function name: how many parameters it declares}, for functions that declare any and never
    read $args (a function that does takes extra arguments on purpose)."""
    counts = {}
    for node in script.nodes:
        if node.type != "function_statement":
            continue
        name_node = next(c for c in node.children if c.type == "function_name")
        own = [p for p in _walk(node) if p.type == "script_parameter"
               and _ancestor(p, {"function_statement", "script_block_expression"}) == node]
        reads_args = any(v.type == "variable" and _text(v).lower() == "$args" for v in _walk(node))
        if own and not reads_args:
            counts[_text(name_node).lower()] = len(own)
    return counts


def _positional_binding(script: _Script) -> list[Finding]:
    declared = _declared_parameters(script)
    return [
        Finding("positional-binding", _line(command.node),
                f"{command.name} gets {len(command.positional)} positional arguments but declares "
                f"{declared[command.name]} parameter(s): the rest go to $args; pass one array")
        for command in script.commands
        if command.name in declared and len(command.positional) > declared[command.name]
    ]


_ENCODINGS_51 = {"unknown", "string", "unicode", "byte", "bigendianunicode", "utf8", "utf7", "utf32", "ascii",
                 "default", "oem", "bigendianutf32"}
_VARIABLES_7 = {"$psstyle", "$iswindows", "$islinux", "$ismacos", "$iscoreclr", "$psnativecommanduseerroractionpreference"}
_COMMANDS_7 = {"test-json", "get-error", "join-string", "convertfrom-markdown", "get-uptime", "remove-alias"}
_PARAMETERS_7 = {
    ("foreach-object", "-parallel"), ("%", "-parallel"), ("foreach", "-parallel"),
    ("convertfrom-json", "-ashashtable"), ("convertfrom-json", "-depth"), ("join-path", "-additionalchildpath"),
    ("invoke-restmethod", "-skipcertificatecheck"), ("invoke-webrequest", "-skipcertificatecheck"),
    ("invoke-restmethod", "-skiphttperrorcheck"), ("invoke-webrequest", "-skiphttperrorcheck"),
    ("invoke-restmethod", "-statuscodevariable"), ("invoke-restmethod", "-maximumretrycount"),
    ("invoke-webrequest", "-maximumretrycount"), ("test-connection", "-tcpport"),
}


def _not_in_51(script: _Script) -> list[Finding]:
    found = []
    for node in script.nodes:
        if node.type == "ERROR" or node.is_missing:
            found.append(Finding("not-in-5.1", _line(node),
                                 f"does not parse: {_text(node).strip()[:50]!r} (?:, ??, ?., clean {{}} or a syntax error)"))
        elif node.type == "pipeline_chain_tail":
            found.append(Finding("not-in-5.1", _line(node), f"pipeline chain {_text(node)} (PowerShell 7 only)"))
        elif node.type == "variable" and _text(node).lower() in _VARIABLES_7:
            found.append(Finding("not-in-5.1", _line(node), f"{_text(node)} is PowerShell 7 only"))
    for command in script.commands:
        if command.name in _COMMANDS_7:
            found.append(Finding("not-in-5.1", _line(command.node), f"{command.name} is PowerShell 7 only"))
        for parameter, value in command.parameters.items():
            if parameter == "-asbytestream" or (command.name, parameter) in _PARAMETERS_7:
                found.append(Finding("not-in-5.1", _line(command.node),
                                     f"{command.name} {parameter} is PowerShell 7 only"))
            if parameter == "-encoding" and value is not None and _unquote(_text(value)).lower() not in _ENCODINGS_51:
                found.append(Finding("not-in-5.1", _line(command.node),
                                     f"-Encoding {_text(value).strip()}: not a 5.1 encoding (UTF8 writes a BOM there)"))
        if command.name == "join-path" and len(command.positional) > 2:
            found.append(Finding("not-in-5.1", _line(command.node), "Join-Path with more than two positional paths"))
    return found


def _non_atomic_replace(script: _Script) -> list[Finding]:
    found = []
    for command in script.commands:
        if command.name in ("move-item", "move", "mv") and "-force" in command.parameters:
            found.append(Finding("non-atomic-replace", _line(command.node),
                                 f"{_text(command.node).strip()[:70]!r}: 5.1 deletes the destination first; "
                                 "use Move-IntoPlace"))
        if command.name in ("copy-item", "copy", "cp") and "-force" in command.parameters and "-recurse" in command.parameters:
            found.append(Finding("non-atomic-replace", _line(command.node),
                                 f"{_text(command.node).strip()[:70]!r}: rewrites installed files in place"))
    return found


def _invocations(script: _Script, member: str) -> list[tuple[Node, list[Node]]]:
    """(node, argument nodes) of every `[IO.File]::<member>(...)` (System.IO.File too)."""
    result = []
    for node in script.nodes:
        if node.type != "invokation_expression":
            continue
        kind = next((c for c in node.children if c.type == "type_literal"), None)
        name = next((c for c in node.children if c.type == "member_name"), None)
        if kind is None or name is None or _text(name).lower() != member:
            continue
        if re.sub(r"\s", "", _text(kind)).lower() not in ("[io.file]", "[system.io.file]"):
            continue
        arguments = [a for n in _walk(node) if n.type == "argument_expression_list" for a in n.children
                     if a.type == "argument_expression"]
        result.append((node, arguments))
    return result


def _replace_null_backup(script: _Script) -> list[Finding]:
    return [Finding("replace-null-backup", _line(node), f"{_text(node).strip()[:70]!r}: $null arrives as ''")
            for node, arguments in _invocations(script, "replace")
            if len(arguments) >= 3 and _text(arguments[2]).strip().lower() == "$null"]


def _lock_catch_all(script: _Script) -> list[Finding]:
    # Functions that tell a holder from other errors (they read the exception's HResult).
    tellers = {name for name in script.functions for n in script.nodes if n.type == "function_statement"
               and _text(next(c for c in n.children if c.type == "function_name")).lower() == name
               and "hresult" in _text(n).lower()}
    found = []
    for node in script.nodes:
        if node.type != "try_statement":
            continue
        body = next((c for c in node.children if c.type == "statement_block"), None)
        if body is None or "[io.fileshare]::none" not in re.sub(r"\s", "", _text(body)).lower():
            continue
        for catch in (c for c in _walk(node) if c.type == "catch_clause" and _ancestor(c, {"try_statement"}) == node):
            text = _text(catch).lower()
            if "hresult" in text or any(re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text) for t in tellers):
                continue
            found.append(Finding("lock-catch-all", _line(catch),
                                 "every error opening the lock taken as 'held': tell a sharing violation from the rest"))
    return found


def _unbounded_wait(script: _Script) -> list[Finding]:
    found = []
    for node in script.nodes:
        if node.type not in _LOOPS:
            continue
        sleeps = [c for c in script.commands if c.name in ("start-sleep", "sleep") and _contains(node, c.node)
                  and _ancestor(c.node, _LOOPS) == node]
        text = _text(node).lower()
        if sleeps and not any(word in text for word in ("get-date", "get-now", "deadline", "stopwatch")):
            found.append(Finding("unbounded-wait", _line(node),
                                 f"{_text(node).strip()[:60]!r}: sleeps in a loop with no deadline"))
    return found
