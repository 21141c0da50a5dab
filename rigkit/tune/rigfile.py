"""The rig-file change a sweep proposes: a unified diff, and `--write` to a copy that
`load_rig` must accept.

Only the `power_limit_w`, `clock_lock_mhz` and `clock_offsets_mhz` values of the GPUs concerned
change; every other byte, comments included, stays. The edit replaces the exact text span PyYAML
reports for the value (ruamel.yaml is not a dependency), and adds a missing key after the GPU's
last line. Offsets are written as `{memory: M, graphics: C}`; zero offsets add nothing.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import yaml

from rigkit.config.loader import load_rig
from rigkit.config.schema import RigConfig
from rigkit.tune.cells import Cell


class RigFileError(Exception):
    """The file cannot be edited safely by line; str() is the whole message."""


@dataclass(frozen=True)
class RigChange:
    text: str  # the whole new file
    diff: str  # unified diff against the old one
    notes: tuple[str, ...]  # what the file cannot say


def propose(rig_file: Path | str, changes: dict[int, Cell]) -> RigChange:
    """`changes`: GPU index -> the chosen cell."""
    rig_file = Path(rig_file)
    old = rig_file.read_text(encoding="utf-8")
    new = edit_text(old, changes, str(rig_file))
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{rig_file.name}", f"b/{rig_file.name}"))
    notes = tuple(f"GPU {index}: clock offsets memory {cell.mem_offset_mhz:+d} MHz, graphics {cell.core_offset_mhz:+d} "
                  "MHz: applied at boot by the GPU policy through NVML (Linux), checked against the driver's range there"
                  for index, cell in sorted(changes.items()) if cell.mem_offset_mhz or cell.core_offset_mhz)
    return RigChange(new, diff, notes)


def write_copy(rig_file: Path | str, changes: dict[int, Cell], dest: Path | str, catalog_dir: Path | str) -> RigConfig:
    """Write the changed file to `dest` and load it as rigkit would; a copy it refuses is removed."""
    dest = Path(dest)
    dest.write_text(propose(rig_file, changes).text, encoding="utf-8")
    try:
        return load_rig(dest, catalog_dir)
    except Exception:
        dest.unlink()
        raise


def edit_text(text: str, changes: dict[int, Cell], where: str = "rig file") -> str:
    gpus = _gpu_items(text, where)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in character offsets
    for index, cell in changes.items():
        item = gpus.get(index)
        if item is None:
            raise RigFileError(f"{where}: no GPU with index {index} under gpus:")
        values = {k.value: v for k, v in item.value}
        offsets = cell.mem_offset_mhz or cell.core_offset_mhz
        for key, make in (("power_limit_w", lambda old: str(cell.power_limit_w)),
                          ("clock_lock_mhz", lambda old: _lock_text(cell.clock_lock_mhz, old)),
                          ("clock_offsets_mhz", lambda old: _offsets_text(cell))):
            node = values.get(key)
            if node is None and key == "clock_lock_mhz" and cell.clock_lock_mhz is None:
                continue  # a missing lock already means unlocked
            if node is None and key == "clock_offsets_mhz" and not offsets:
                continue  # missing offsets already mean none
            if node is None:
                edits.append(_insertion(text, item, f"{key}: {make(None)}"))
            elif node.start_mark.line != node.end_mark.line:
                raise RigFileError(f"{where}, line {node.start_mark.line + 1}: gpus[{index}].{key} spans several "
                                   "lines; write it on one line (e.g. [0, 2200]) so it can be edited safely")
            else:
                edits.append((node.start_mark.index, node.end_mark.index, make(node)))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _gpu_items(text: str, where: str) -> dict[int, yaml.MappingNode]:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    gpus = next((v for k, v in root.value if k.value == "gpus"), None) if isinstance(root, yaml.MappingNode) else None
    if not isinstance(gpus, yaml.SequenceNode):
        raise RigFileError(f"{where}: no gpus: list to edit")
    items = {}
    for item in gpus.value:
        if not isinstance(item, yaml.MappingNode) or item.flow_style:
            raise RigFileError(f"{where}, line {item.start_mark.line + 1}: write each GPU in block style "
                               "(index:, model: on their own lines) so it can be edited safely")
        index = next((v.value for k, v in item.value if k.value == "index"), None)
        if index is not None:
            items[int(index)] = item
    return items


def _offsets_text(cell: Cell) -> str:
    if not (cell.mem_offset_mhz or cell.core_offset_mhz):
        return "null"  # no offsets: the policy sets 0,0
    return f"{{memory: {cell.mem_offset_mhz}, graphics: {cell.core_offset_mhz}}}"


def _lock_text(ceiling_mhz: int | None, old: yaml.Node | None) -> str:
    if ceiling_mhz is None:
        return "null"  # unlocked; the schema reads null as no lock
    if isinstance(old, yaml.SequenceNode) and old.value:
        return f"[{old.value[0].value}, {ceiling_mhz}]"  # keep the floor the owner chose
    return str(ceiling_mhz)  # a bare ceiling means [0, ceiling]


def _insertion(text: str, item: yaml.MappingNode, line: str) -> tuple[int, int, str]:
    """A new `key: value` line after the GPU's last line, at its keys' indentation."""
    indent = item.value[0][0].start_mark.column
    last_line = max(v.end_mark.line if v.end_mark.column else v.end_mark.line - 1 for _, v in item.value)
    at = -1
    for _ in range(last_line + 1):
        at = text.find("\n", at + 1)
        if at == -1:
            return (len(text), len(text), "\n" + " " * indent + line)  # the GPU ends the file, unterminated
    crlf = text[at - 1:at] == "\r"
    return (at - crlf, at - crlf, ("\r\n" if crlf else "\n") + " " * indent + line)
