"""The library's shape, checked on its parsed imports (ast; nothing is imported or run).

- no import cycle between rigkit's modules;
- no role imports another role (shared code lives in rigkit/);
- the command line stays thin: rigkit/cli.py parses and dispatches, under CLI_MAX_LINES lines;
- Windows-only code stays in rigkit/windows/ and roles/windows.py: nothing else imports
  rigkit.windows, except the command-line front door (`rigkit windows-bundle` is one of its
  commands, as deploy.py picks the Windows role);
- pyinfra's host.data is read in one module only (rigkit/config/inventory.py);
- every role module defines exactly one @deploy function;
- rig paths and names live in rigkit/rigside/names.py, rigkit-stack's files and command lines in
  rigkit/rigside/stack.py: no other code spells them.
Simulates nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

WINDOWS_FILES = {"roles/windows.py"}
FRONT_DOORS = {"rigkit/cli.py"}
HOST_DATA_READER = "rigkit/config/inventory.py"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    files = [*(REPO / "rigkit").rglob("*.py"), *(REPO / "roles").glob("*.py"), REPO / "deploy.py", REPO / "verify.py"]
    return {module_name(p): p for p in files if "_templates" not in p.parts}


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Edges between our own modules only (`from rigkit.gpu import policy` -> rigkit.gpu.policy)."""
    return {name: {i for i in imports(path) if i in modules and i != name} for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycles():
    assert find_cycle(graph(sources())) is None, " -> ".join(find_cycle(graph(sources())))


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]


def package_of(module: str) -> str:
    """rigkit.gpu.facts -> rigkit.gpu; a module right under rigkit/ (rigkit.cli) is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rigkit" and len(parts) > 1 else parts[0]


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between rigkit's packages, from the edges between their modules."""
    packages: dict[str, set[str]] = {}
    for module, targets in edges.items():
        if module.startswith("rigkit."):
            packages.setdefault(package_of(module), set()).update(
                package_of(t) for t in targets if t.startswith("rigkit.") and package_of(t) != package_of(module))
    return packages


def test_no_import_cycles_between_packages():
    """A package may use another only if that one does not use it back, at any distance
    (config <- gateway once ran both ways: config.inventory built the gateway's plan)."""
    cycle = find_cycle(package_graph(graph(sources())))
    assert cycle is None, "packages import each other in a circle: " + " -> ".join(cycle or [])


def test_the_package_cycle_check_sees_a_planted_cycle():
    """Module edges with no cycle between modules, but one between their packages."""
    edges = {"rigkit.config.inventory": {"rigkit.gateway.plan"}, "rigkit.gateway.plan": {"rigkit.config.schema"},
             "rigkit.config.schema": set(), "rigkit.plumbing.render": {"rigkit.config.schema"}}
    assert find_cycle(edges) is None
    assert find_cycle(package_graph(edges)) == ["rigkit.config", "rigkit.gateway", "rigkit.config"]


FEATURES = {"rigkit.preflight", "rigkit.base", "rigkit.gpu", "rigkit.weights", "rigkit.serving", "rigkit.verify",
            "rigkit.gateway", "rigkit.windows", "rigkit.status", "rigkit.tune", "rigkit.topology", "rigkit.monitoring",
            "rigkit.surface", "rigkit.fit", "rigkit.ondemand"}
BENEATH_FEATURES = {"rigkit.config", "rigkit.rigside", "rigkit.plumbing", "rigkit.sizing"}


def against_the_flow(packages: dict[str, set[str]]) -> list[str]:
    return [f"{low} -> {sorted(packages[low] & FEATURES)}" for low in sorted(BENEATH_FEATURES & set(packages))
            if packages[low] & FEATURES]


