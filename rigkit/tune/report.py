"""A sweep's result for people and files: the table, the JSON document and the PNG."""

from __future__ import annotations

from pathlib import Path

from rigkit.tune.stats import Summary
from rigkit.tune.sweep import SweepResult


def _ci(s: Summary | None, digits: int = 2) -> str:
    if s is None:
        return "-"
    if s.sd is None:
        return f"{s.mean:.{digits}f} (n={s.n})"
    return f"{s.mean:.{digits}f} ±{s.half_width:.{digits}f} (n={s.n})"


def table_text(result: SweepResult, slots: int) -> str:
    lines = [f"{'setting':<44} {'decode tok/s (95% CI)':<24} {'prefill tok/s':<22} {'power W':<18} tok/s/W"]
    for row in result.table:
        per_w = f"{row.decode_tok_s_per_w:.3f}" if row.decode_tok_s_per_w else "-"
        lines.append(f"{row.cell.label():<44} {_ci(row.decode_tok_s):<24} {_ci(row.prefill_tok_s, 0):<22} "
                     f"{_ci(row.power_w, 1):<18} {per_w}")
    lines += [f"drift (controls): {d.describe(slots)}" for d in result.drift]
    for refusal in result.refused:
        lines.append(f"REFUSED before applying {refusal.cell.label()}: {'; '.join(refusal.reasons)}")
    for bad in result.not_in_effect:
        lines.append(f"NOT IN EFFECT, not measured as such: {bad.cell.label()}: {'; '.join(bad.reasons)}")
    for objective, choice in result.choices.items():
        tied = f" (tied: {', '.join(c.label() for c in choice.tied_with)})" if choice.tied_with else ""
        lines.append(f"{objective}: {choice.cell.label()}: {choice.reason}{tied}")
    return "\n".join(lines)


def _summary(s: Summary | None) -> dict | None:
    if s is None:
        return None
    finite = s.sd is not None
    return {"n": s.n, "mean": s.mean, "sd": s.sd, "low": s.low if finite else None, "high": s.high if finite else None}


def _cell(cell) -> dict:
    return {"power_limit_w": cell.power_limit_w, "clock_lock_mhz": cell.clock_lock_mhz,
            "mem_offset_mhz": cell.mem_offset_mhz, "core_offset_mhz": cell.core_offset_mhz}


def to_json(result: SweepResult, context: dict) -> dict:
    return {
        **context,
        "table": [{"cell": _cell(r.cell), "decode_tok_s": _summary(r.decode_tok_s), "prefill_tok_s": _summary(r.prefill_tok_s),
                   "response_time_s": _summary(r.response_time_s), "power_w": _summary(r.power_w),
                   "decode_tok_s_per_w": r.decode_tok_s_per_w} for r in result.table],
        "choices": {o: {"cell": _cell(c.cell), "reason": c.reason, "tied_with": [_cell(t) for t in c.tied_with]}
                    for o, c in result.choices.items()},
        "drift": [{"metric": d.metric, "controls": d.controls, "per_measurement": d.per_slot,
                   "half_width": d.per_slot_half_width, "level": d.level, "significant": d.significant}
                  for d in result.drift],
        "refused": [{"cell": _cell(r.cell), "reasons": list(r.reasons)} for r in result.refused],
        "not_in_effect": [{"cell": _cell(n.cell), "reasons": list(n.reasons)} for n in result.not_in_effect],
        "readings": [{"position": r.slot.position, "control": r.slot.control, "cell": _cell(r.slot.cell),
                      "decode_tok_s": r.figures.decode_tok_s if r.figures else None,
                      "prefill_tok_s": r.figures.prefill_tok_s if r.figures else None,
                      "power_w": r.figures.mean_power_w if r.figures else None, "problems": list(r.problems)}
                     for r in result.readings],
    }


def draw(path: Path, result: SweepResult, title: str) -> Path:
    """Decode and prefill tok/s and decode tok/s per measured watt against the setting, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    rows = result.table
    labels = [r.cell.label().replace(", ", "\n", 1) for r in rows]
    x = list(range(len(rows)))
    fig, (decode_ax, prefill_ax, eff_ax) = plt.subplots(3, 1, figsize=(max(8, len(rows) * 1.1), 9), sharex=True)
    for ax, metric, name in ((decode_ax, "decode_tok_s", "decode tok/s"), (prefill_ax, "prefill_tok_s", "prefill tok/s")):
        means = [getattr(r, metric).mean for r in rows]
        errors = [getattr(r, metric).half_width if getattr(r, metric).sd is not None else 0 for r in rows]
        ax.errorbar(x, means, yerr=errors, fmt="o-", capsize=4)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    eff_ax.plot(x, [r.decode_tok_s_per_w or float("nan") for r in rows], "s-", color="green")
    eff_ax.set_ylabel("decode tok/s per W\n(measured draw)")
    eff_ax.grid(alpha=0.3)
    eff_ax.set_xticks(x, labels, fontsize="small")
    for objective, choice in result.choices.items():
        if choice.cell in [r.cell for r in rows]:
            decode_ax.axvline(x[[r.cell for r in rows].index(choice.cell)], linestyle="--", alpha=0.4)
            decode_ax.annotate(objective, (x[[r.cell for r in rows].index(choice.cell)], decode_ax.get_ylim()[0]),
                               fontsize="small", rotation=90, va="bottom")
    decode_ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
