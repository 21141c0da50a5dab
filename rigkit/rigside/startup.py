"""Where a start of vLLM spent its time: a table of phases read from the container's own log, each line
stamped by Docker (`docker logs --timestamps`, UTC, to the nanosecond; vLLM's own stamps have whole seconds
and the container's time zone), from the container's start to rigkit's first answered completion.

Each phase ends at a line vLLM logs (MARKS); a phase whose line a version or platform does not log is
folded into the next one found. Beside the table: vLLM's own figures (what its log says a step took), the
longest silences (no line at all, with the last line before each), and what the compile cache did (hit,
miss and why, or no compile at all). Standard library only: it runs on rigs (rigkit-stack, the status
probe) and on the control machine (tests, bench/startup.py). docs/serving.md, "Time to ready".
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

# (phase, a line that ends it), as vLLM 0.32 logs them (its CPU build and, for the GPU-only steps, its
# CUDA build's lines in the same source: "torch.compile took ... in total", "Graph capturing finished").
MARKS = (
    ("container start to its first line", re.compile(r".")),
    ("imports, to vLLM's banner", re.compile(r"version \d+\.\d+|non-default args")),
    ("API server, to the engine process", re.compile(r"Initializing a V1 LLM engine")),
    ("engine and worker processes", re.compile(r"Starting to load model")),
    ("weights load", re.compile(r"Loading weights took|Model loading took")),
    ("compile", re.compile(r"Warming up done|torch\.compile (?:takes|took) [\d.]+ s in total")),
    ("CUDA graph capture", re.compile(r"Graph capturing finished")),
    ("memory profiling and KV cache", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("API up", re.compile(r"Application startup complete")),
)
FIRST_TOKEN = "first token (rigkit's readiness completion)"
# Between the API's line and the probe that got the first token: rigkit's poll had not asked yet (its
# pauses grow to 2 s). Counted in the total, never the slowest phase: it is not the engine's time.
POLL_WAIT = "waiting for rigkit's next readiness probe"
# What vLLM says a step took, in its own words.
OWN_FIGURES = (
    ("weights load", re.compile(r"Loading weights took ([\d.]+) s")),
    ("torch.compile", re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total")),
    ("CUDA graph capture", re.compile(r"Graph capturing finished in ([\d.]+) sec")),
    ("init engine (profile, KV cache, warm-up)", re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")),
)
CACHE_HIT = re.compile(r"Directly load (?:AOT compilation|the compiled graph)")
CACHE_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure from \S+, reason: (.*)")
COMPILED = re.compile(r"saved AOT compiled function to |Compiling a graph for|torch\.compile (?:takes|took)")
CACHE_KEY = re.compile(r"torch_compile_cache/(?:torch_aot_compile/)?([0-9a-f]{10,})")
# Every key folder a start named, relative to vLLM's cache root: the graphs' and the AOT function's have hashes of
# their own (the weights relay ships them all: rigkit.weights.compile_cache).
CACHE_PATHS = re.compile(r"torch_compile_cache/(?:torch_aot_compile/)?[0-9a-f]{10,128}(?![0-9a-f])")
SILENCE_S = 2.0  # a gap between two lines at least this long is listed
SILENCES_KEPT = 3
MAX_LINES = 20000  # a start logs a few hundred lines; a log flooded with more is read this far


def stamp(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC stamp as Docker writes it (nanoseconds cut to micro)."""
    text = text.strip().rstrip("Z")
    if "." in text:
        whole, fraction = text.split(".", 1)
        text = f"{whole}.{fraction[:6]}"
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def read_lines(log: str, started_at: float) -> list[tuple[float, str]]:
    """(time, text) of each `docker logs --timestamps` line written at or after `started_at` (this start's)."""
    lines = []
    for raw in log.splitlines()[:MAX_LINES]:
        when, _, text = raw.partition(" ")
        try:
            at = stamp(when)
        except ValueError:
            continue
        if at >= started_at - 0.001 and text.strip():
            lines.append((at, text))
    return sorted(lines, key=lambda line: line[0])  # stdout's and stderr's lines, read apart, in time order


def startup(log: str, started_at: float, ready_at: float | None = None, asked_at: float | None = None,
            since: float | None = None) -> dict:
    """The table of one start: `log` from `docker logs --timestamps`, `started_at` the container's
    State.StartedAt (seconds), `ready_at` when rigkit's first completion answered (None: not measured) and
    `asked_at` when that request was sent. `since`: where this start's lines begin (log_since); default
    `started_at`. Docker can stamp a process's first lines before the StartedAt it records after the start
    returns: a loaded machine once dropped every line before a 4 s weights load, and the table gave the
    load to "container start to its first line". A line before `started_at` counts as 0 s from the start."""
    lines = read_lines(log, started_at if since is None else since)
    found = []
    for phase, pattern in MARKS:
        at = next((at for at, text in lines if pattern.search(text)), None)
        if at is not None:
            found.append((at, phase))
    if ready_at is not None:
        api_up = max((at for at, _ in found), default=started_at)
        if asked_at is not None and asked_at > api_up:
            found.append((asked_at, POLL_WAIT))
        found.append((ready_at, FIRST_TOKEN))
    found.sort(key=lambda mark: mark[0])  # by time only: lines of one instant stay in MARKS' order
    phases, previous = [], started_at
    for at, phase in found:
        phases.append({"phase": phase, "s": round(max(at - previous, 0.0), 3)})
        previous = max(previous, at)
    figures = {}
    for name, pattern in OWN_FIGURES:
        for _, text in lines:
            if match := pattern.search(text):
                figures[name] = float(match.group(1))
                break
    silences = sorted(((b[0] - a[0], a[1]) for a, b in zip(lines, lines[1:]) if b[0] - a[0] >= SILENCE_S),
                      reverse=True)[:SILENCES_KEPT]
    return {
        "started_at": started_at,
        "total_s": round(previous - started_at, 3),
        "to": phases[-1]["phase"] if phases else None,
        "phases": phases,
        "vllm_says": figures,
        "silences": [{"s": round(s, 3), "after": text.strip()[:200]} for s, text in silences],
        "compile_cache": compile_cache([text for _, text in lines]),
    }


