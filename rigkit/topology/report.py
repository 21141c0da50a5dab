"""The topology fact's output, split into its sections and parsed into a RigTopology. Pure.

The fact (rigkit/topology/facts.py) prints each tool's output after a line `@@rigkit NAME` and
ends it with `@@rigkit-rc CODE`; a section whose tool failed, is missing or timed out is "not
read" (None), never "nothing wrong" - except the matrix, without which there is no topology.
"""

from __future__ import annotations

from rigkit.topology.decide import RigTopology
from rigkit.topology.parse import (
    TopologyParseError,
    parse_acs,
    parse_iommu,
    parse_p2p_matrix,
    parse_pci_paths,
    parse_pcie_query,
    parse_topo_matrix,
)

BEGIN = "@@rigkit "
RC = "@@rigkit-rc "
SECTIONS = ("uid", "topo-m", "p2p-r", "pcie", "cmdline", "iommu", "iommu-types", "pci-paths", "lspci")


def split_sections(lines: list[str]) -> dict[str, tuple[int, str]]:
    """{name: (exit code, text)} for each section the output holds."""
    out, name, body = {}, None, []
    for line in lines:
        if line.startswith(BEGIN):
            name, body = line[len(BEGIN):].strip(), []
        elif line.startswith(RC) and name is not None:
            rc = line[len(RC):].strip()
            out[name] = (int(rc) if rc.lstrip("-").isdigit() else -1, "\n".join(body))
            name = None
        elif name is not None:
            body.append(line)
    return out


def read_report(lines: list[str], windows: bool = False) -> tuple[RigTopology | None, list[str]]:
    """The rig's topology and what could not be read (one line each, for the person at the rig)."""
    sections = split_sections(lines)
    notes: list[str] = []

    def text(name: str) -> str | None:
        rc, body = sections.get(name, (None, ""))
        if rc is None:
            notes.append(f"{name}: not in the fact's output")
            return None
        if rc != 0:
            notes.append(f"{name}: exited {rc}" + (" (timed out)" if rc == 124 else "") + (f": {body.strip()[:200]}" if body.strip() else ""))
            return None
        return body

    matrix_text = text("topo-m")
    if matrix_text is None:
        return None, notes
    try:
        matrix = parse_topo_matrix(matrix_text)
    except TopologyParseError as e:
        return None, [*notes, str(e)]

    def parsed(name, parser, *more):
        body = text(name)
        if body is None:
            return None
        try:
            return parser(body, *more)
        except TopologyParseError as e:
            notes.append(str(e))
            return None

    p2p = parsed("p2p-r", parse_p2p_matrix) if len(matrix.gpus) > 1 else {}
    pcie = parsed("pcie", parse_pcie_query) or {}
    cmdline = text("cmdline")
    iommu_entries = sections.get("iommu", (0, ""))[1].split()
    types = sections.get("iommu-types", (0, ""))[1].split()
    iommu = parse_iommu(cmdline, iommu_entries, types) if cmdline is not None else None
    acs = None
    uid = sections.get("uid", (1, ""))[1].strip()
    lspci = text("lspci")
    if lspci is not None:
        if uid == "0":
            acs = tuple(parse_acs(lspci))
        else:
            notes.append("lspci: not run as root, so it hides ACSCtl: PCIe ACS not read")
    paths = parsed("pci-paths", parse_pci_paths) if "pci-paths" in sections else None
    return RigTopology(matrix, pcie, p2p, iommu, acs, windows, paths or None), notes
