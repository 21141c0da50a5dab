"""rigkit.topology: parsers on real tool output (tests/data/topology/, each file names its public
source; the H200 capture in /work/shared/captures/h200-driver-580.159.04/ when present) and the
per-model decisions, as tables. Pure: no pyinfra, no rig, no Docker."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rigkit.topology.decide import ALLOW_RISKY_P2P, RigTopology, decide, link_rank, pcie_gbps
from rigkit.topology.parse import (
    AcsBridge,
    IommuState,
    PcieLink,
    TopologyParseError,
    TopoMatrix,
    bridges_between,
    normalize_bdf,
    parse_acs,
    parse_iommu,
    parse_p2p_matrix,
    parse_pci_paths,
    parse_pcie_query,
    parse_topo_matrix,
    strip_ansi,
)

DATA = Path(__file__).parent / "data" / "topology"
H200 = Path("/work/shared/captures/h200-driver-580.159.04")


def load(name: str) -> str:
    """A data file without its header comment (the lines starting with '#' that name the source)."""
    lines = (DATA / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    "name, gpus, pairs, cpu0, numa0",
    [
        ("h100-8x-nv18-topo-m.txt", 8, {(0, 7): "NV18", (3, 4): "NV18"}, "0-47,96-143", "0"),
        ("h100-4x-nv6-nics-topo-m.txt", 4, {(0, 1): "NV6", (2, 3): "NV6"}, "6,14,22,30", "3"),
        ("2x5090-phb-topo-m.txt", 2, {(0, 1): "PHB"}, "0-63", "0"),
        ("5gpu-sys-phb-node-topo-m.txt", 5, {(0, 1): "SYS", (1, 2): "PHB", (1, 3): "NODE", (3, 4): "PHB"}, "8-15,24-31", "1"),
        ("8x4090-sys-topo-m.txt", 8, {(0, 1): "SYS", (6, 7): "SYS"}, "0-55,112-167", "0"),
    ],
)
def test_topo_matrix_public_captures(name, gpus, pairs, cpu0, numa0):
    m = parse_topo_matrix(load(name))
    assert m.gpus == tuple(range(gpus))
    assert len(m.links) == gpus * (gpus - 1) // 2  # every pair, NIC columns left out
    for (a, b), link in pairs.items():
        assert m.link(a, b) == m.link(b, a) == link
    assert m.cpu_affinity[0] == cpu0 and m.numa_affinity[0] == numa0


@pytest.mark.skipif(not H200.exists(), reason="shared H200 capture not on this machine")
def test_topo_matrix_real_h200_with_ansi_codes():
    text = (H200 / "topo-m.txt").read_text()
    assert "\x1b[" in text  # the capture carries the underline codes nvidia-smi printed
    m = parse_topo_matrix(text)
    assert m == TopoMatrix((0,), {}, {0: "0-15"}, {0: "0"})


def test_topo_matrix_rejects_unknown_link_and_short_rows():
    with pytest.raises(TopologyParseError, match="unknown link 'FOO'"):
        parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0-7\nGPU1\tFOO\t X \t0-7\n")
    with pytest.raises(TopologyParseError, match="row 'GPU1' has 1 cells"):
        parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\n")
    with pytest.raises(TopologyParseError, match="no matrix"):
        parse_topo_matrix("\n\nLegend:\n")


def test_strip_ansi():
    assert strip_ansi("\x1b[4mGPU0\tCPU Affinity\x1b[0m") == "GPU0\tCPU Affinity"


@pytest.mark.parametrize(
    "text, expected",
    [
        (load("2x5090-p2p-r.txt"), {(0, 1): "GNS", (1, 0): "GNS"}),
        # layout as nvidia-smi prints -p2p r (same as the rw capture above), one row per status kind
        (" \tGPU0\tGPU1\tGPU2\t\n GPU0\tX\tOK\tNS\t\n GPU1\tOK\tX\tCNS\t\n GPU2\tTNS\tDR\tX\t\n\nLegend:\n  X    = Self\n",
         {(0, 1): "OK", (0, 2): "NS", (1, 0): "OK", (1, 2): "CNS", (2, 0): "TNS", (2, 1): "DR"}),
    ],
)
def test_p2p_matrix(text, expected):
    assert parse_p2p_matrix(text) == expected


def test_p2p_matrix_rejects_unknown_status():
    with pytest.raises(TopologyParseError, match="unknown status 'YES'"):
        parse_p2p_matrix("\tGPU0\tGPU1\nGPU0\tX\tYES\nGPU1\tOK\tX\n")


@pytest.mark.skipif(not H200.exists(), reason="shared H200 capture not on this machine")
def test_pcie_query_real_h200():
    # query.txt asks for more fields; take the columns this parser reads, in its order.
    header, row = (H200 / "query.txt").read_text().splitlines()[:2]
    cells = [c.strip() for c in row.split(",")]
    assert parse_pcie_query(", ".join([cells[0], *cells[2:6]])) == {0: PcieLink(5, 5, 16, 16)}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0, 4, 4, 16, 16\n1, 1, 4, 4, 16\n", {0: PcieLink(4, 4, 16, 16), 1: PcieLink(1, 4, 4, 16)}),
        ("index, pcie.link.gen.current, pcie.link.gen.max, pcie.link.width.current, pcie.link.width.max\n0, 3, 3, 1, 1\n",
         {0: PcieLink(3, 3, 1, 1)}),
        ("", {}),
    ],
)
def test_pcie_query(text, expected):
    assert parse_pcie_query(text) == expected


def test_pcie_query_rejects_garbage():
    with pytest.raises(TopologyParseError, match="not 5 integers"):
        parse_pcie_query("0, [N/A], 4, 16, 16\n")


@pytest.mark.parametrize(
    "cmdline, sysfs, active, passthrough, translating",
    [
        ("BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet", [], False, False, False),
        ("root=/dev/sda1 intel_iommu=on", ["dmar0", "dmar1"], True, False, True),
        ("root=/dev/sda1 intel_iommu=on iommu=pt", ["dmar0"], True, True, False),
        ("root=/dev/nvme0n1p2 amd_iommu=on", ["ivhd0"], True, False, True),
        ("amd_iommu=off", ["ivhd0"], False, False, False),
        ("iommu.passthrough=1", ["ivhd0"], True, True, False),
        ("quiet", ["ivhd0"], True, False, True),  # on by default (AMD, newer Intel kernels)
    ],
)
def test_iommu(cmdline, sysfs, active, passthrough, translating):
    state = parse_iommu(cmdline, sysfs)
    assert (state.active, state.passthrough, state.translating) == (active, passthrough, translating)


@pytest.mark.parametrize(
    "cmdline, types, translating",
    [
        ("quiet", ["identity", "identity"], False),  # kernel built with passthrough as default
        ("iommu=pt", ["identity", "DMA"], True),  # a group the kernel still translates
        ("intel_iommu=on", ["DMA-FQ"], True),
    ],
)
def test_iommu_group_types_win_over_the_command_line(cmdline, types, translating):
    assert parse_iommu(cmdline, ["dmar0"], types).translating is translating


@pytest.mark.parametrize(
    "address, normal",
    [("00000000:0A:00.0", "0000:0a:00.0"), ("0a:00.0", "0000:0a:00.0"), ("0001:0a:00.0", "0001:0a:00.0")],
)
def test_normalize_bdf(address, normal):
    assert normalize_bdf(address) == normal


SWITCH = "/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0"  # root port, then the switch's upstream port


def test_pci_paths_and_the_bridges_between_two_gpus():
    paths = parse_pci_paths(f"0 {SWITCH}/0000:02:01.0/0000:03:00.0\n1 {SWITCH}/0000:02:08.0/0000:04:00.0\n"
                            "2 /sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0\n")
    assert bridges_between(paths[0], paths[1]) == ("0000:02:01.0", "0000:02:08.0")  # the switch's two downstream ports
    assert bridges_between(paths[0], paths[2]) == ("0000:00:01.1", "0000:01:00.0", "0000:02:01.0", "0000:40:01.1")


def test_pci_path_of_a_missing_device_is_refused():
    with pytest.raises(TopologyParseError, match="expected 'INDEX /sys/devices"):
        parse_pci_paths("0 /sys/bus/pci/devices/0000:03:00.0\n")


def test_acs_public_lspci():
    bridges = parse_acs(load("plx-acs-lspci-vvv.txt"))
    assert [(b.address, b.redirects) for b in bridges] == [("0000:02:01.0", True), ("0000:02:08.0", False)]
    assert bridges[0].flags["SrcValid"] and not bridges[0].flags["TransBlk"]


# ---------------------------------------------------------------- decisions


def matrix(n: int, link: str) -> TopoMatrix:
    return TopoMatrix(tuple(range(n)), {(a, b): link for a in range(n) for b in range(a + 1, n)})


def p2p(n: int, status: str) -> dict:
    return {(a, b): status for a in range(n) for b in range(n) if a != b}


X16_G4 = PcieLink(4, 4, 16, 16)
NO_ACS = (AcsBridge("0000:00:01.1", {"ReqRedir": False, "CmpltRedir": False}),)
ACS_ON = (AcsBridge("0000:02:01.0", {"ReqRedir": True, "CmpltRedir": True}),)
PATH = ("0000:00:01.1", "0000:01:00.0")
IOMMU_PT = IommuState(True, True, ("amd_iommu=on", "iommu=pt"))
IOMMU_TRANSLATE = IommuState(True, False, ("intel_iommu=on",))


def rig(n=2, link="PIX", status="OK", pcie=None, acs=NO_ACS, iommu=IOMMU_PT, windows=False) -> RigTopology:
    return RigTopology(matrix(n, link), pcie or {g: X16_G4 for g in range(n)}, p2p(n, status), iommu, acs, windows)


CASES = {
    # name: (rig, gpus, tensor, pipeline, override) -> (errors, warnings (substrings), vllm_args, worst link)
    "nvlink pair": (rig(link="NV4", acs=ACS_ON, iommu=IOMMU_TRANSLATE), [0, 1], 2, 1, None, [], [], [], "NV4"),
    "p2p over a PCIe switch": (rig(link="PIX"), [0, 1], 2, 1, None, [], [], [], "PIX"),
    "no p2p across sockets": (rig(link="SYS", status="NS"), [0, 1], 2, 1, None, [], ["P2P not usable (GPU0-GPU1 NS over SYS)"],
                              ["--disable-custom-all-reduce"], "SYS"),
    "chipset not supported": (rig(link="PHB", status="CNS"), [0, 1], 1, 2, None, [], ["CNS over PHB"], ["--disable-custom-all-reduce"], "PHB"),
    "acs redirect on": (rig(acs=ACS_ON), [0, 1], 2, 1, None, ["ACS redirects peer requests on 0000:02:01.0", "turn ACS off"], [], [], "PIX"),
    "acs on, on the path between the gpus": (replace(rig(acs=ACS_ON), pci_paths={0: (*PATH, "0000:02:01.0", "0000:03:00.0"), 1: (*PATH, "0000:02:08.0", "0000:04:00.0")}),
                                             [0, 1], 2, 1, None, ["ACS redirects peer requests on 0000:02:01.0"], [], [], "PIX"),
    "acs on, off the path between the gpus": (replace(rig(acs=ACS_ON), pci_paths={0: (*PATH, "0000:02:09.0", "0000:03:00.0"), 1: (*PATH, "0000:02:08.0", "0000:04:00.0")}),
                                              [0, 1], 2, 1, None, [], [], [], "PIX"),
    "acs on, overridden": (rig(acs=ACS_ON), [0, 1], 2, 1, ALLOW_RISKY_P2P, [], ["allowed by topology_override"], [], "PIX"),
    "acs on but p2p already off": (rig(status="NS", acs=ACS_ON), [0, 1], 2, 1, None, [], ["P2P not usable"], ["--disable-custom-all-reduce"], "PIX"),
    "iommu translating": (rig(link="PHB", iommu=IOMMU_TRANSLATE), [0, 1], 2, 1, None, ["IOMMU translates DMA (intel_iommu=on", "iommu=pt"], [], [], "PHB"),
    "x4 riser": (rig(pcie={0: X16_G4, 1: PcieLink(4, 4, 4, 4)}), [0, 1], 2, 1, None, [],
                 ["GPU1 on PCIe gen4 x4 (7.9 GB/s) is below half of GPU0 on PCIe gen4 x16 (31.5 GB/s)"], [], "PIX"),
    "x1 riser, 4 cards": (rig(n=4, link="PXB", pcie={0: X16_G4, 1: X16_G4, 2: X16_G4, 3: PcieLink(3, 3, 1, 1)}), [0, 1, 2, 3], 4, 1, None, [],
                          ["GPU3 on PCIe gen3 x1 (1.0 GB/s)"], [], "PXB"),
    "mixed generations": (rig(pcie={0: PcieLink(4, 4, 16, 16), 1: PcieLink(1, 2, 16, 16)}), [0, 1], 2, 1, None, [],
                          ["GPU1 on PCIe gen2 x16 (8.0 GB/s) is below half"], [], "PIX"),
    "gen drop at idle is not a warning": (rig(pcie={0: PcieLink(1, 4, 16, 16), 1: X16_G4}), [0, 1], 2, 1, None, [], [], [], "PIX"),
    "link trained narrower": (rig(pcie={0: PcieLink(4, 4, 8, 16), 1: X16_G4}), [0, 1], 2, 1, None, [], ["GPU0's link trained at x8 of x16"], [], "PIX"),
    "wsl2": (rig(link="PHB", windows=True, acs=None, iommu=None), [0, 1], 2, 1, None, [], ["microsoft/WSL#12467", "PCIe ACS not read"], [], "PHB"),
    "one gpu": (rig(acs=ACS_ON, iommu=IOMMU_TRANSLATE), [0], 1, 1, None, [], [], [], None),
    "data parallel only": (rig(status="NS"), [0, 1], 1, 1, None, [], [], [], None),
    "worst link of the group": (RigTopology(TopoMatrix((0, 1, 2), {(0, 1): "NV4", (0, 2): "SYS", (1, 2): "SYS"}), {g: X16_G4 for g in range(3)},
                                            {**p2p(3, "OK"), (0, 2): "NS", (2, 0): "NS"}, IOMMU_PT, NO_ACS), [0, 1, 2], 1, 3, None,
                                [], ["GPU0-GPU2 NS over SYS"], ["--disable-custom-all-reduce"], "SYS"),
    "gpu not in matrix": (rig(), [0, 5], 2, 1, None, ["GPU 5 not in nvidia-smi topo -m"], [], [], None),
}


@pytest.mark.parametrize("name", CASES)
def test_decide(name):
    topo, gpus, tensor, pipeline, override, errors, warnings, args, worst = CASES[name]
    verdict = decide(topo, "m", gpus, tensor, pipeline, override)
    for text in errors:
        assert any(text in e for e in verdict.errors), (text, verdict.errors)
    if not errors:
        assert verdict.errors == []
    for text in warnings:
        assert any(text in w for w in verdict.warnings), (text, verdict.warnings)
    if not warnings:
        assert verdict.warnings == []
    assert verdict.vllm_args == args
    assert verdict.env == ({"NCCL_P2P_DISABLE": "1"} if args else {})
    assert verdict.worst_link == worst


def test_decide_on_public_capture_nvlink_8x():
    topo = RigTopology(parse_topo_matrix(load("h100-8x-nv18-topo-m.txt")), {g: PcieLink(5, 5, 16, 16) for g in range(8)}, p2p(8, "OK"))
    verdict = decide(topo, "big", list(range(8)), 8, 1)
    assert verdict.errors == [] and verdict.vllm_args == []
    assert verdict.warnings == []  # over NVLink, ACS and the IOMMU are not on the path: not read, not needed
    assert len(verdict.pairs) == 28 and verdict.worst_link == "NV18"


def test_decide_on_public_capture_2x5090_gns():
    topo = RigTopology(parse_topo_matrix(load("2x5090-phb-topo-m.txt")), parse_pcie_query("0, 5, 5, 16, 16\n1, 5, 5, 8, 8\n"),
                       parse_p2p_matrix(load("2x5090-p2p-r.txt")))
    verdict = decide(topo, "qwen", [0, 1], 2, 1)
    assert verdict.vllm_args == ["--disable-custom-all-reduce"] and verdict.env == {"NCCL_P2P_DISABLE": "1"}
    assert verdict.table() == (
        "pair       link  P2P  PCIe GB/s\n"
        "GPU0-GPU1  PHB   GNS  31.5"
    )


def test_p2p_not_read_is_a_warning_and_sets_nothing():
    topo = RigTopology(matrix(2, "PIX"), {0: X16_G4, 1: X16_G4})
    verdict = decide(topo, "m", [0, 1], 2, 1)
    assert verdict.vllm_args == [] and verdict.errors == []
    assert "P2P status not read" in verdict.warnings[0]
    assert verdict.table().splitlines()[1].split() == ["GPU0-GPU1", "PIX", "?", "31.5"]


def test_table_without_pcie_says_unknown_not_nvlink():
    topo = RigTopology(TopoMatrix((0, 1, 2), {(0, 1): "NV4", (0, 2): "SYS", (1, 2): "SYS"}), {}, p2p(3, "OK"), IOMMU_PT, NO_ACS)
    rows = [line.split() for line in decide(topo, "m", [0, 1, 2], 3, 1).table().splitlines()[1:]]
    assert rows == [["GPU0-GPU1", "NV4", "OK", "NVLink"], ["GPU0-GPU2", "SYS", "OK", "?"], ["GPU1-GPU2", "SYS", "OK", "?"]]


@pytest.mark.parametrize("links", [["SYS", "NV4", "PIX", "NV12", "PHB", "NODE", "PXB"]])
def test_link_rank_orders_best_first(links):
    assert sorted(links, key=link_rank) == ["NV12", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]


@pytest.mark.parametrize("link, gbps", [(PcieLink(5, 5, 16, 16), 63.0), (PcieLink(4, 4, 4, 4), 7.9), (PcieLink(1, 1, 1, 1), 0.25), (PcieLink(3, 3, 16, 16), 15.8), (PcieLink(6, 6, 16, 16), 121.0)])
def test_pcie_bandwidth(link, gbps):
    assert pcie_gbps(link) == pytest.approx(gbps, abs=0.05)


# ---------------------------------------------------------------- the fact's output


def test_report_real_h200_fact_output():
    """The fact's own command, run as root on the one-H200 machine (tests/data/topology/h200-fact-output.txt)."""
    from rigkit.topology.report import read_report

    topo, notes = read_report(load("h200-fact-output.txt").splitlines())
    assert topo.matrix.gpus == (0,) and topo.pcie == {0: PcieLink(5, 5, 16, 16)} and topo.p2p == {}
    assert topo.iommu == IommuState(False, False, ()) and topo.acs is None
    assert topo.pci_paths == {0: ("0000:00:06.0",)}  # nvidia-smi's 00000000:00:06.0, resolved in sysfs
    assert notes == ["lspci: exited 127: lspci not installed (pciutils)"]
    assert decide(topo, "one-gpu", [0], 1, 1).errors == []  # parsed, nothing to decide


