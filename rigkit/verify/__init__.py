"""Verification (role verify): the benchmark client for OpenAI-compatible servers, the
NVML telemetry sampler shipped to the rig, verdicts on GPUs under load, the result
document with regressions, its table and its chart; `rigkit bench` (bench_command)."""
