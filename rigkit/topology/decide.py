"""Decisions for one tensor/pipeline-parallel model from the rig's parsed topology. Pure.

For the GPUs a model uses: the link each pair crosses (the group's all-reduce is as slow as
its worst), the PCIe bandwidth at each end, whether P2P is usable, and what follows:
- P2P not usable -> vLLM gets `--disable-custom-all-reduce` and `NCCL_P2P_DISABLE=1`;
- P2P reported OK over PCIe while ACS redirects peer requests on a bridge, or while the IOMMU
  translates DMA (not passthrough) -> error: NCCL start-up hangs or the host resets
  (NVIDIA/nccl#2079, noonghunna/club-3090#1332); the fix is ACS off / `iommu=pt`, or the
  override `allow-risky-p2p` turns it into a warning;
- a GPU whose link is below half the group's fastest (x4/x1 riser, an older generation) -> warning;
- a Windows (WSL2) rig -> warning (microsoft/WSL#12467).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from rigkit.topology.parse import NVLINK, AcsBridge, IommuState, PcieLink, TopoMatrix, bridges_between

ALLOW_RISKY_P2P = "allow-risky-p2p"  # proposed rig-file value: `topology_override: allow-risky-p2p`
NO_P2P_ARGS = ("--disable-custom-all-reduce",)
NO_P2P_ENV = {"NCCL_P2P_DISABLE": "1"}

# Usable bandwidth per lane and direction, GB/s, after line encoding (8b/10b for gen 1-2,
# 128b/130b for gen 3-5, FLIT for gen 6): 2.5, 5, 8, 16, 32, 64 GT/s.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# Best first. NV# is ranked above all PCIe paths, more links first.
_PCIE_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
_PCIE_BRIDGED = {"PIX", "PXB", "PHB", "NODE", "SYS"}


def link_rank(link: str) -> tuple[int, int]:
    """Sort key, smaller is better: NV12 < NV4 < PIX < PXB < PHB < NODE < SYS."""
    m = NVLINK.match(link)
    return (0, -int(m.group(1))) if m else (_PCIE_RANK[link], 0)


def pcie_gbps(link: PcieLink) -> float:
    """What the slot and card can carry together (max gen x max width: nvidia-smi reports the
    GPU-and-system limit there; the current gen drops at idle to save power)."""
    return PCIE_GBPS_PER_LANE.get(link.gen_max, PCIE_GBPS_PER_LANE[max(PCIE_GBPS_PER_LANE)]) * link.width_max


@dataclass(frozen=True)
class RigTopology:
    """Everything read from one rig. p2p/iommu/acs are None where they could not be read."""

    matrix: TopoMatrix
    pcie: dict[int, PcieLink]
    p2p: dict[tuple[int, int], str] | None = None
    iommu: IommuState | None = None
    acs: tuple[AcsBridge, ...] | None = None
    windows: bool = False
    pci_paths: dict[int, tuple[str, ...]] | None = None  # GPU -> its PCI chain from the root port


@dataclass(frozen=True)
class PairRow:
    a: int
    b: int
    link: str
    p2p: str  # "OK", "NS", ..., "?" when not read
    gbps: float | None  # PCIe bandwidth of the slower end; None over NVLink or where not read


@dataclass
class Verdict:
    model: str
    gpus: tuple[int, ...]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vllm_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    pairs: list[PairRow] = field(default_factory=list)
    worst_link: str | None = None

    def table(self) -> str:
        return render_table(self.pairs)


def render_table(pairs: list[PairRow]) -> str:
    rows = [("pair", "link", "P2P", "PCIe GB/s")]
    for p in pairs:
        bw = "NVLink" if NVLINK.match(p.link) else "?" if p.gbps is None else f"{p.gbps:.1f}"
        rows.append((f"GPU{p.a}-GPU{p.b}", p.link, p.p2p, bw))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _pcie_text(index: int, link: PcieLink | None) -> str:
    if link is None:
        return f"GPU{index} (PCIe link not read)"
    return f"GPU{index} on PCIe gen{link.gen_max} x{link.width_max} ({pcie_gbps(link):.1f} GB/s)"


def _p2p_status(topo: RigTopology, a: int, b: int) -> str:
    if topo.p2p is None:
        return "?"
    there, back = topo.p2p.get((a, b), "?"), topo.p2p.get((b, a), "?")
    return there if there == back or there != "OK" else back


def decide(topo: RigTopology, model: str, gpus: list[int], tensor: int, pipeline: int, override: str | None = None) -> Verdict:
    """The verdict for `model` served on `gpus` with the catalog's parallel sizes."""
    verdict = Verdict(model, tuple(gpus))
    if tensor * pipeline <= 1 or len(gpus) <= 1:
        return verdict  # one GPU per engine: nothing crosses a link
    missing = [g for g in gpus if g not in topo.matrix.gpus]
    if missing:
        verdict.errors.append(
            f"{model}: GPU {', '.join(map(str, missing))} not in nvidia-smi topo -m "
            f"(the rig shows GPU {', '.join(map(str, topo.matrix.gpus))}): check the model's `gpus`"
        )
        return verdict

    for a, b in combinations(sorted(gpus), 2):
        link = topo.matrix.link(a, b)
        ends = [topo.pcie.get(a), topo.pcie.get(b)]
        gbps = None if NVLINK.match(link) or None in ends else min(pcie_gbps(e) for e in ends)
        verdict.pairs.append(PairRow(a, b, link, _p2p_status(topo, a, b), gbps))
    verdict.worst_link = max((p.link for p in verdict.pairs), key=link_rank)

    if topo.windows:
        verdict.warnings.append(
            f"{model}: tensor {tensor} x pipeline {pipeline} on a Windows rig: multi-GPU vLLM under WSL2 "
            "is still broken for many (microsoft/WSL#12467); expect NCCL to fail or hang at start-up, "
            "or serve one replica per GPU instead"
        )

    _p2p(topo, verdict, override)
    _slow_links(topo, verdict)
    return verdict