def test_config_plumbing_and_the_rig_side_use_no_feature():
    """Data flows one way (docs/architecture.md): the layers beneath the features never reach up."""
    assert sorted(set(package_graph(graph(sources())))) and against_the_flow(package_graph(graph(sources()))) == []
    planted = {"rigkit.config.inventory": {"rigkit.gateway.plan"}, "rigkit.gateway.plan": set()}
    assert against_the_flow(package_graph(planted)) == ["rigkit.config -> ['rigkit.gateway']"]


def test_every_package_is_placed_in_the_flow():
    placed = FEATURES | BENEATH_FEATURES | {"rigkit.cli", "rigkit"}
    assert set(package_graph(graph(sources()))) <= placed, "add the new package to FEATURES or BENEATH_FEATURES"


def test_only_the_command_line_sits_at_the_top_of_rigkit():
    """Plumbing has its own package (rigkit/plumbing), apart from the features; the top of rigkit/ holds only
    the front door."""
    loose = sorted(p.name for p in (REPO / "rigkit").glob("*.py"))
    assert loose == ["__init__.py", "cli.py"], f"move these into their feature's package or rigkit/plumbing: {loose}"


# The command line only parses and dispatches (STYLE.md); what a command does lives in its feature's
# package. cli.py once grew from 439 to ~700 lines of rollout, status and bundle work (issue #53).
CLI_MAX_LINES = 300


def line_count(text: str) -> int:
    """Every line, as `wc -l` counts them (a last line without its newline counts too): docstrings,
    comments and blank lines included."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def test_the_command_line_only_parses_and_dispatches():
    lines = line_count((REPO / "rigkit" / "cli.py").read_text())
    assert lines < CLI_MAX_LINES, (f"rigkit/cli.py has {lines} lines; keep it under {CLI_MAX_LINES}: move what a "
                                   "command does into its feature's package, keep the parser and the dispatch here")
    assert not line_count("x = 1\n" * CLI_MAX_LINES) < CLI_MAX_LINES  # a planted file at the limit fails
    assert line_count('"""a\n\nb"""\n\n# c\nd') == 6  # docstring, blank lines, comment, unended last line


def test_the_rig_side_runtime_imports_nothing_of_rigkit():
    """rigkit.rigside runs on rigs as it is (standard library only); every package may import it."""
    for name, path in sources().items():
        if name.startswith("rigkit.rigside"):
            ours = {i for i in imports(path) if i.split(".")[0] in ("rigkit", "roles", "pyinfra")}
            assert not ours, f"{path.relative_to(REPO)} imports {sorted(ours)}: the rig side has only the standard library"


def test_no_role_imports_another_role():
    for name, path in sources().items():
        if name.startswith("roles."):
            others = {i for i in imports(path) if i == "roles" or i.startswith("roles.")}
            assert not others, f"{path.relative_to(REPO)} imports {sorted(others)}: shared code belongs in rigkit/"


def test_windows_code_is_imported_only_by_windows_files():
    for name, path in sources().items():
        relative = str(path.relative_to(REPO))
        if name.startswith("rigkit.windows") or relative in WINDOWS_FILES | FRONT_DOORS:
            continue
        windows = {i for i in imports(path) if i == "rigkit.windows" or i.startswith("rigkit.windows.")}
        assert not windows, f"{relative} imports {sorted(windows)}: Windows-only code stays in rigkit/windows/"


@pytest.mark.parametrize("planted", ["from rigkit.windows.bundle import render_bundle", "import rigkit.windows.facts"])
def test_the_windows_rule_sees_a_planted_import(tmp_path, planted):
    path = tmp_path / "x.py"
    path.write_text(f"def f():\n    {planted}\n")
    assert any(i.startswith("rigkit.windows") for i in imports(path))


def test_host_data_is_read_in_one_module():
    readers = [
        str(path.relative_to(REPO))
        for path in sources().values()
        if any(isinstance(n, ast.Attribute) and n.attr == "data" and isinstance(n.value, ast.Name)
               and n.value.id == "host" for n in ast.walk(ast.parse(path.read_text())))
    ]
    assert readers == [HOST_DATA_READER]


def test_each_role_is_one_deploy_function():
    for path in (REPO / "roles").glob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        deploys = [
            n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "deploy" for d in n.decorator_list)
        ]
        assert deploys == [path.stem], f"{path.name}: @deploy functions {deploys}"


def test_templates_are_found_the_same_in_an_installed_copy(tmp_path):
    """An installed wheel has no repository around it: pyproject.toml ships templates/ as
    rigkit/_templates, and rigkit.plumbing.render finds the same files there."""
    import shutil
    import subprocess
    import sys
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["rigkit._templates"] == "templates"
    assert "rigkit._templates" in setuptools["packages"]
    site = tmp_path / "site"
    shutil.copytree(REPO / "rigkit", site / "rigkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "templates", site / "rigkit" / "_templates")
    probe = ("from rigkit.plumbing.render import template_path, template_text; "
             "print(template_path('serving/rigkit-stack')); print(len(template_text('weights/copier/main.py')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == str(site / "rigkit" / "_templates" / "serving" / "rigkit-stack")
    assert int(out[1]) == len((REPO / "templates/weights/copier/main.py").read_text())


def test_every_package_ships_in_the_wheel():
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {module_name(p.parent) if p.parent != REPO / "rigkit" else "rigkit"
                for p in (REPO / "rigkit").rglob("__init__.py") if "_templates" not in p.parts}
    assert packages <= listed, f"add to pyproject.toml's packages: {sorted(packages - listed)}"


# Rig paths and names both sides use have one home (STYLE.md, "The rig side"). These are the
# literals that were once retyped in several modules; prose (docstrings, comments) may name them.
NAMES_HOME = "rigkit/rigside/names.py"
RIG_LITERALS = (
    "/etc/rigkit", "/usr/local/sbin/rigkit", "/usr/local/lib/rigkit", "/var/lib/rigkit", "/run/rigkit",
    "/run/lock", "rigkit-gpu-policy.service", "rigkit-watchdog.service", "rigkit-watchdog.timer",
    "rigkit-stack-", "rigkit-weights-{", "changed-by-hand",
)


def code_strings(source: str) -> list[tuple[int, str]]:
    """Every string constant of a module's code (f-string parts included), docstrings left out."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # f"rigkit-weights-{x}": the literal around the holes, as typed
            text = "".join(v.value if isinstance(v, ast.Constant) else "{" for v in node.values)
            found.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append((node.lineno, node.value))
    return found


