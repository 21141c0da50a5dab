"""Parsers for what a rig prints about its GPU topology. Pure functions, no pyinfra.

Each takes the text a tool printed and returns plain data; text it cannot read raises
TopologyParseError naming the line, so a fact never turns garbage into "no problem".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
LINK_TYPES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")  # NV# handled apart
NVLINK = re.compile(r"^NV(\d+)$")
# nvidia-smi topo -p2p legend (seen in public captures, e.g. noonghunna/club-3090#1229):
# X = Self, OK = Status Ok, CNS = Chipset not supported, GNS = GPU not supported,
# TNS = Topology not supported, NS = Not supported, DR = Disabled by regkey, U = Unknown.
P2P_STATUSES = ("X", "OK", "CNS", "GNS", "TNS", "NS", "DR", "U", "NA")


class TopologyParseError(ValueError):
    pass


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def _table_lines(text: str) -> list[str]:
    """The lines before the legend, without ANSI codes and blank lines."""
    lines = []
    for line in strip_ansi(text).splitlines():
        if line.strip().startswith("Legend"):
            break
        if line.strip():
            lines.append(line.rstrip())
    return lines


def _gpu_index(name: str) -> int | None:
    m = re.fullmatch(r"GPU(\d+)", name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class TopoMatrix:
    """`nvidia-smi topo -m`: the link between each pair of GPUs and each GPU's affinities."""

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str]  # (a, b) with a < b -> "NV12", "PIX", ..., "SYS"
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, str] = field(default_factory=dict)

    def link(self, a: int, b: int) -> str:
        return self.links[(min(a, b), max(a, b))]


def _split_header(line: str) -> list[str]:
    # Column names are tab separated; "CPU Affinity" has a space in it. Older drivers
    # print spaces only: rejoin the known two-word names.
    cells = [c.strip() for c in re.split(r"\t+|\s{2,}", line.strip()) if c.strip()]
    if len(cells) == 1 or any(c in ("CPU", "NUMA") for c in cells):
        cells = re.sub(r"(CPU|NUMA|GPU NUMA) (Affinity|ID)", r"\1_\2", line.strip()).split()
        cells = [c.replace("_", " ") for c in cells]
    return cells


MAX_MATRIX_GPUS = 64  # rigkit serves 1 to 8 GPUs a rig; a matrix far larger is not one (a 3000x3000 took 9 s)