def log_since(state: dict) -> str | None:
    """Where a container's current start's lines begin, from `docker inspect`'s State: after its last run's
    FinishedAt, which Docker keeps while the container runs again; None for a first run (every line is this
    start's). For `docker logs --since` and, stamped, startup()'s `since`."""
    finished, started = state.get("FinishedAt") or "", state.get("StartedAt") or ""
    if not finished or finished.startswith("0001-") or not started:
        return None
    try:
        return finished if stamp(finished) < stamp(started) else None
    except ValueError:
        return None


def slowest_phase(phases: list) -> dict | None:
    """The engine's slowest phase of a start's table (never POLL_WAIT, rigkit's own wait); None without one."""
    timed = [p for p in phases if isinstance(p, dict) and isinstance(p.get("s"), (int, float))
             and p.get("phase") != POLL_WAIT]
    return max(timed, key=lambda p: p["s"], default=None)


def compile_cache(texts: list[str]) -> dict:
    """What the compile cache did in this start: "hit", "miss" (with vLLM's reason where it gave one) or
    "none" (nothing compiled: --enforce-eager, or a version that says nothing), and its key where logged."""
    key = next((m.group(1) for t in texts if (m := CACHE_KEY.search(t))), None)
    paths = sorted({m.group(0) for t in texts for m in CACHE_PATHS.finditer(t)})[:8]
    failed = next((m.group(1).strip() for t in texts if (m := CACHE_LOAD_FAILED.search(t))), None)
    if failed is not None:
        return {"cache": "miss", "reason": f"vLLM could not load its cached graph: {failed[:300]}", "key": key,
                "paths": paths}
    if any(CACHE_HIT.search(t) for t in texts):
        return {"cache": "hit", "reason": None, "key": key, "paths": paths}
    if any(COMPILED.search(t) for t in texts):
        return {"cache": "miss", "reason": "nothing cached under this key", "key": key, "paths": paths}
    return {"cache": "none", "reason": None, "key": None, "paths": []}


def flags(command: list[str]) -> dict[str, str]:
    """A vLLM command line as {flag: its value(s)}, the model path as "model"."""
    found, current = {}, "model"
    for part in command:
        if part.startswith("--"):
            current, found[part] = part, ""
        else:
            found[current] = f"{found.get(current, '')} {part}".strip()
    return found


def changed_inputs(before: dict | None, now: dict) -> list[str]:
    """What changed between two starts' inputs ({"image": id, "command": [...]}) that vLLM keys its compiled
    graphs on: the image (vLLM's code, torch) and the flags. A miss after a hit with no change here is vLLM's."""
    if not isinstance(before, dict):
        return []
    changed = []
    if before.get("image") != now.get("image"):
        changed.append(f"the image ({str(before.get('image'))[:19]} -> {str(now.get('image'))[:19]})")
    old, new = flags(before.get("command") or []), flags(now.get("command") or [])
    def shown(value):
        return "(unset)" if value is None else value or "(set)"
    for flag in sorted(set(old) | set(new)):
        if old.get(flag) != new.get(flag):
            changed.append(f"{flag} {shown(old.get(flag))} -> {shown(new.get(flag))}")
    return changed


def table(name: str, doc: dict) -> list[str]:
    """The start as lines for a person: each phase, vLLM's own figures, the silences, the compile cache."""
    lines = [f"start of {name}: {doc['total_s']:.1f} s to {doc['to'] or 'nothing logged'}"]
    width = max((len(p["phase"]) for p in doc["phases"]), default=0)
    lines += [f"  {p['phase']:<{width}}  {p['s']:7.1f} s" for p in doc["phases"]]
    if doc["vllm_says"]:
        lines.append("  vLLM's own figures: " + ", ".join(f"{k} {v:g} s" for k, v in doc["vllm_says"].items()))
    for silence in doc["silences"]:
        lines.append(f"  {silence['s']:.1f} s without a line after: {silence['after'][:120]}")
    cache = doc["compile_cache"]
    if cache["cache"] != "none":
        lines.append(f"  compile cache: {cache['cache']}" + (f" ({cache['reason']})" if cache["reason"] else "")
                     + (f", key {cache['key'][:12]}" if cache["key"] else ""))
        if cache.get("changed"):
            lines.append(f"  changed since the last start: {'; '.join(cache['changed'])}")
    return lines