def retyped_rig_names(source: str, literals: tuple[str, ...] = RIG_LITERALS) -> list[str]:
    return [f"line {line}: {literal!r} in {text[:80]!r}" for line, text in code_strings(source)
            for literal in literals if literal in text and not text.endswith(".j2")]  # a template's name


def spelled_outside(files, homes: set[str], finder) -> dict[str, list[str]]:
    """What `finder` flags in each file's text, by repository path, the home modules left out."""
    return {str(path.relative_to(REPO)): hits for path in files
            if str(path.relative_to(REPO)) not in homes and (hits := finder(path.read_text()))}


def test_rig_paths_and_names_live_in_one_module():
    found = spelled_outside(sources().values(), {NAMES_HOME}, retyped_rig_names)
    assert not found, f"import these from {NAMES_HOME} instead: {found}"


@pytest.mark.parametrize("planted", [
    'UNIT = "rigkit-gpu-policy.service"',
    'HELPER = f"/usr/local/sbin/rigkit-stack {name}"',
    'def volume(m):\n    return f"rigkit-weights-{m.name}"',
    'CAUSES = ("resume", "driver", "reset", "changed-by-hand")',
])
def test_the_names_rule_sees_a_planted_copy(planted):
    assert retyped_rig_names(f'"""Docstrings may say /etc/rigkit/stacks."""\n{planted}\n')
    assert not retyped_rig_names('"""Installs /usr/local/sbin/rigkit-stack (rigkit-gpu-policy.service)."""\n')