def test_p2p_matrix_real_h200():
    assert parse_p2p_matrix(load("h200-p2p-r.txt")) == {}


@pytest.mark.parametrize(
    "lines, notes",
    [
        (["@@rigkit topo-m", "bash: nvidia-smi: command not found", "@@rigkit-rc 127"], ["topo-m: exited 127: bash: nvidia-smi: command not found"]),
        (["@@rigkit topo-m", "@@rigkit-rc 124"], ["topo-m: exited 124 (timed out)"]),
        ([], ["topo-m: not in the fact's output"]),
    ],
)
def test_report_without_a_matrix_is_no_topology(lines, notes):
    from rigkit.topology.report import read_report

    assert read_report(lines) == (None, notes)


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize("uid, acs_read", [("0", True), ("1000", False)])
def test_fact_command_through_a_real_shell(tmp_path, uid, acs_read):
    """GpuTopology's command run by /bin/sh with stand-in nvidia-smi/lspci/id printing the public
    captures: the sections reach read_report intact, and ACS counts as read only as root."""
    import subprocess

    from rigkit.topology.facts import GpuTopology
    from rigkit.topology.report import read_report

    for name in ("2x5090-phb-topo-m.txt", "2x5090-p2p-r.txt", "plx-acs-lspci-vvv.txt"):
        (tmp_path / name).write_text(load(name))
    _stub(tmp_path, "nvidia-smi", f'case "$2$1" in -m*) cat {tmp_path}/2x5090-phb-topo-m.txt;; -p2p*) cat {tmp_path}/2x5090-p2p-r.txt;; '
                                  '*pci.bus_id*) printf "0, 00000000:03:00.0\\n1, 00000000:0A:00.0\\n";; '
                                  '*) printf "0, 1, 5, 16, 16\\n1, 1, 5, 4, 4\\n";; esac\n')
    _stub(tmp_path, "readlink", 'case "$2" in */0000:03:00.0) echo /sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:03:00.0;; '
                                '*/0000:0a:00.0) echo /sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:08.0/0000:0a:00.0;; *) echo "$2";; esac\n')
    _stub(tmp_path, "lspci", f"cat {tmp_path}/plx-acs-lspci-vvv.txt\n")
    _stub(tmp_path, "id", f"echo {uid}\n")
    fact = GpuTopology()
    run = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    topo, notes = read_report(fact.process(run.stdout.splitlines()))
    assert topo.matrix.link(0, 1) == "PHB" and topo.p2p[(0, 1)] == "GNS"
    assert topo.pcie[1] == PcieLink(1, 5, 4, 4)
    assert topo.pci_paths[1] == ("0000:00:01.1", "0000:01:00.0", "0000:02:08.0", "0000:0a:00.0")  # bus id lower-cased, domain cut to 4
    assert (topo.acs is not None) is acs_read
    assert notes == ([] if acs_read else ["lspci: not run as root, so it hides ACSCtl: PCIe ACS not read"])
    verdict = decide(topo, "m", [0, 1], 2, 1)
    assert verdict.vllm_args == ["--disable-custom-all-reduce"]
    assert any("GPU1 on PCIe gen5 x4" in w for w in verdict.warnings)