def _p2p(topo: RigTopology, verdict: Verdict, override: str | None) -> None:
    model = verdict.model
    if topo.p2p is None:
        verdict.warnings.append(f"{model}: P2P status not read (nvidia-smi topo -p2p r); vLLM will probe it at start")
        return
    unusable = [p for p in verdict.pairs if p.p2p != "OK"]
    if unusable:
        pairs = ", ".join(f"GPU{p.a}-GPU{p.b} {p.p2p} over {p.link}" for p in unusable)
        verdict.vllm_args.extend(NO_P2P_ARGS)
        verdict.env.update(NO_P2P_ENV)
        verdict.warnings.append(
            f"{model}: P2P not usable ({pairs}); rigkit sets {' '.join(NO_P2P_ARGS)} and "
            f"NCCL_P2P_DISABLE=1 so all-reduce goes through host memory instead of hanging or failing"
        )
        return
    over_pcie = [p for p in verdict.pairs if p.link in _PCIE_BRIDGED]
    if not over_pcie:
        return  # P2P over NVLink: ACS and the IOMMU are not on its path
    risks = []
    redirecting = _redirecting_bridges(topo, over_pcie)
    if redirecting:
        risks.append(
            f"PCIe ACS redirects peer requests on {', '.join(redirecting)} (ACSCtl ReqRedir+/CmpltRedir+): "
            "NCCL start-up hangs (NVIDIA/nccl#2079). Fix: turn ACS off in the BIOS "
            "(or `setpci -s BRIDGE ECAP_ACS+0x6.w=0000` on those bridges at every boot)"
        )
    if topo.iommu is not None and topo.iommu.translating:
        flags = " ".join(topo.iommu.cmdline_flags) or "no iommu flags"
        risks.append(
            f"the IOMMU translates DMA ({flags} on the kernel command line): P2P all-reduce then hangs or "
            "resets the host (noonghunna/club-3090#1332). Fix: add `iommu=pt` to the kernel command line "
            "(GRUB_CMDLINE_LINUX) and reboot, or turn the IOMMU off in the BIOS"
        )
    if topo.acs is None:
        verdict.warnings.append(f"{model}: PCIe ACS not read (lspci -vvv as root); a redirecting bridge would hang NCCL")
    if not risks:
        return
    pairs = ", ".join(f"GPU{p.a}-GPU{p.b} ({p.link})" for p in over_pcie)
    for risk in risks:
        text = f"{model}: P2P is reported OK over PCIe ({pairs}) but {risk}"
        if override == ALLOW_RISKY_P2P:
            verdict.warnings.append(f"{text} [allowed by topology_override: {ALLOW_RISKY_P2P}]")
        else:
            verdict.errors.append(
                f"{text}; or set `topology_override: {ALLOW_RISKY_P2P}` in the rig file if you have proven it works"
            )


def _redirecting_bridges(topo: RigTopology, pairs: list[PairRow]) -> list[str]:
    """The redirecting bridges on the paths between the pairs' GPUs where both GPUs' PCI
    chains were read; every redirecting bridge of the rig where they were not."""
    redirecting = {b.address for b in (topo.acs or ()) if b.redirects}
    if not redirecting:
        return []
    paths = topo.pci_paths or {}
    on_paths: set[str] = set()
    for p in pairs:
        if p.a not in paths or p.b not in paths:
            return sorted(redirecting)
        on_paths.update(bridges_between(paths[p.a], paths[p.b]))
    return sorted(redirecting & on_paths)


def _slow_links(topo: RigTopology, verdict: Verdict) -> None:
    if verdict.worst_link is not None and NVLINK.match(verdict.worst_link):
        return  # all pairs over NVLink: PCIe does not carry the all-reduce
    links = {g: topo.pcie.get(g) for g in verdict.gpus}
    unread = [g for g, link in links.items() if link is None]
    if unread:
        verdict.warnings.append(f"{verdict.model}: PCIe link of GPU {', '.join(map(str, unread))} not read")
    known = {g: link for g, link in links.items() if link is not None}
    if not known:
        return
    fastest = max(pcie_gbps(link) for link in known.values())
    best = next(g for g, link in known.items() if pcie_gbps(link) == fastest)
    for g, link in sorted(known.items()):
        if pcie_gbps(link) < fastest / 2:
            verdict.warnings.append(
                f"{verdict.model}: {_pcie_text(g, link)} is below half of {_pcie_text(best, known[best])}; "
                "every all-reduce of the group waits for it (a riser or slot at x4/x1, or an older generation)"
            )
        if link.width_current < link.width_max:
            verdict.warnings.append(
                f"{verdict.model}: GPU{g}'s link trained at x{link.width_current} of x{link.width_max}; nvidia-smi "
                "says the width may drop while a GPU is idle: if it stays there under load, reseat the card or check the riser"
            )