# rigkit-stack's contract has one home too: its stack files, verbs and arguments are declared in
# rigkit/rigside/stack.py, whose functions build each command line on the controller and parse it in the
# program. Nothing else spells a stack file or a `rigkit-stack VERB` command in code: rigkit/, roles/ and
# the rig's Python scripts under templates/ (rigkit-stack itself included). compose.yml is not among the
# names: the gateway's stack (rigkit/gateway/stack.py) and a Windows rig's stacks have files of that name.
CONTRACT_HOME = "rigkit/rigside/stack.py"
STACK_FILE_NAMES = ("compose.next.yml", "stack.next.json", "compose.failed.yml", "gate.pending", "stack.json")
STACK_VERBS = ("rollout", "promote", "rollback", "restart", "down", "probe")
STACK_COMMAND = re.compile(rf"rigkit-stack +({'|'.join(STACK_VERBS)})\b")
HELPER_NAME = "STACK_HELPER_PATH"


def rig_python_scripts() -> list[Path]:
    """The Python programs under templates/ (a .py file, or a python shebang): what runs on the rig."""
    def python(path: Path) -> bool:
        first = path.read_text(errors="replace").partition("\n")[0]
        return path.suffix == ".py" or first.startswith("#!") and "python" in first

    return sorted(p for p in (REPO / "templates").rglob("*") if p.is_file() and p.suffix != ".j2" and python(p))


def _names_the_helper(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == HELPER_NAME or isinstance(n, ast.Attribute) and n.attr == HELPER_NAME
               for n in ast.walk(node))


def spelled_stack_contract(source: str) -> list[str]:
    """A stack file name or a `rigkit-stack VERB` command in a code string, or the helper's path built into a
    command by hand (an f-string, a `+` or a list with a verb), line by line."""
    found = [f"line {line}: {text[:80]!r}" for line, text in code_strings(source)
             if any(name in text for name in STACK_FILE_NAMES) or STACK_COMMAND.search(text)]
    for node in ast.walk(ast.parse(source)):
        built = isinstance(node, (ast.JoinedStr, ast.BinOp)) and _names_the_helper(node)
        listed = isinstance(node, (ast.List, ast.Tuple)) and _names_the_helper(node) and any(
            isinstance(e, ast.Constant) and e.value in STACK_VERBS for e in node.elts)
        if built or listed:
            found.append(f"line {node.lineno}: {HELPER_NAME} in a command built by hand")
    return found


def test_the_stack_contract_is_spelled_in_one_module():
    files = [*sources().values(), *rig_python_scripts()]
    assert REPO / "templates/serving/rigkit-stack" in files and REPO / "roles/verify.py" in files
    found = spelled_outside(files, {CONTRACT_HOME}, spelled_stack_contract)
    assert not found, f"take these from {CONTRACT_HOME} (its names, its *_command functions) instead: {found}"


@pytest.mark.parametrize("planted", [
    'WANTED = f"{stacks}/{name}/compose.next.yml"',
    'SETTINGS = os.path.join(folder, "stack.json")',
    'open(os.path.join(folder, "gate.pending"))',
    'KEPT = "compose.failed.yml"',
    'CMD = f"{STACK_HELPER_PATH} rollout {shlex.quote(name)}"',
    'CMD = f"{names.STACK_HELPER_PATH} {{}} {name} {sha}".format("promote")',
    'CMD = STACK_HELPER_PATH + " down " + name',
    'CMD = [STACK_HELPER_PATH, "restart", name, "proven"]',
    'CMD = "/usr/local/sbin/rigkit-stack probe m " + key',
])
def test_the_stack_contract_rule_sees_a_planted_copy(planted):
    assert spelled_stack_contract(f'"""Docstrings may say compose.next.yml and `rigkit-stack rollout NAME gate`."""\n{planted}\n')
    assert not spelled_stack_contract('"""Writes stack.json; run `rigkit-stack promote NAME SHA256`."""\n'
                                      '# a comment may too: gate.pending\n'
                                      'GATEWAY_COMPOSE = f"{GATEWAY_DIR}/compose.yml"\n'
                                      'FILES = (STACK_HELPER_PATH, P2P_PROBE_SCRIPT_PATH)\n'
                                      'print(f"stack {name} rollout", "restart(s)")\n')