def test_pure_modules_import_no_pyinfra():
    import ast

    for module in ("parse", "decide", "report", "__init__"):
        tree = ast.parse((Path(__file__).parent.parent / "rigkit" / "topology" / f"{module}.py").read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n.split(".")[0] == "pyinfra" for n in names), module


# ---------------------------------------------------------------- rigkit check --topology

REPO = Path(__file__).parent.parent


def fact_output(topo_m: str, p2p_r: str, pcie: str, uid="0", cmdline="quiet iommu=pt", lspci="") -> str:
    sections = {"uid": uid, "topo-m": topo_m, "p2p-r": p2p_r, "pcie": pcie, "cmdline": cmdline,
                "iommu": "ivhd0", "iommu-types": "", "lspci": lspci}
    return "".join(f"@@rigkit {k}\n{v.rstrip()}\n@@rigkit-rc 0\n" for k, v in sections.items())


def test_check_prints_the_topology_of_the_windows_tp2_model(tmp_path, capsys):
    """inventory/rigs/win-2x4090-48gb.yml serves qwen3-27b-awq with tensor 2 on GPUs 0 and 1."""
    from rigkit.cli import main

    facts = tmp_path / "facts.txt"
    facts.write_text(fact_output(load("2x5090-phb-topo-m.txt"), load("2x5090-p2p-r.txt"), "0, 4, 4, 16, 16\n1, 4, 4, 16, 16\n"))
    assert main(["check", str(REPO / "inventory/rigs/win-2x4090-48gb.yml"), "--topology", str(facts)]) == 0
    out = capsys.readouterr().out
    assert "qwen3-27b-awq: GPUs 0, 1, worst link PHB" in out
    assert "  GPU0-GPU1  PHB   GNS  31.5" in out
    assert "  vLLM: --disable-custom-all-reduce NCCL_P2P_DISABLE=1" in out
    assert "microsoft/WSL#12467" in out


