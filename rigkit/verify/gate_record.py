"""The rollout gate's records on the control machine: which result is the model's proven one, the
workload the candidate is measured with, the gate document (`kind: "gate"`) and the one-screen reason
a refused rollout fails with. No pyinfra here (roles/verify.py measures and acts).

The proven result is the newest document in the model's results folder that is either a gate that
promoted its candidate or a verification that passed (a verification measures the config in service,
which is the proven one: `rigkit verify`, or the rollback's verification after a refusal); chosen by
the time inside each document (rigkit.verify.history), never by file name.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path

from rigkit.rigside.stack import FAILED_COMPOSE_FILE
from rigkit.verify.gate import Verdict, allowance
from rigkit.verify.history import Warn, document_time, read_history, stderr_warning, write_document

GATE_RUNS = 3  # rigkit.verify.gate.MIN_RUNS: noise is judged from the runs themselves
DEFAULT_WORKLOAD = {"prompt_tokens": 2048, "output_tokens": 256, "concurrency": []}  # verification's


def proven_history(folder: Path, warn: Warn | None = stderr_warning) -> list[dict]:
    """Every proven result of the model (see the module's docstring), newest first; `warn` gets a line for
    each gate file skipped as unreadable (the verification reader names the same files)."""
    found = []
    for kind in ("gate", "verification"):
        history = read_history(folder, kind)
        for text in history.warnings if (warn and kind == "gate") else ():
            warn(text)
        found += [d for d in history.documents if (d.get("promoted") if kind == "gate" else d.get("passed"))]
    found.sort(key=document_time, reverse=True)
    return found


def proven_baseline(folder: Path, warn: Warn | None = stderr_warning) -> dict | None:
    """The model's last proven result, or None: no proven result yet."""
    history = proven_history(folder, warn)
    return history[0] if history else None


def anchor_result(history: list[dict]) -> dict | None:
    """Of a model's proven history (proven_history), the fixed point small slowdowns are measured from: the
    proven result that last set the line (a gate that established the proven result, or promoted a config
    accepted slower on purpose), else the first proven result on record. Each rollout is compared with the
    last proven result too; this one catches 100 -> 98 -> 95 -> 93 -> 85 tok/s, every step under the
    allowance from the one before. Not the best of the recent ones: a maximum of noisy means is biased high,
    and would refuse an equal config."""
    reset = next((d for d in history if d.get("establishes") or d.get("accepted_slower")), None)
    return reset or (history[-1] if history else None)


def workload_of(baseline: dict | None) -> dict:
    """The proven result's workload: prompt and output tokens and the concurrency levels beyond 1."""
    if not baseline:
        return dict(DEFAULT_WORKLOAD)
    workload = baseline.get("workload") or {}
    made_with = baseline.get("provenance") or {}
    levels = [int(c) for c in (made_with.get("concurrency") or []) if isinstance(c, int) and c > 1]
    prompt = workload.get("prompt_tokens") or made_with.get("prompt_tokens")
    output = workload.get("output_tokens") or made_with.get("output_tokens")
    if not isinstance(prompt, int) or not isinstance(output, int) or prompt < 1 or output < 1:
        return dict(DEFAULT_WORKLOAD)
    return {"prompt_tokens": prompt, "output_tokens": output, "concurrency": levels}


def _stats(values: list) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "cv": None, "runs": []}
    return {"mean": statistics.fmean(values), "cv": allowance(values)[1], "runs": values}


def run_summary(documents: list[dict]) -> dict:
    """Mean, CV and each run of decode, TTFT and acceptance over verification documents of one config, with
    the checks any run failed, what the runs said of drafting and every warning they gave."""
    return {
        "decode_tok_s": _stats([(d.get("figures") or {}).get("decode_tok_s") for d in documents]),
        "ttft_s": _stats([(d.get("figures") or {}).get("ttft_s") for d in documents]),
        "acceptance_length": _stats([(d.get("bench") or {}).get("acceptance_length") for d in documents]),
        "repeat_ttft_s": _stats([(d.get("bench") or {}).get("repeat_ttft_s") for d in documents]),
        "failed_checks": sorted({c["name"] for d in documents for c in d.get("checks", []) if not c.get("passed")}),
        # What each run said of drafting and what it warned, so a refused config's runs can be read afterwards.
        "acceptance_status": sorted({(d.get("bench") or {}).get("acceptance_status") or "?" for d in documents}),
        "warnings": sorted({w for d in documents for w in (d.get("bench") or {}).get("warnings") or []}),
    }