# The rig's own Python scripts import the shipped runtime (rigkit/rigside) from names.LIB_DIR: that
# one folder is the only rig path they may spell, in the line that finds the runtime.
RIG_SCRIPTS = ("templates/serving/rigkit-stack", "templates/serving/rigkit-watchdog",
               "templates/status/rigkit-status-probe.py", "templates/gateway/rigkit-gateway",
               "templates/gpu_policy/rigkit-gpu-keeper.py", "templates/monitoring/rigkit-exporter.py",
               "templates/ondemand/rigkit-ondemand")


@pytest.mark.parametrize("script", RIG_SCRIPTS)
def test_each_rig_script_takes_names_and_protocols_from_the_runtime(script):
    from rigkit.rigside.names import LIB_DIR

    source = (REPO / script).read_text()
    tree = ast.parse(source)
    runtime = {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "rigside" in runtime, f"{script} does not import the rig-side runtime"
    hits = [hit for hit in retyped_rig_names(source) if f"{LIB_DIR!r} in {LIB_DIR!r}" not in hit]
    assert not hits, f"{script}: take these from rigside.names: {hits}"
    assert f'os.environ.get("RIGKIT_LIB_DIR", "{LIB_DIR}")' in source, f"{script} looks for the runtime elsewhere"
    for protocol in ("fcntl.flock", "/v1/completions", "os.fsync", '"VLLM_API_KEY', "hashlib.sha256"):
        assert protocol not in source, f"{script} writes {protocol} again: use the runtime's"


# On Windows one PowerShell include plays the runtime's part: the helpers every script needs
# (the log line, a native call under 'Stop', the API key's env file) are written once, in
# templates/windows/_helpers.ps1.j2, and rendered into each script (a task runs one file).
WINDOWS_HELPERS = ("function Write-Log", "function Invoke-Native", "function Read-ApiKey")
WINDOWS_SCRIPTS = ("llm-bootstrap.ps1.j2", "rigkit-watchdog.ps1.j2", "gpu-power-policy.ps1.j2")


def test_the_windows_helpers_are_written_once_and_included_by_each_script():
    folder = REPO / "templates" / "windows"
    include = (folder / "_helpers.ps1.j2").read_text()
    assert all(helper in include for helper in WINDOWS_HELPERS)
    for path in folder.glob("*.j2"):
        if path.name != "_helpers.ps1.j2":
            again = [h for h in WINDOWS_HELPERS if h in path.read_text()]
            assert not again, f"{path.name} defines {again} again: use templates/windows/_helpers.ps1.j2"
    for name in WINDOWS_SCRIPTS:
        assert '{% include "windows/_helpers.ps1.j2" %}' in (folder / name).read_text(), name


# A Windows rig's paths and names have their home too: rigkit/windows/names.py. These are the literals
# that were once spread over the bundle, the role, its operations, watchdog, status and timing (status
# retyped GPU-PowerPolicy). Linux's names.py spells two of the same file names for its own paths.
WINDOWS_NAMES_HOME = "rigkit/windows/names.py"
WINDOWS_TASKS = ("GPU-PowerPolicy", "LocalLLM-Bootstrap", "LocalLLM-Watchdog")
WINDOWS_RIG_LITERALS = (
    "ProgramData", *WINDOWS_TASKS, "gpu-power-policy.ps1", "llm-bootstrap.ps1", "rigkit-watchdog.ps1",
    "watchdog.json", "rollout.lock", "vllm-api-key.env", "rigkit.log", "watchdog.log", "Docker Desktop.exe",
    ".rigkit-commands",
)


def test_windows_rig_paths_and_names_live_in_one_module():
    found = spelled_outside(sources().values(), {WINDOWS_NAMES_HOME, NAMES_HOME},
                            lambda text: retyped_rig_names(text, WINDOWS_RIG_LITERALS))
    assert not found, f"import these from {WINDOWS_NAMES_HOME} instead: {found}"


@pytest.mark.parametrize("planted", [
    'API_KEY_FILE = INSTALL_DIR / "secrets" / "vllm-api-key.env"',
    'INSTALL_DIR = PureWindowsPath(r"C:\\ProgramData\\rigkit")',
    'doc = build_status(rig, now, "GPU-PowerPolicy", "")',
    'def log(rig):\n    return f"{rig.file}: LocalLLM-Bootstrap may run {budget}"',
    'files = {"scripts/rigkit-watchdog.ps1": render("windows/rigkit-watchdog.ps1.j2")}',
])
def test_the_windows_names_rule_sees_a_planted_copy(planted):
    assert retyped_rig_names(f'r"""Puts C:\\ProgramData\\rigkit\\rollout.lock."""\n{planted}\n', WINDOWS_RIG_LITERALS)
    clean = ('r"""Registers LocalLLM-Bootstrap (C:\\ProgramData\\rigkit\\llm-bootstrap.ps1)."""\n'
             'SCRIPT = render("windows/llm-bootstrap.ps1.j2")  # GPU-PowerPolicy runs first\n')
    assert not retyped_rig_names(clean, WINDOWS_RIG_LITERALS)


def template_code(text: str) -> str:
    """A Windows template without its comments: Jinja's {# #}, XML's <!-- -->, and PowerShell's from a #
    outside a single-quoted string to the line's end (the templates quote with single quotes only)."""
    text = re.sub(r"\{#.*?#\}|<!--.*?-->", "", text, flags=re.S)
    code = []
    for line in text.splitlines():
        quoted = False
        for at, char in enumerate(line):
            quoted ^= char == "'"
            if char == "#" and not quoted:
                line = line[:at]
                break
        code.append(line)
    return "\n".join(code)


def windows_names_in_template(text: str) -> list[str]:
    return [literal for literal in WINDOWS_RIG_LITERALS if literal in template_code(text)]


def test_windows_templates_take_rig_paths_and_task_names_as_values():
    """The scripts and task XML get every path and task name from rigkit.windows.names, rendered in (the
    log sources and the bootstrap's line about GPU-PowerPolicy too); their comments may name them."""
    found = {path.name: hits for path in (REPO / "templates" / "windows").glob("*.j2")
             if (hits := windows_names_in_template(path.read_text()))}
    assert not found, f"render these from {WINDOWS_NAMES_HOME} instead: {found}"
    assert windows_names_in_template("$LogSource = 'LocalLLM-Bootstrap'\n") == ["LocalLLM-Bootstrap"]
    assert windows_names_in_template("$KeyFile = 'C:\\ProgramData\\rigkit\\secrets\\vllm-api-key.env'  # x\n") == [
        "ProgramData", "vllm-api-key.env"]
    assert not windows_names_in_template("{#- GPU-PowerPolicy -#}\n# LocalLLM-Bootstrap's lock\n"
                                         "$RolloutMaxS = 60  # LocalLLM-Bootstrap's limit\n<!-- rollout.lock -->\n"
                                         "Write-Log ('{0}: a # in a string' -f $x)  # rigkit.log\n")


# The Windows scripts' protocols, each written once in the include (as rigkit/rigside holds Linux's): the
# one-token probe (Invoke-OneToken) and the rollout lock's one attempt (Enter-RolloutLock). Each caller keeps
# its own waiting: the bootstrap waits for a holder and retries the probe up to its bounds, the watchdog
# judges each answer. What each protocol's code says, whitespace, case and `System.` aside: a completion
# request, and a file opened without sharing by [IO.File]::Open (Write-FileAtomically's FileStream is no lock).
WINDOWS_PROTOCOLS = {
    "the one-token probe": re.compile(r"/v1/completions|max_tokens"),
    "the rollout lock's open": re.compile(r"\[io\.file\]::open\([^)]*\[io\.fileshare\]::none"),
}
WINDOWS_PROTOCOL_FUNCTIONS = ("function Invoke-OneToken", "function Enter-RolloutLock")


def windows_protocols_written(text: str) -> list[str]:
    flat = re.sub(r"\s|system\.", "", text.lower())
    return [name for name, pattern in WINDOWS_PROTOCOLS.items() if pattern.search(flat)]


def test_the_windows_probe_and_lock_are_written_once_in_the_include():
    folder = REPO / "templates" / "windows"
    include = (folder / "_helpers.ps1.j2").read_text()
    assert windows_protocols_written(include) == list(WINDOWS_PROTOCOLS)
    assert all(function in include for function in WINDOWS_PROTOCOL_FUNCTIONS)
    again = {path.relative_to(REPO).as_posix(): found
             for path in [*folder.glob("*.j2"), *(REPO / "rigkit" / "windows").glob("*.py")]
             if path.name != "_helpers.ps1.j2" and (found := windows_protocols_written(path.read_text()))}
    assert not again, f"written again: {again}; use templates/windows/_helpers.ps1.j2's Invoke-OneToken, Enter-RolloutLock"
    for name in ("llm-bootstrap.ps1.j2", "rigkit-watchdog.ps1.j2"):
        script = (folder / name).read_text()
        assert "Invoke-OneToken " in script and "Enter-RolloutLock" in script, f"{name} does not use the include's"


def test_the_windows_protocol_rule_sees_a_planted_copy():
    probe = ("$body = @{ model = $stack.Model; prompt = 'ping'; MAX_TOKENS = 1 } | ConvertTo-Json -Compress\n"
             "Invoke-RestMethod -Method Post -Uri ('http://127.0.0.1:{0}/v1/completions' -f $port) -Body $body\n")
    lock = "$RolloutLock = [IO.File]::Open($LockFile, 'OpenOrCreate', 'ReadWrite', [System.IO.FileShare]:: None)\n"
    assert windows_protocols_written(probe) == ["the one-token probe"]
    assert windows_protocols_written(lock) == ["the rollout lock's open"]
    # The connector's stager opens its script file shared for reading, Write-FileAtomically writes its state
    # through an unshared stream: neither is the lock.
    stager = "$hold = [IO.File]::Open($path, [IO.FileMode]::Open, [IO.FileAccess]::Read, [IO.FileShare]::Read)\n"
    state = ("$stream = New-Object IO.FileStream($temporary, [IO.FileMode]::Create, [IO.FileAccess]::Write, "
             "[IO.FileShare]::None, 4096, [IO.FileOptions]::WriteThrough)\n")
    for other in (stager, state, "Invoke-OneToken $p $m $k 30 | Out-Null\n"):
        assert windows_protocols_written(other) == [], other


def test_each_rendered_windows_script_has_the_probe_and_the_lock_once():
    from rigkit.config.loader import load_rig
    from rigkit.windows.bundle import render_bundle
    from rigkit.windows.names import BOOTSTRAP_SCRIPT, WATCHDOG_SCRIPT

    bundle = render_bundle(load_rig(REPO / "tests/data/rigs/windows.yml", REPO / "tests/data/models"))
    for script in (BOOTSTRAP_SCRIPT, WATCHDOG_SCRIPT):
        text = bundle[f"scripts/{script.name}"]
        assert [text.count(function) for function in WINDOWS_PROTOCOL_FUNCTIONS] == [1, 1], script.name
        assert text.count("/v1/completions") == 1 and text.count("[IO.File]::Open(") == 1, script.name


def test_names_spelled_out_where_the_runtime_cannot_be_imported_agree_with_it():
    """Two rig-side programs cannot import the runtime: the policy script is shell, and tune's helper
    is shipped as one file to run before any deploy. What they spell out must equal names.py's."""
    from rigkit.rigside import names
    from rigkit.tune import rig_helper as tune_helper

    script = (REPO / "templates/gpu_policy/rigkit-gpu-policy.sh").read_text()
    assert f"APPLIED_STAMP={names.GPU_POLICY_APPLIED_PATH}\n" in script
    assert f"POLICY_LOCK={names.GPU_KEEPER_LOCK_PATH}\n" in script  # the keeper's lock: one writer at a time
    assert f"PARKED={names.GPU_PARKED_PATH} " in script  # GPUs rigkit-ondemand unlocked while parked
    assert tune_helper.DEADMAN_UNIT == names.TUNE_DEADMAN_UNIT


# A newcomer finds every package, role and rig-side module in README's layout table and in
# docs/architecture.md (both once went out of date: monitoring, base and preflight were missing).
def unnamed_in_the_docs(readme: str, architecture: str, packages: list[str], roles: list[str], runtime: list[str]) -> list[str]:
    missing = [f"README: `rigkit/{p}/`" for p in packages if f"`rigkit/{p}/`" not in readme]
    missing += [f"docs/architecture.md: `{p}`" for p in packages
                if f"`{p}`" not in architecture and f"`rigkit/{p}`" not in architecture]
    missing += [f"{doc}: role `{r}`" for r in roles for doc, text in (("README", readme), ("docs/architecture.md", architecture))
                if f"`{r}`" not in text]
    missing += [f"docs/architecture.md: runtime module `{m}`" for m in runtime if f"| `{m}` |" not in architecture]
    return missing


def test_every_package_role_and_runtime_module_is_named_in_the_docs():
    packages = sorted(p.name for p in (REPO / "rigkit").iterdir() if (p / "__init__.py").exists())
    roles = sorted(p.stem for p in (REPO / "roles").glob("*.py") if p.stem != "__init__")
    runtime = sorted(p.name for p in (REPO / "rigkit" / "rigside").glob("*.py") if p.name != "__init__.py")
    missing = unnamed_in_the_docs((REPO / "README.md").read_text(), (REPO / "docs" / "architecture.md").read_text(),
                                  packages, roles, runtime)
    assert not missing, f"name these in the layout tables: {missing}"
    planted = unnamed_in_the_docs("`rigkit/gpu/` `serving`", "`gpu` `serving` | `names.py` |", ["gpu", "newfeature"],
                                  ["serving"], ["names.py", "new.py"])
    assert planted == ["README: `rigkit/newfeature/`", "docs/architecture.md: `newfeature`",
                       "docs/architecture.md: runtime module `new.py`"]


def test_every_module_imports():
    """Every module of rigkit/ and roles/ imports on its own, in a fresh interpreter: a name removed from
    one module while another still imports it (c734148: roles/gateway_verify.py's PROJECT) fails here,
    not in the one deploy that reaches that line. roles/ import pyinfra's host, which needs no deploy
    to import."""
    import subprocess
    import sys

    modules = sorted({".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                      for folder in ("rigkit", "roles") for p in (REPO / folder).rglob("*.py")})
    probe = ("import importlib, sys\nfailed = []\nfor name in sys.argv[1:]:\n    try:\n"
             "        importlib.import_module(name)\n    except Exception as exc:\n"
             "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\nprint('\\n'.join(failed))\n")
    done = subprocess.run([sys.executable, "-c", probe, *modules], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    assert len(modules) > 150, modules  # the walk found the packages