def test_check_fails_on_p2p_with_acs_redirect(tmp_path, capsys):
    from rigkit.cli import main

    p2p_ok = " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n"
    facts = tmp_path / "facts.txt"
    facts.write_text(fact_output(load("2x5090-phb-topo-m.txt"), p2p_ok, "0, 4, 4, 16, 16\n1, 4, 4, 16, 16\n",
                                 lspci=load("plx-acs-lspci-vvv.txt")))
    assert main(["check", str(REPO / "inventory/rigs/win-2x4090-48gb.yml"), "--topology", str(facts)]) == 2
    out = capsys.readouterr().out
    assert "error: qwen3-27b-awq: P2P is reported OK over PCIe (GPU0-GPU1 (PHB)) but PCIe ACS redirects peer requests on 0000:02:01.0" in out


# ---------------------------------------------------------------- topology_override in the rig file

WIN_RIG = REPO / "inventory/rigs/win-2x4090-48gb.yml"


def test_topology_override_value_matches_the_decision_constant():
    import typing

    from rigkit.config.schema import RigSpec

    assert typing.get_args(RigSpec.model_fields["topology_override"].annotation)[0] == typing.Literal[ALLOW_RISKY_P2P]


def test_topology_override_misspelt_names_the_allowed_value(tmp_path):
    from rigkit.config.errors import ConfigError
    from rigkit.config.loader import load_rig

    rig = tmp_path / "rigs" / "r.yml"
    rig.parent.mkdir()
    rig.write_text(WIN_RIG.read_text() + "topology_override: allow-p2p\n")
    with pytest.raises(ConfigError) as caught:
        load_rig(rig, REPO / "inventory/models")
    [problem] = [str(p) for p in caught.value.problems]
    assert "topology_override: 'allow-p2p': Input should be 'allow-risky-p2p'" in problem


def test_topology_override_in_the_rig_file_turns_the_acs_error_into_a_warning(tmp_path, capsys):
    import shutil

    from rigkit.cli import main

    rig = tmp_path / "rigs" / "r.yml"
    rig.parent.mkdir()
    rig.write_text(WIN_RIG.read_text() + "topology_override: allow-risky-p2p\n")
    shutil.copytree(REPO / "inventory/models", tmp_path / "models")
    facts = tmp_path / "facts.txt"
    facts.write_text(fact_output(load("2x5090-phb-topo-m.txt"), " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n",
                                 "0, 4, 4, 16, 16\n1, 4, 4, 16, 16\n", lspci=load("plx-acs-lspci-vvv.txt")))
    assert main(["check", str(rig), "--topology", str(facts)]) == 0
    out = capsys.readouterr().out
    assert "warning: qwen3-27b-awq: P2P is reported OK over PCIe" in out and "[allowed by topology_override: allow-risky-p2p]" in out
    assert "error:" not in out