def parse_topo_matrix(text: str) -> TopoMatrix:
    lines = _table_lines(text)
    if not lines:
        raise TopologyParseError("nvidia-smi topo -m printed no matrix")
    header = _split_header(lines[0])
    gpu_cols = [_gpu_index(c) for c in header]
    if sum(c is not None for c in gpu_cols) > MAX_MATRIX_GPUS:
        raise TopologyParseError(f"nvidia-smi topo -m: {sum(c is not None for c in gpu_cols)} GPU columns; "
                                 f"a rig has at most {MAX_MATRIX_GPUS}: not a rig's topology")
    n_dev = sum(1 for c in header if c not in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID"))
    links: dict[tuple[int, int], str] = {}
    cpu, numa = {}, {}
    gpus = []
    for line in lines[1:]:
        cells = line.split()
        row = _gpu_index(cells[0]) if cells else None
        if row is None:
            continue  # NIC / mlx5 rows
        values = cells[1:]
        if len(values) < n_dev:
            raise TopologyParseError(f"nvidia-smi topo -m: row {cells[0]!r} has {len(values)} cells, expected {n_dev}: {line!r}")
        gpus.append(row)
        for col, value in zip(gpu_cols[:n_dev], values[:n_dev]):
            if col is None or col == row:
                continue
            if value not in LINK_TYPES and not NVLINK.match(value):
                raise TopologyParseError(f"nvidia-smi topo -m: unknown link {value!r} between GPU{row} and GPU{col}")
            links[(min(row, col), max(row, col))] = value
        rest = values[n_dev:]
        if rest:
            cpu[row] = rest[0]
        if len(rest) > 1:
            numa[row] = rest[1]
    if not gpus:
        raise TopologyParseError("nvidia-smi topo -m: no GPU rows")
    return TopoMatrix(tuple(gpus), links, cpu, numa)


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -p2p r` (or w/rw...): status per ordered GPU pair (a, b), a != b."""
    lines = _table_lines(text)
    if not lines:
        raise TopologyParseError("nvidia-smi topo -p2p printed no matrix")
    cols = [_gpu_index(c) for c in lines[0].split()]
    if None in cols or not cols:
        raise TopologyParseError(f"nvidia-smi topo -p2p: header is not GPU columns: {lines[0]!r}")
    out: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        cells = line.split()
        row = _gpu_index(cells[0])
        if row is None:
            raise TopologyParseError(f"nvidia-smi topo -p2p: unexpected row {line!r}")
        if len(cells) - 1 != len(cols):
            raise TopologyParseError(f"nvidia-smi topo -p2p: row GPU{row} has {len(cells) - 1} cells, expected {len(cols)}")
        for col, value in zip(cols, cells[1:]):
            if value not in P2P_STATUSES:
                raise TopologyParseError(f"nvidia-smi topo -p2p: unknown status {value!r} (GPU{row} -> GPU{col})")
            if col != row:
                out[(row, col)] = value
    return out


@dataclass(frozen=True)
class PcieLink:
    gen_current: int
    gen_max: int
    width_current: int
    width_max: int


def parse_pcie_query(text: str) -> dict[int, PcieLink]:
    """`--query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,
    pcie.link.width.max --format=csv,noheader`. A header line (csv without noheader) is skipped."""
    out = {}
    for line in strip_ansi(text).splitlines():
        if not line.strip() or line.lstrip().startswith("index"):
            continue
        cells = [c.strip() for c in line.split(",")]
        try:
            index, gen_c, gen_m, width_c, width_m = (int(c) for c in cells[:5])
        except ValueError:
            raise TopologyParseError(f"PCIe query: not 5 integers: {line!r}") from None
        if len(cells) != 5:
            raise TopologyParseError(f"PCIe query: expected 5 fields, got {len(cells)}: {line!r}")
        out[index] = PcieLink(gen_c, gen_m, width_c, width_m)
    return out


@dataclass(frozen=True)
class IommuState:
    """Whether DMA goes through IOMMU translation. `translating` is the risky state for P2P:
    peer writes are then translated (or redirected) instead of going straight to the peer."""

    active: bool  # /sys/class/iommu has entries
    passthrough: bool  # iommu=pt (or the kernel's default domain is passthrough)
    cmdline_flags: tuple[str, ...]

    @property
    def translating(self) -> bool:
        return self.active and not self.passthrough


_IOMMU_FLAG = re.compile(r"^(intel_iommu|amd_iommu|iommu|iommu\.passthrough)=")


def parse_iommu(cmdline: str, sys_class_iommu: list[str], group_types: list[str] | None = None) -> IommuState:
    """The kernel command line (/proc/cmdline), the entries of /sys/class/iommu and, where read,
    the domain type of each IOMMU group (/sys/kernel/iommu_groups/*/type: "identity" is
    passthrough, "DMA"/"DMA-FQ" translate). The group types are what the kernel really did;
    without them passthrough is taken from the command line only, and an IOMMU on by default
    (AMD, recent Intel kernels) without `iommu=pt` counts as translating."""
    flags = tuple(w for w in cmdline.split() if _IOMMU_FLAG.match(w))
    values = dict(f.split("=", 1) for f in flags)
    passthrough = values.get("iommu") == "pt" or values.get("iommu.passthrough") in ("1", "on", "y")
    off = values.get("intel_iommu") == "off" or values.get("amd_iommu") == "off" or values.get("iommu") == "off"
    active = bool([e for e in sys_class_iommu if e.strip()]) and not off
    types = [t.strip() for t in group_types or () if t.strip()]
    if types:
        active = True
        passthrough = all(t == "identity" for t in types)
    return IommuState(active=active, passthrough=passthrough, cmdline_flags=flags)


@dataclass(frozen=True)
class AcsBridge:
    address: str
    flags: dict[str, bool]

    @property
    def redirects(self) -> bool:
        """Request or completion redirect on: peer traffic goes up to the root complex."""
        return self.flags.get("ReqRedir", False) or self.flags.get("CmpltRedir", False)


_DEVICE = re.compile(r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s")
_FLAG = re.compile(r"(\w+)([+-])")


def parse_acs(lspci_vvv: str) -> list[AcsBridge]:
    """Every device of `lspci -vvv` with an `ACSCtl:` line (bridges and root ports)."""
    out, address = [], None
    for line in strip_ansi(lspci_vvv).splitlines():
        if _DEVICE.match(line):
            address = normalize_bdf(line.split()[0])
        elif line.strip().startswith("ACSCtl:") and address is not None:
            flags = {k: v == "+" for k, v in _FLAG.findall(line.split(":", 1)[1])}
            out.append(AcsBridge(address, flags))
    return out


_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def normalize_bdf(address: str) -> str:
    """PCI addresses in one form, as sysfs writes them: nvidia-smi's `00000000:01:00.0` and
    lspci's `01:00.0` (domain 0 left out without -D) become `0000:01:00.0`."""
    a = address.strip().lower()
    if re.fullmatch(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", a):
        a = a[4:]
    elif re.fullmatch(r"[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", a):
        a = "0000:" + a
    return a


def parse_pci_paths(text: str) -> dict[int, tuple[str, ...]]:
    """Lines `INDEX SYSFS_PATH` (`readlink -f /sys/bus/pci/devices/<GPU>`): each GPU's PCI
    devices from the root port down to the GPU itself, e.g.
    /sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:08.0/0000:06:00.0."""
    out = {}
    for line in strip_ansi(text).splitlines():
        if not line.strip():
            continue
        index, _, path = line.strip().partition(" ")
        chain = tuple(p for p in path.strip().split("/") if _BDF.match(p))
        # readlink -f of a missing device prints the link's own path: not a chain
        if not index.isdigit() or not chain or not path.strip().startswith("/sys/devices/"):
            raise TopologyParseError(f"PCI path: expected 'INDEX /sys/devices/...': {line!r}")
        out[int(index)] = chain
    return out


def bridges_between(path_a: tuple[str, ...], path_b: tuple[str, ...]) -> tuple[str, ...]:
    """The bridges peer traffic between two devices crosses below their nearest common
    ancestor: each side's chain after the common prefix, the devices themselves left out.
    Two root ports of one root complex (no common prefix) are both on the path."""
    common = 0
    while common < min(len(path_a), len(path_b)) and path_a[common] == path_b[common]:
        common += 1
    return path_a[common:-1] + path_b[common:-1]
