"""Provenance: what a result was measured with, so that only like is compared with like.

A regression is flagged only between results whose provenance is equal; otherwise
the report lists what changed. Everything here is plain JSON (lists, not tuples),
so a provenance read back from an earlier result compares equal to a new one.
"""

from __future__ import annotations

from rigkit.config.schema import RigConfig
from rigkit.verify.checks import GpuLoad


def provenance(rig: RigConfig, bench_provenance: dict, telemetry: dict, loads: list[GpuLoad],
               serving: dict | None) -> dict:
    """`serving`: what the caller knows of the server: {image, image_digest, vllm_args, vllm_env} (any may be
    missing; vllm_env: the environment rigkit's topology preflight added, where it added any)."""
    policy = {g.index: g for g in rig.spec.gpus}
    names = {g["index"]: g.get("name") for g in telemetry["gpus"]}
    serving = serving or {}
    return {
        "driver_version": telemetry.get("driver_version"),
        "gpus": [{
            "index": load.index,
            "name": names.get(load.index),
            "enforced_limit_w": None if load.enforced_limit_w is None else round(load.enforced_limit_w),
            "power_limit_w": policy[load.index].power_limit_w if load.index in policy else None,
            "clock_lock_mhz": _lock(policy.get(load.index)),
        } for load in loads],
        "serving_image": serving.get("image"),
        "image_digest": serving.get("image_digest"),
        "vllm_args": list(serving["vllm_args"]) if serving.get("vllm_args") is not None else None,
        "vllm_env": dict(serving["vllm_env"]) if serving.get("vllm_env") else None,
        "server_version": bench_provenance.get("server_version"),
        "prompt_tokens": bench_provenance.get("prompt_tokens"),
        "output_tokens": bench_provenance.get("output_tokens"),
        "concurrency": list(bench_provenance.get("concurrency") or [1]),
    }


def _lock(spec) -> list[int] | None:
    lock = spec.clock_lock_mhz if spec else None
    return [lock.floor_mhz, lock.ceiling_mhz] if lock else None


# Recorded in provenance, but not how a figure was measured: `rigkit deploy --accept-slower` (the rollout
# gate promoted a slower config on purpose) changes no figure's meaning.
NOT_COMPARED = frozenset({"accepted_slower"})


def changes(before: dict | None, now: dict) -> list[dict]:
    """[{key, previous, now}] for every key that differs; one entry when the earlier result has no provenance."""
    if not before:
        return [{"key": "provenance", "previous": None, "now": "recorded (the earlier result has none)"}]
    keys = sorted((set(before) | set(now)) - NOT_COMPARED)
    return [{"key": k, "previous": before.get(k), "now": now.get(k)} for k in keys if before.get(k) != now.get(k)]