def gate_document(rig: str, model: str, baseline: dict | None, workload: dict, candidates: list[dict],
                  verdict: Verdict, promoted: bool, accepted_slower: bool, candidate_sha: str,
                  rollback: dict | None = None, now: datetime | None = None) -> dict:
    """The gate's result. `figures`, `bench.acceptance_length`, `gpus` and `provenance` are the
    candidate's (means over its runs), so a promoting gate is itself the next rollout's proven result."""
    summary = run_summary(candidates)
    last = candidates[-1] if candidates else {}
    return {
        "kind": "gate",
        "rig": rig,
        "model": model,
        "time": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "promoted": promoted,
        "establishes": verdict.establishes,
        "accepted_slower": accepted_slower,
        "waived": list(verdict.waived),
        "candidate_sha256": candidate_sha,
        "workload": {"prompt_tokens": workload["prompt_tokens"], "output_tokens": workload["output_tokens"]},
        "baseline": None if baseline is None else {
            "kind": baseline.get("kind") or "verification", "time": baseline.get("time"),
            "decode_tok_s": (baseline.get("figures") or {}).get("decode_tok_s"),
            "ttft_s": (baseline.get("figures") or {}).get("ttft_s"),
            "acceptance_length": (baseline.get("bench") or {}).get("acceptance_length")},
        "figures": {"decode_tok_s": summary["decode_tok_s"]["mean"], "ttft_s": summary["ttft_s"]["mean"]},
        "bench": {"acceptance_length": summary["acceptance_length"]["mean"],
                  "repeat_ttft_s": summary["repeat_ttft_s"]["mean"]},
        "runs": summary,
        "gpus": last.get("gpus", []),
        "provenance": {**(last.get("provenance") or {}), "accepted_slower": accepted_slower},
        "checks": [{"name": c.name, "passed": c.passed or c.name in verdict.waived, "message": c.message}
                   for c in verdict.checks],
        "reason": verdict.reason,
        "rollback": rollback,
        "passed": promoted,
    }


def save_gate(folder: Path, document: dict) -> Path:
    stamp = document["time"].replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
    return write_document(Path(folder) / f"gate-{stamp}.json", document)


def summary_line(summary: dict) -> str:
    """Decode (with its CV), TTFT and acceptance length of a run_summary, in one line."""
    decode, ttft = summary["decode_tok_s"], summary["ttft_s"]
    parts = []
    if decode["mean"] is not None:
        parts.append(f"decode {decode['mean']:.1f} tok/s (CV {decode['cv']:.1%})")
    if ttft["mean"] is not None:
        parts.append(f"TTFT {ttft['mean']:.3f} s")
    if summary["acceptance_length"]["mean"] is not None:
        parts.append(f"acceptance length {summary['acceptance_length']['mean']:.2f}")
    return ", ".join(parts) or "no figures"


def refusal_screen(model: str, document: dict, path: Path, stack_dir: str) -> str:
    """One screen: which checks refused the candidate, old and new figures, what became of the rollback.
    `stack_dir`: the model's stack folder on the rig, where rigkit-stack kept the refused config."""
    base = document["baseline"]
    lines = [f"rollout gate REFUSED {model}: {', '.join(c['name'] for c in document['checks'] if not c['passed'])}"]
    if base:
        old = [f"decode {base['decode_tok_s']:.1f} tok/s" if base.get("decode_tok_s") is not None else None,
               f"TTFT {base['ttft_s']:.3f} s" if base.get("ttft_s") is not None else None,
               f"acceptance length {base['acceptance_length']:.2f}" if base.get("acceptance_length") else None]
        lines.append(f"  proven ({base['kind']} of {base['time']}): {', '.join(o for o in old if o)}")
    else:
        lines.append("  proven: none yet (this rollout was to establish it)")
    lines.append(f"  candidate ({len(document['runs']['decode_tok_s']['runs'])} runs): {summary_line(document['runs'])}")
    lines += [f"  {line}" for line in document["reason"].splitlines()[1:]]
    rollback = document.get("rollback") or {}
    lines.append(f"  {rollback.get('said') or 'no rollback'}")
    lines.append(f"details: {path}; the refused config: {stack_dir}/{FAILED_COMPOSE_FILE}")
    lines.append(f"a slower config meant on purpose: rigkit deploy INVENTORY --accept-slower {model}")
    return "\n".join(lines)
