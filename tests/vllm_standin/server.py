"""A stand-in for vLLM's OpenAI-compatible server. TEST INFRASTRUCTURE, never product code.

Started by rigkit's rendered compose file in place of the vLLM image: the image's
entrypoint plays `vllm serve`, so the command starts with the model path and
takes vLLM's flags (an unknown flag is refused the way vLLM's argparse does).

What it fakes, and the traps it reproduces:
- No model runs. A token is one whitespace-separated word of the prompt; output
  is generated words. Prefill and decode run at configured rates
  (STANDIN_PREFILL_TOK_S, STANDIN_DECODE_TOK_S): the "truth" a benchmark must find.
- Speculative decoding (--speculative-config): each streamed chunk carries
  1 + accepted tokens, so counting chunks undercounts tokens by that factor.
  Acceptance per draft is STANDIN_ACCEPTED_PER_DRAFT (default 1.4 of k drafted).
- `--dtype half`/`float16` with speculative decoding: zero acceptance, one token
  per chunk, 3x slower decode, no error (the silent bf16-drafter trap). The fault
  `half_dtype_draft` plays the same (with a 3-token drafter when no --speculative-config
  is given): /metrics counts drafts and draft tokens, zero accepted.
- `--enforce-eager` or the fault `eager`: decode 7x slower (the leftover-workaround trap).
- Prefix caching (vLLM's default; `--no-enable-prefix-caching` or the fault `no_prefix_cache`
  turn it off): a prompt seen before prefills in 1/8 of the time (field notes: a repeated
  11k-token prompt, 7 s -> 0.86 s); without it, every repeat pays the whole prefill again.
- The fault `slower_by` with STANDIN_SLOWER_BY (e.g. 0.10): a config that is that share
  slower, prefill and decode both (decode tok/s x 0.9). With STANDIN_SLOWER_STARTS=N, only the
  container's first N starts are (counted in a file of its own filesystem, which `docker restart`
  keeps): a start whose level is off, as vLLM's CPU build shows from one start to the next
  (bench/gate_engine_starts.py: 0.81-1.0 of the best of 8 starts of one config).
- STANDIN_NOISE_SHARE: the relative sd of each request's rates (decode; 1.5x for prefill),
  drawn from STANDIN_SEED's generator; default 0.006 with STANDIN_GPU_DIR, 0 (exact rates) without.
- STANDIN_PROMPT_INFLATION: usage.prompt_tokens reports that many times the real
  prompt length (a server whose token count disagrees with the request).
- Start-up: the lines vLLM's GPU build logs as it starts (engine, weights, compile, init engine), STANDIN_LOAD_S
  (0.5) loading; with STANDIN_COMPILE_S it compiles its graphs as vLLM keeps them under VLLM_CACHE_ROOT (_compile):
  a key not found there costs that time, a key found a tenth of it.
- Faults (STANDIN_FAULT, several may be given comma-separated): `fail_at_start` exits
  with an error at start; `hang` loads, answers /health with 200, and never produces a
  token; `slow_load` takes STANDIN_SLOW_LOAD_S (default 30) to load;
  `error_mid_stream` sends an OpenAI error object as an SSE event after
  STANDIN_ERROR_AFTER_TOKENS (default 2) tokens, then [DONE], and no usage;
  `buffered` plays a buffering proxy: the server generates at its rates but every
  event of a stream arrives at once at the end (with STANDIN_BUFFERED_STREAMS=N, only
  the first N streams of 8 tokens or more: a client starved for a moment reads them so); `empty_first` sends an empty text
  chunk and a role-only delta as soon as the request arrives, before prefill; `no_usage`
  ignores stream_options.include_usage (a server that never reports usage in a stream);
  `empty_stream` answers 200 with a stream of nothing but `data: [DONE]` (no token, no usage);
  `chat_only` has no /v1/completions (404 `{"detail": "Not Found"}`, as FastAPI answers an
  unknown route): a chat-only server or gateway; `not_streamed` answers `stream: true` with one
  `application/json` body, usage and all, once the whole answer is generated (a buffering gateway, a
  response cache; STANDIN_BODY_CONTENT_TYPE labels that body otherwise, e.g. `text/event-stream`);
  `hide_reasoning` plays a relay that drops the reasoning from the stream (with
  `--reasoning-parser`, chat) while usage still counts it in `completion_tokens_details.reasoning_tokens`.
- Late counters: STANDIN_METRICS_LAG_S (e.g. 1.5) makes every counter and histogram of /metrics land
  that many seconds after the engine counted it (a metrics thread, a scrape interval behind a proxy).
- Stream endings: STANDIN_FINISH_REASON replaces the last chunk's finish_reason
  (`abort`, `error`, ...; `none` sends none at all); STANDIN_STOP_AFTER_TOKENS stops
  every generation after that many tokens with finish_reason "stop" (ignore_eos not honoured).
- SSE wire variants (STANDIN_SSE, comma-separated): `compact` writes `data:` without
  the space; `comments` sends `: keep-alive` comment lines while the request waits and
  before every event; `event` puts an `event: chunk` line before each data line;
  `multiline` spreads each JSON payload over several `data:` lines; `crlf` ends lines in CRLF.
- Token fields (STANDIN_TOKEN_FIELD): `text` (default for completions), `content`
  (default for chat), `reasoning_content`, `reasoning`, or `tool_calls` (function
  arguments deltas): the field carrying the generated text, on either endpoint;
  `choice_reasoning` / `choice_reasoning_content` put it in a choice-level `reasoning` /
  `reasoning_content` field (some servers do so on completions).
- Chat (/v1/chat/completions), as vLLM streams it: `messages` required (400 without, as a
  completion without `prompt` is refused), the chat template adds STANDIN_CHAT_TEMPLATE_TOKENS
  (default 8, ChatML's) prompt tokens, a `chatcmpl-` id, a role chunk
  (`delta: {"role": "assistant", "content": ""}`) just before the first token, then deltas.
  STANDIN_SYSTEM_PROMPT_TOKENS (default 0) more come from a system message the template prepends (a
  model's own, a front-end's): prefilled on the first chat request, from the prefix cache after it.
  Prefix-cache hits count in vLLM's `vllm:prefix_cache_hits_total` / `_queries_total` (in tokens), and,
  with `--enable-prompt-tokens-details` as in vLLM, in usage's `prompt_tokens_details.cached_tokens`.
  With `--reasoning-parser`, the first STANDIN_REASONING_TOKENS (default 16) generated tokens
  stream as `delta.reasoning_content` (STANDIN_REASONING_FIELD=`reasoning` for newer vLLM's
  name), the rest as `delta.content`.
- Shutdown: SIGTERM (`docker stop`, Compose recreating the container) ends the server at
  once; vLLM's API server also shuts down on SIGTERM within seconds (the stand-in does not
  wait for in-flight streams: it cuts them). Without a handler, PID 1 ignores SIGTERM and
  every stop waited Docker's 10 s grace before SIGKILL.
- Queueing: STANDIN_QUEUE_S seconds of waiting before prefill starts (a busy
  scheduler). /metrics has vLLM's per-request histograms (queue, prefill, decode time,
  TTFT, measured per request) unless STANDIN_HISTOGRAMS=0.
- Spec-decode counters (STANDIN_SPEC_COUNTERS): `full` (default: drafts, draft tokens,
  accepted, accepted per position), `old` (draft tokens and accepted only: no
  num_drafts), `per_pos` (draft tokens and per-position accepted only). The fault `no_metrics`
  answers /metrics with 404 (a server without Prometheus metrics, a gateway that does not pass
  them on): no counter of any kind, drafting or not. (vLLM registers its spec-decode counters
  whenever it drafts, so "drafting, /metrics without them" is not a vLLM mode.)
- Rejections: STANDIN_REJECT_SHARE (e.g. 0.5) of the requests that arrive while
  another is generating are refused with HTTP STANDIN_REJECT_STATUS (default 429)
  and an OpenAI error body; a lone request is never refused.
- Wedge (a stuck engine: /health stays 200, no token comes out, the gauges frozen as the
  engine last reported them): STANDIN_FAULT=wedge wedges after STANDIN_WEDGE_AFTER requests
  (default 0), counted since start, so a restart serves that many again: the request that wedged
  it stays "running" in /metrics, and one arriving later is never counted (vLLM's gauges come from
  its engine core: with the core stopped, vLLM 0.32 took requests and showed 0 running, 0 waiting);
  or at runtime with the test-only POST /standin/wedge (the engine stops idle). POST /standin/long_prefill?seconds=S makes every request's
  prefill take S seconds (default 60), processed in chunks: `vllm:iteration_tokens_total`
  advances per chunk while no token comes out, and `vllm:prompt_tokens_total` only when a
  prefill completes (as vLLM V1 counts it); STANDIN_LONG_PREFILL_S sets it at start.
  POST /standin/normal ends both. /metrics has vLLM's gauges `vllm:num_requests_running`
  and `vllm:num_requests_waiting`.
- Tuning (docs/simulated-rig.md): with STANDIN_GPU_DIR (a folder, relative to the model path
  or absolute) holding the simulated rig's gpus.json and state.json (the rig's /run/nvidia-sim,
  shared through the model's bind mount), each request's prefill and decode rates come from
  tests/sim_curves.py for the current power limit, lock and offsets of the GPUs in
  STANDIN_GPU_INDICES (default 0; the slowest card sets the pace), read when the request
  arrives; STANDIN_DECODE_TOK_S is then unused. STANDIN_NOISE_SHARE (default 0.006) is the
  relative sd of each request's rates (1.5x for prefill); STANDIN_DRIFT_PER_S (e.g. -0.0005)
  changes both rates linearly with the seconds since the server started (a card heating up).
- GET /version answers {"version": "standin"}, as vLLM answers its version.
- Sleep mode, as vLLM 0.32 serves it (docs/features/sleep_mode.md; its routes and answers as read in
  the vLLM 0.32 image): only with VLLM_SERVER_DEV_MODE=1 are there POST /sleep?level=N
  (default 1) -> {"status": "sleeping", "level": N}, POST /wake_up -> {"status": "awake"} and
  GET /is_sleeping -> {"is_sleeping": bool}; else 404 as any unknown route. Without
  --enable-sleep-mode a sleep or wake is refused (500, the engine core's assertion "Sleep mode is not
  enabled in the model config"). A sleep takes STANDIN_SLEEP_S and a wake STANDIN_WAKE_S, each a
  list "level:seconds,..." (default 1:0.2,2:0.1 and 1:0.3,2:0.6; bench/swap.py passes vLLM's published
  figures). While asleep a completion is refused with 503 (vLLM's docs: "endpoints that require access
  to model weights will return a 503"); /health, /metrics and /v1/models still answer.
  The fault `bad_wake` plays a wake that answers healthy HTTP with corrupted output (public reports):
  after every wake, greedy tokens and their logprobs differ from the ones before the sleep, until the
  process restarts.
  GPU memory: what it holds on each of its GPUs as nvidia-smi would count it, answered on GET
  /standin/memory ({"mib": N}; the simulated rig's nvidia-smi adds these up) and, with STANDIN_MEMORY_FILE,
  written there as "PID MiB": STANDIN_MEMORY_MIB awake (default its --gpu-memory-utilization of an RTX
  4090's 24564 MiB, the simulated rig's card), STANDIN_SLEEP_LEFT_MIB (default 512: the CUDA context) asleep; the fault `leaky_sleep` leaves 16384 MiB after a sleep (vllm#32714: 16 GB per GPU left
  after sleep on v0.14). The file outlives the process: a reader counts it only while PID runs, as
  nvidia-smi lists only live processes.
- cuda-checkpoint (NVIDIA's tool, played by tests/simrig/cuda-checkpoint, which finds this process by its PID:
  a container's through Docker, a local process through the file STANDIN_CHECKPOINT_REGISTRY/PID holding its
  port): GET /standin/checkpoint -> {"state": "running"|"checkpointed"}; POST toggles. Checkpointed, it holds
  0 MiB and a completion waits until it is restored (its CUDA calls wait, as in a checkpointed process); a
  checkpoint takes STANDIN_CHECKPOINT_S (0.2), a restore STANDIN_RESTORE_S (0.1). With the fault `bad_wake` a
  restore brings the weights back corrupted, as a bad wake does. POST /standin/checkpoint_locked (a test's
  switch) leaves it as a toggle cut off after its lock leaves a process: `locked`, its requests waiting, and a
  toggle refused.
- Greedy logprobs: a non-streamed completion asking for `logprobs` gets tokens and logprobs that are a
  function of the prompt alone (what a greedy decode of fixed weights gives), in vLLM's completions
  shape (`choices[0].logprobs`: tokens, token_logprobs, top_logprobs, text_offset).
- The API key (--api-key, one or more, or VLLM_API_KEY) is enforced on /v1/* as vLLM does; `--config
  FILE.yaml` adds the file's options first, as vLLM's FlexibleArgumentParser does (a list as one
  option with several values; a file not named .yaml or .yml refused).
- The model path must hold a config.json, as vLLM needs one: the weights must really be mounted.
- GET /standin/info reports the parsed flags and NVIDIA_VISIBLE_DEVICES as set by
  Docker's NVIDIA device request, so tests can see what the compose file asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG_LIMIT_S = float(os.environ.get("STANDIN_HANG_LIMIT_S", "3600"))  # a hung request still ends, after an hour
# What vLLM 0.32 answers a request whose engine died (tests/data/vllm-0.32/error-500-engine-dead.json): how a
# hung or wedged request ends here, when it ends.
ENGINE_DEAD = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                         "type": "InternalServerError", "param": None, "code": 500}}
HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
              "vllm:request_decode_time_seconds", "vllm:time_to_first_token_seconds",
              "vllm:e2e_request_latency_seconds")
BUCKETS = (0.01, 0.1, 1.0, 10.0)
KEEPALIVE_S = 0.1
CACHED_PREFILL_SHARE = 1 / 8  # a prefix-cache hit: the field notes' repeated 11k-token prompt, 7 s -> 0.86 s  # the `comments` SSE variant sends a comment this often while a request waits


def parse_args(argv):
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--quantization", "-q")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--speculative-config")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--safetensors-load-strategy")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--api-key", nargs="+")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--disable-custom-all-reduce", action="store_true")  # vLLM ParallelConfig.disable_custom_all_reduce
    p.add_argument("--enable-sleep-mode", action="store_true")
    return p.parse_args(_with_config(argv))


def _with_config(argv: list[str]) -> list[str]:
    """vLLM's `--config`: the YAML file's options (`key: value`, a list as `--key v1 v2`) go between the
    model (the first argument) and the rest, so the command line wins."""
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    path = argv[index + 1]
    if path.split(".")[-1] not in ("yaml", "yml"):
        raise ValueError(f"Config file must be of a yaml/yml type. {path.split('.')[-1]} supplied")
    import yaml

    with open(path) as file:
        config = yaml.safe_load(file)
    options = []
    for key, value in config.items():
        if isinstance(value, bool):
            options += [f"--{key}"] if value else []
        elif isinstance(value, list):
            options += [f"--{key}", *map(str, value)] if value else []
        else:
            options += [f"--{key}", str(value)]
    rest = argv[:index] + argv[index + 2:]
    return rest[:1] + options + rest[1:]


STARTS_FILE = "/tmp/rigkit-standin-starts"  # in the container's own filesystem: kept by a restart, not a recreate


def _start_number() -> int:
    """This start's number in this container (1 for its first), counted once per process."""
    try:
        with open(STARTS_FILE) as f:
            number = int(f.read().strip() or 0) + 1
    except (FileNotFoundError, ValueError):
        number = 1
    with open(STARTS_FILE, "w") as f:
        f.write(str(number))
    return number


class Engine:
    def __init__(self, args):
        self.args = args
        env = os.environ
        self.prefill_tok_s = float(env.get("STANDIN_PREFILL_TOK_S", "4000"))
        decode = float(env.get("STANDIN_DECODE_TOK_S", "60"))
        self.faults = set(filter(None, env.get("STANDIN_FAULT", "").split(",")))
        self.buffered_left = int(env.get("STANDIN_BUFFERED_STREAMS", "-1"))  # -1: every stream
        self.spec = json.loads(args.speculative_config) if args.speculative_config else None
        if "half_dtype_draft" in self.faults and not self.spec:
            self.spec = {"model": "draft", "num_speculative_tokens": 3}  # a drafter the fault's config carries
        self.k = int(self.spec.get("num_speculative_tokens", 1)) if self.spec else 0
        accepted = float(env.get("STANDIN_ACCEPTED_PER_DRAFT", str(min(self.k, 1.4)))) if self.spec else 0.0
        if self.spec and (args.dtype in ("half", "float16") or "half_dtype_draft" in self.faults):
            accepted, decode = 0.0, decode / 3  # drafts all rejected, and paid for
        if args.enforce_eager or "eager" in self.faults:
            decode /= 7
        self.slower_by = float(env.get("STANDIN_SLOWER_BY", "0.10")) if "slower_by" in self.faults else 0.0
        slow_starts = int(env.get("STANDIN_SLOWER_STARTS", "0") or 0)
        if self.slower_by and slow_starts and _start_number() > slow_starts:
            self.slower_by = 0.0  # past the slow starts: this start runs at the config's own level
        decode *= 1 - self.slower_by
        self.prefill_tok_s *= 1 - self.slower_by
        self.prefix_caching = args.enable_prefix_caching and "no_prefix_cache" not in self.faults
        self.chat_template_tokens = int(env.get("STANDIN_CHAT_TEMPLATE_TOKENS", "8"))
        self.system_prompt_tokens = int(env.get("STANDIN_SYSTEM_PROMPT_TOKENS", "0"))
        self.system_cached = False
        self.metrics_lag_s = float(env.get("STANDIN_METRICS_LAG_S", "0"))
        self.reasoning_tokens = int(env.get("STANDIN_REASONING_TOKENS", "16")) if args.reasoning_parser else 0
        self.reasoning_field = env.get("STANDIN_REASONING_FIELD", "reasoning_content")
        self.accepted_per_draft = accepted
        self.decode_factor = decode / float(env.get("STANDIN_DECODE_TOK_S", "60"))  # the traps' slow-downs
        self.decode_tok_s = decode
        gpu_dir = env.get("STANDIN_GPU_DIR")
        self.gpu_dir = os.path.join(args.model, gpu_dir) if gpu_dir else None
        self.gpu_indices = [int(i) for i in env.get("STANDIN_GPU_INDICES", "0").split(",")]
        self.noise_share = float(env.get("STANDIN_NOISE_SHARE", "0.006" if gpu_dir else "0"))
        self.drift_per_s = float(env.get("STANDIN_DRIFT_PER_S", "0"))
        self.started = time.monotonic()
        self.rng = random.Random(env.get("STANDIN_SEED"))
        self.inflation = float(env.get("STANDIN_PROMPT_INFLATION", "1.0"))
        self.hang = "hang" in self.faults
        self.sse = set(filter(None, env.get("STANDIN_SSE", "").split(",")))
        self.token_field = env.get("STANDIN_TOKEN_FIELD")
        self.finish_reason = env.get("STANDIN_FINISH_REASON")
        self.stop_after = int(env["STANDIN_STOP_AFTER_TOKENS"]) if env.get("STANDIN_STOP_AFTER_TOKENS") else None
        self.error_after = int(env.get("STANDIN_ERROR_AFTER_TOKENS", "2"))
        self.queue_s = float(env.get("STANDIN_QUEUE_S", "0"))
        self.histograms = env.get("STANDIN_HISTOGRAMS", "1") != "0"
        self.spec_counters = env.get("STANDIN_SPEC_COUNTERS", "full")
        self.reject_share = float(env.get("STANDIN_REJECT_SHARE", "0"))
        self.reject_status = int(env.get("STANDIN_REJECT_STATUS", "429"))
        self.lock = threading.Lock()
        self.cache: set[str] = set()
        self.metrics = {"drafts": 0, "accepted": 0, "draft_tokens": 0, "prompt": 0, "generation": 0, "requests": 0,
                        "cache_queries": 0, "cache_hits": 0}
        self.per_pos = [0] * self.k
        self.observed = {name: [] for name in HISTOGRAMS}
        self.active = 0
        self.busy_arrivals = 0
        self.api_keys = [k for k in (args.api_key or [env.get("VLLM_API_KEY")]) if k]
        self.wedge_after = int(env.get("STANDIN_WEDGE_AFTER", "0")) if "wedge" in self.faults else None
        self.wedged = False
        self.long_prefill_s = float(env.get("STANDIN_LONG_PREFILL_S", "0"))
        self.arrivals = 0
        self.running = 0
        self.iteration_steps = 0
        self.iteration_tokens = 0
        self.names = args.served_model_name or [args.model]
        self.dev_mode = env.get("VLLM_SERVER_DEV_MODE") == "1"
        self.sleep_s = _per_level(env.get("STANDIN_SLEEP_S", "1:0.2,2:0.1"))
        self.wake_s = _per_level(env.get("STANDIN_WAKE_S", "1:0.3,2:0.6"))
        self.sleeping_level = 0  # 0: awake
        self.wakes = 0  # with the fault bad_wake, every wake since start corrupts the weights a little more
        self.memory_file = env.get("STANDIN_MEMORY_FILE")
        self.memory_mib = int(env.get("STANDIN_MEMORY_MIB") or args.gpu_memory_utilization * 24564)
        self.sleep_left_mib = 16384 if "leaky_sleep" in self.faults else int(env.get("STANDIN_SLEEP_LEFT_MIB", "512"))
        self.hold_memory(self.memory_mib)
        # cuda-checkpoint (tests/simrig/cuda-checkpoint): checkpointed holds nothing on the GPU and its requests wait
        self.checkpointed, self.running_again = threading.Event(), threading.Event()
        self.running_again.set()
        self.locked_only = False  # locked by a toggle cut off (POST /standin/checkpoint_locked)
        self.checkpoint_s = float(env.get("STANDIN_CHECKPOINT_S", "0.2"))
        self.restore_s = float(env.get("STANDIN_RESTORE_S", "0.1"))
        registry = env.get("STANDIN_CHECKPOINT_REGISTRY")
        if registry:  # where the stand-in tool finds a local process by its PID (a container is found by Docker)
            os.makedirs(registry, exist_ok=True)
            with open(os.path.join(registry, str(os.getpid())), "w") as f:
                f.write(str(args.port))

    def checkpoint_state(self) -> str:
        return "locked" if self.locked_only else "checkpointed" if self.checkpointed.is_set() else "running"

    def hold_memory(self, mib: int) -> None:
        self.held_mib = mib
        if self.memory_file:
            with open(self.memory_file + ".tmp", "w") as f:
                f.write(f"{os.getpid()} {mib}\n")
            os.replace(self.memory_file + ".tmp", self.memory_file)

    def rates(self) -> tuple[float, float]:
        """(prefill tok/s, decode tok/s) for a request arriving now."""
        if not self.gpu_dir:
            if not self.noise_share:
                return self.prefill_tok_s, self.decode_tok_s
            with self.lock:
                decode_noise, prefill_noise = self.rng.gauss(1, self.noise_share), self.rng.gauss(1, self.noise_share * 1.5)
            return self.prefill_tok_s * prefill_noise, self.decode_tok_s * decode_noise
        curves = _curves()
        with open(os.path.join(self.gpu_dir, "gpus.json")) as f:
            gpus = json.load(f)["gpus"]
        try:
            with open(os.path.join(self.gpu_dir, "state.json")) as f:
                state = json.load(f)
        except FileNotFoundError:  # nothing set since boot: the driver's defaults
            state = [{"power_limit_w": g["default_w"], "clock_lock": None} for g in gpus]
        truths = []
        for i in self.gpu_indices:
            gpu, st = gpus[i], state[i]
            truths.append(curves.truth(curves.PROFILES[gpu["tune_profile"]], float(st["power_limit_w"]),
                                       st["clock_lock"][1] if st.get("clock_lock") else None,
                                       int(st.get("memory_offset_mhz", 0)), int(st.get("graphics_offset_mhz", 0)),
                                       gpu.get("held_at_w"), bool(gpu.get("ignores_clock_lock"))))
        drift = 1 + self.drift_per_s * (time.monotonic() - self.started)
        with self.lock:
            decode_noise, prefill_noise = self.rng.gauss(1, self.noise_share), self.rng.gauss(1, self.noise_share * 1.5)
        return (min(t.prefill_tok_s for t in truths) * drift * prefill_noise,
                min(t.decode_tok_s for t in truths) * drift * decode_noise * self.decode_factor * (1 - self.slower_by))

    def tokens_per_step(self, step: int) -> int:
        """1 + accepted tokens; spreads fractional acceptance evenly over steps."""
        if not self.spec:
            return 1
        a = self.accepted_per_draft
        return 1 + int((step + 1) * a) - int(step * a)

    def buffer_this(self, tokens: int) -> bool:
        """Whether a stream of `tokens` is held to its end (the `buffered` fault, STANDIN_BUFFERED_STREAMS)."""
        with self.lock:
            if self.buffered_left < 0:
                return True
            if tokens < 8 or self.buffered_left == 0:
                return False
            self.buffered_left -= 1
            return True

    def arrive(self) -> str:
        """Count a request: "serve"; or, when it will never be answered, "wedging" (this request wedged the
        engine: the engine took it) or "wedged" (it arrives at a stopped engine, which never sees it)."""
        with self.lock:
            self.arrivals += 1
            if self.wedged:
                return "wedged"
            if self.wedge_after is not None and self.arrivals > self.wedge_after:
                self.wedged = True
                return "wedging"
            return "serve"

    def step(self, tokens: int) -> None:
        """One engine step of `tokens` (a prefill chunk or decoded tokens), as vllm:iteration_tokens_total."""
        with self.lock:
            self.iteration_steps += 1
            self.iteration_tokens += tokens

    def set_running(self, delta: int) -> None:
        with self.lock:
            self.running += delta

    def admit(self) -> bool:
        """False for the share of requests refused while another is generating (deterministic)."""
        with self.lock:
            if self.active and self.reject_share:
                self.busy_arrivals += 1
                n = self.busy_arrivals
                if int(n * self.reject_share) > int((n - 1) * self.reject_share):
                    return False
            self.active += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.active -= 1

    def later(self, record, *args, **kwargs) -> None:
        """Record into /metrics now, or STANDIN_METRICS_LAG_S from now."""
        if self.metrics_lag_s:
            threading.Timer(self.metrics_lag_s, record, args=args, kwargs=kwargs).start()
        else:
            record(*args, **kwargs)

    def observe(self, steps: list[int], **seconds: float) -> None:
        self.later(self._observe, steps, **seconds)

    def _observe(self, steps: list[int], **seconds: float) -> None:
        with self.lock:
            for name, value in seconds.items():
                self.observed[name].append(value)
            for n in steps:
                for position in range(n - 1):
                    self.per_pos[position] += 1

    def count(self, **deltas):
        self.later(self._count, **deltas)

    def _count(self, **deltas):
        with self.lock:
            for key, value in deltas.items():
                self.metrics[key] += value

    def metrics_text(self) -> str:
        m = dict(self.metrics)
        label = f'{{engine="0",model_name="{self.names[0]}"}}'  # vLLM 0.32's labels (tests/data/vllm-0.32/metrics.txt)
        lines = [
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {m['prompt']}.0",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {m['generation']}.0",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{label} {m['cache_queries']}.0",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{label} {m['cache_hits']}.0",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{label} {m['requests']}.0",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {self.running}.0",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} 0.0",
            "# TYPE vllm:iteration_tokens_total histogram",
            f"vllm:iteration_tokens_total_sum{label} {self.iteration_tokens}.0",
            f"vllm:iteration_tokens_total_count{label} {self.iteration_steps}.0",
        ]
        counters = {"full": ("drafts", "draft_tokens", "accepted", "per_pos"), "old": ("draft_tokens", "accepted"),
                    "per_pos": ("draft_tokens", "per_pos")}[self.spec_counters] if self.spec else ()
        for key in ("drafts", "draft_tokens", "accepted"):
            if key in counters:
                name = f"vllm:spec_decode_num_{'accepted_tokens' if key == 'accepted' else key}_total"
                lines += [f"# TYPE {name} counter", f"{name}{label} {m[key]}.0"]
        if "per_pos" in counters:
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            lines.append(f"# TYPE {name} counter")
            lines += [f'{name}{{engine="0",model_name="{self.names[0]}",position="{i}"}} {v}.0'
                      for i, v in enumerate(self.per_pos)]
        if self.histograms:
            for name, values in self.observed.items():
                lines.append(f"# TYPE {name} histogram")
                for le in BUCKETS:
                    inside = sum(1 for v in values if v <= le)
                    lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="{self.names[0]}"}} {inside}.0')
                lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="{self.names[0]}"}} {len(values)}.0')
                lines += [f"{name}_sum{label} {sum(values)!r}", f"{name}_count{label} {len(values)}.0"]
        return "\n".join(lines) + "\n"


ENGINE: Engine


def _per_level(text: str) -> dict[int, float]:
    """"1:0.2,2:0.1" -> {1: 0.2, 2: 0.1}."""
    return {int(level): float(seconds) for level, _, seconds in (p.partition(":") for p in text.split(",") if p)}


def greedy_logprobs(text: str, produced: int, corruption: int) -> dict:
    """vLLM's completions logprobs for a greedy decode of `text`: the same prompt always gives the same
    tokens and logprobs, unless the weights were corrupted (`corruption` > 0: a bad wake)."""
    tokens, logprobs, offsets, at = [], [], [], 0
    for i in range(produced):
        digest = hashlib.sha256(f"{corruption}|{text}|{i}".encode()).hexdigest()
        token = f" w{digest[:5]}"
        tokens.append(token)
        logprobs.append(-round(int(digest[5:9], 16) / 65535 * 3, 6))
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "text_offset": offsets,
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)]}


def _curves():
    """tests/sim_curves.py: copied beside this file in the image, next door in a checkout."""
    try:
        import rigkit_sim_curves as curves
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import sim_curves as curves
    return curves


def prompt_text(body: dict) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    prompt = body.get("prompt", "")
    return " ".join(prompt) if isinstance(prompt, list) else str(prompt)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # uvicorn (vLLM's server) sets TCP_NODELAY: a small write never waits for a delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # keep container logs to what matters
        pass

    def send_json(self, code: int, payload: dict, content_type: str = "application/json") -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self) -> bool:
        if ENGINE.api_keys and self.headers.get("Authorization") not in {f"Bearer {k}" for k in ENGINE.api_keys}:
            self.send_json(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/metrics" and "no_metrics" in ENGINE.faults:
            self.send_json(404, {"detail": "Not Found"})
        elif self.path == "/metrics":
            data = ENGINE.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models":
            if self.authorised():
                self.send_json(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in ENGINE.names]})
        elif self.path == "/standin/state":
            self.send_json(200, {"wedged": ENGINE.wedged, "long_prefill_s": ENGINE.long_prefill_s,
                                 "running": ENGINE.running, "arrivals": ENGINE.arrivals})
        elif self.path == "/version":
            self.send_json(200, {"version": "standin"})
        elif self.path == "/standin/memory":
            self.send_json(200, {"mib": ENGINE.held_mib})
        elif self.path == "/standin/checkpoint":
            self.send_json(200, {"state": ENGINE.checkpoint_state()})
        elif self.path == "/is_sleeping" and ENGINE.dev_mode:
            self.send_json(200, {"is_sleeping": bool(ENGINE.sleeping_level)})
        elif self.path == "/standin/info":
            self.send_json(200, {
                "args": vars(ENGINE.args),
                "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
                "decode_tok_s": ENGINE.decode_tok_s,
                "prefill_tok_s": ENGINE.prefill_tok_s,
            })
        else:
            self.send_json(404, {"detail": "Not Found"})  # FastAPI's answer to an unknown route, as vLLM's

    def do_POST(self):
        if self.path == "/standin/checkpoint":
            return self.checkpoint_toggle()
        if self.path == "/standin/checkpoint_locked":  # a test's switch: a toggle cut off after its lock
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with ENGINE.lock:
                ENGINE.running_again.clear()
                ENGINE.checkpointed.set()
                ENGINE.locked_only = True
            return self.send_json(200, {"state": "locked"})
        if self.path.startswith("/standin/"):
            return self.standin_control()
        if ENGINE.dev_mode and self.path.partition("?")[0] in ("/sleep", "/wake_up"):
            return self.sleep_or_wake()
        if self.path not in ("/v1/completions", "/v1/chat/completions") or (
                "chat_only" in ENGINE.faults and self.path == "/v1/completions"):
            return self.send_json(404, {"detail": "Not Found"})
        if not self.authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        chat = self.path.endswith("chat/completions")
        needed = "messages" if chat else "prompt"
        if not (isinstance(body.get(needed), list) if chat else isinstance(body.get(needed), (str, list))):
            # vLLM 0.32's words and shapes (tests/data/vllm-0.32/error-400-no-prompt.json, -chat-no-messages.json)
            if chat:
                error = {"message": "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': "
                                    "'Field required', 'input': '<dict of 2 items>'}", "type": "Bad Request",
                         "param": "body.messages"}
            else:
                error = {"message": "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
                         "type": "BadRequestError", "param": "prompt"}
            return self.send_json(400, {"error": {**error, "code": 400}})
        if body.get("model") not in ENGINE.names:
            return self.send_json(404, {"error": {  # tests/data/vllm-0.32/error-404-model.json
                "message": f"The model `{body.get('model')}` does not exist. Valid aliases: {', '.join(ENGINE.names)}.",
                "type": "NotFoundError", "param": "model", "code": 404}})
        # checkpointed by cuda-checkpoint: the engine's CUDA calls wait until it is restored (bounded)
        if ENGINE.checkpointed.is_set() and not ENGINE.running_again.wait(HANG_LIMIT_S):
            return self.send_json(500, ENGINE_DEAD)
        if ENGINE.sleeping_level:
            return self.send_json(503, {"error": {"message": "The model is sleeping: wake it up (POST /wake_up) first.",
                                                  "type": "ServiceUnavailableError", "param": None, "code": 503}})
        if ENGINE.hang:
            time.sleep(HANG_LIMIT_S)  # /health still says 200 meanwhile
            return self.send_json(500, ENGINE_DEAD)
        arrived = ENGINE.arrive()
        if arrived != "serve":
            return self.stay_wedged(counted=arrived == "wedging")
        ENGINE.set_running(1)
        try:
            self.generate(body, chat=chat)
        finally:
            ENGINE.set_running(-1)

    def sleep_or_wake(self):
        path, _, query = self.path.partition("?")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not ENGINE.args.enable_sleep_mode:
            return self.send_json(500, {"error": {"message": "Sleep mode is not enabled in the model config",
                                                  "type": "InternalServerError", "param": None, "code": 500}})
        if path == "/sleep":
            level = int(params.get("level", "1"))
            time.sleep(ENGINE.sleep_s.get(level, 0.0))
            with ENGINE.lock:
                ENGINE.sleeping_level = level
                ENGINE.hold_memory(min(ENGINE.sleep_left_mib, ENGINE.memory_mib))
            return self.send_json(200, {"status": "sleeping", "level": level})
        time.sleep(ENGINE.wake_s.get(ENGINE.sleeping_level, 0.0))
        with ENGINE.lock:
            if ENGINE.sleeping_level:
                ENGINE.wakes += 1
            ENGINE.sleeping_level = 0
            ENGINE.hold_memory(ENGINE.memory_mib)
        self.send_json(200, {"status": "awake"})

    def checkpoint_toggle(self):
        """What `cuda-checkpoint --toggle` does to this process (tests/simrig/cuda-checkpoint asks it): its GPU
        memory to host memory and back, in STANDIN_CHECKPOINT_S and STANDIN_RESTORE_S."""
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if ENGINE.locked_only:  # cuda-checkpoint's toggle of a locked process fails: it is neither state
            return self.send_json(409, {"state": "locked"})
        if ENGINE.checkpointed.is_set():
            time.sleep(ENGINE.restore_s)
            with ENGINE.lock:
                if "bad_wake" in ENGINE.faults:
                    ENGINE.wakes += 1  # a restore that brings the weights back wrong, as a bad wake does
                ENGINE.hold_memory(ENGINE.held_before_checkpoint)
                ENGINE.checkpointed.clear()
                ENGINE.running_again.set()
            return self.send_json(200, {"state": "running"})
        time.sleep(ENGINE.checkpoint_s)
        with ENGINE.lock:
            ENGINE.running_again.clear()
            ENGINE.checkpointed.set()
            ENGINE.held_before_checkpoint = ENGINE.held_mib
            ENGINE.hold_memory(0)
        self.send_json(200, {"state": "checkpointed"})

    def standin_control(self):
        """Test-only switches: POST /standin/wedge, /standin/long_prefill?seconds=S, /standin/normal."""
        path, _, query = self.path.partition("?")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with ENGINE.lock:
            if path == "/standin/wedge":
                ENGINE.wedged = True
            elif path == "/standin/long_prefill":
                ENGINE.long_prefill_s = float(params.get("seconds", "60"))
            elif path == "/standin/normal":
                ENGINE.wedged, ENGINE.long_prefill_s, ENGINE.wedge_after = False, 0.0, None
            else:
                return self.send_json(404, {"error": "not found"})
        self.send_json(200, {"wedged": ENGINE.wedged, "long_prefill_s": ENGINE.long_prefill_s})

    def stay_wedged(self, counted: bool):
        """A request the stuck engine will never answer; `counted`: the engine had taken it, so it shows as
        running (the gauges frozen at the engine's last report), else it shows nowhere."""
        ENGINE.set_running(1 if counted else 0)
        try:
            deadline = time.monotonic() + HANG_LIMIT_S
            while ENGINE.wedged and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            ENGINE.set_running(-1 if counted else 0)
        self.send_json(500, ENGINE_DEAD)

    def generate(self, body: dict, chat: bool) -> None:
        arrived = time.monotonic()
        if not ENGINE.admit():
            return self.send_json(ENGINE.reject_status, {
                "object": "error", "type": "TooManyRequests" if ENGINE.reject_status == 429 else "InternalServerError",
                "message": f"stand-in: request refused under load (HTTP {ENGINE.reject_status})",
                "code": ENGINE.reject_status})
        try:
            self.generate_admitted(body, chat, arrived)
        finally:
            ENGINE.leave()

    def generate_admitted(self, body: dict, chat: bool, arrived: float) -> None:
        text = prompt_text(body)
        real_prompt = len(text.split())
        system = ENGINE.system_prompt_tokens if chat else 0
        if chat:
            real_prompt += ENGINE.chat_template_tokens + system  # the template's own tokens are prefilled too
        prompt_tokens = round(real_prompt * ENGINE.inflation)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        wanted = min(max_tokens, ENGINE.stop_after) if ENGINE.stop_after else max_tokens
        key = hashlib.sha256(text.encode()).hexdigest()
        with ENGINE.lock:
            if ENGINE.prefix_caching and key in ENGINE.cache:  # the whole prompt seen before
                cached_tokens = real_prompt - round(real_prompt * CACHED_PREFILL_SHARE)
            else:
                cached_tokens = system if ENGINE.prefix_caching and ENGINE.system_cached else 0
            ENGINE.cache.add(key)
            ENGINE.system_cached = ENGINE.system_cached or bool(system)
        ENGINE.count(cache_queries=real_prompt, cache_hits=cached_tokens)
        prefill_tok_s, decode_tok_s = ENGINE.rates()
        prefill_s = (real_prompt - cached_tokens) / prefill_tok_s
        if ENGINE.long_prefill_s:
            self.long_prefill(real_prompt, ENGINE.long_prefill_s)

        steps, produced, drafts, accepted = [], 0, 0, 0
        while produced < wanted:
            n = min(ENGINE.tokens_per_step(len(steps)), wanted - produced)
            steps.append(n)
            produced += n
            if ENGINE.spec:
                drafts += 1
                accepted += n - 1
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": produced, "total_tokens": prompt_tokens + produced}
        if ENGINE.args.enable_prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        hidden = min(produced, ENGINE.reasoning_tokens) if chat and "hide_reasoning" in ENGINE.faults else 0
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        model = body["model"]
        kind = "chat.completion.chunk" if chat else "text_completion"
        finish = "stop" if wanted < max_tokens else "length"

        if not body.get("stream") or "not_streamed" in ENGINE.faults:
            time.sleep(ENGINE.queue_s + prefill_s + max(0, produced - 1) / decode_tok_s)
            ENGINE.count(drafts=drafts, accepted=accepted, draft_tokens=drafts * ENGINE.k,
                         prompt=prompt_tokens, generation=produced, requests=1)
            words = " ".join("tok" for _ in range(produced))
            choice = {"index": 0, "finish_reason": finish}
            if body.get("logprobs") is not None and not chat:
                corruption = ENGINE.wakes if "bad_wake" in ENGINE.faults else 0
                choice["logprobs"] = greedy_logprobs(text, produced, corruption)
                words = "".join(choice["logprobs"]["tokens"])
            choice.update({"message": {"role": "assistant", "content": words}} if chat else {"text": words})
            return self.send_json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                        "model": model, "choices": [choice], "usage": usage},
                                  os.environ.get("STANDIN_BODY_CONTENT_TYPE", "application/json"))

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.held = [] if "buffered" in ENGINE.faults and ENGINE.buffer_this(produced) else None
        if "empty_stream" in ENGINE.faults:
            return self.finish_stream()
        if "empty_first" in ENGINE.faults:
            for empty in ({"text": ""}, {"delta": {"role": "assistant", "content": ""}}):
                self.write_event({"id": rid, "object": kind, "model": model,
                                  "choices": [{"index": 0, "finish_reason": None, **empty}]})
        self.wait_until(arrived + ENGINE.queue_s)
        scheduled = time.monotonic()
        field = ENGINE.token_field or ("content" if chat else "text")
        # The first token comes with the prefill; each later one at the decode rate, counted from when the
        # first really went out: an engine whose first token was late (this process starved on a loaded
        # machine) does not then decode the rest faster to catch up. Timed from `scheduled`, the stand-in
        # once sent 48 tokens at 108 tok/s for a curve of 85 (its own decode histogram said the same).
        emitted, first = 0, None
        for i, n in enumerate(steps):
            target = scheduled + prefill_s if not i else first + (emitted + n - 1) / decode_tok_s
            self.wait_until(target)
            if first is None and chat:  # vLLM's first chunk of a chat stream: the role, with the first output
                self.write_event({"id": rid, "object": kind, "model": model, "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
            first = first or time.monotonic()
            if "error_mid_stream" in ENGINE.faults and emitted >= ENGINE.error_after:
                self.write_event({"error": {"object": "error", "type": "InternalServerError", "code": 500,
                                            "message": "stand-in fault: CUDA error: an illegal memory access was encountered"}})
                return self.finish_stream()
            emitted += n
            last = emitted >= produced
            reason = (None if ENGINE.finish_reason == "none" else ENGINE.finish_reason or finish) if last else None
            reasoning = chat and emitted - n < ENGINE.reasoning_tokens
            carrier = ENGINE.reasoning_field if reasoning else field
            choice = {"index": 0, "finish_reason": reason, **token_payload(carrier, " ".join("tok" for _ in range(n)) + " ", i)}
            # vLLM counts generated tokens at each engine step, not at the request's end: a rate of
            # vllm:generation_tokens_total over a window then follows the tokens as they come.
            ENGINE.count(generation=n)
            if reasoning and hidden and not last:
                continue  # the relay drops it (the last chunk carries the finish_reason through)
            if not self.write_event({"id": rid, "object": kind, "model": model, "choices": [choice]}):
                return
        done = time.monotonic()
        ENGINE.count(drafts=drafts, accepted=accepted, draft_tokens=drafts * ENGINE.k,
                     prompt=prompt_tokens, requests=1)
        ENGINE.observe(steps, **{
            "vllm:request_queue_time_seconds": scheduled - arrived,
            "vllm:request_prefill_time_seconds": (first or done) - scheduled,
            "vllm:request_decode_time_seconds": done - (first or done),
            "vllm:time_to_first_token_seconds": (first or done) - arrived,
            "vllm:e2e_request_latency_seconds": done - arrived})
        if hidden:
            usage["completion_tokens_details"] = {"reasoning_tokens": hidden}
        if (body.get("stream_options") or {}).get("include_usage") and "no_usage" not in ENGINE.faults:
            self.write_event({"id": rid, "object": kind, "model": model, "choices": [], "usage": usage})
        self.finish_stream()

    def long_prefill(self, prompt_tokens: int, seconds: float) -> None:
        """A prefill that takes `seconds`, in 0.5 s chunks: each chunk is an engine step in
        vllm:iteration_tokens_total; no token comes out until it is done (or /standin/normal)."""
        end = time.monotonic() + seconds
        chunks = max(1, int(seconds / 0.5))
        while (left := end - time.monotonic()) > 0 and ENGINE.long_prefill_s:  # /standin/normal ends it
            time.sleep(min(0.5, left))
            ENGINE.step(max(1, prompt_tokens // chunks))

    def wait_until(self, target: float) -> None:
        """Sleep until `target`; the `comments` SSE variant sends keep-alive comments meanwhile."""
        while (delay := target - time.monotonic()) > 0:
            if "comments" in ENGINE.sse:
                self.write_raw(b": keep-alive\n\n")
            time.sleep(min(delay, KEEPALIVE_S) if "comments" in ENGINE.sse else delay)

    def finish_stream(self) -> None:
        self.write_raw(sse_bytes("[DONE]"))
        if self.held is not None:
            self.held, held = None, b"".join(self.held)
            self.write_raw(held)  # a buffering proxy lets the whole stream through at once
        self.close_connection = True

    def write_event(self, payload: dict) -> bool:
        return self.write_raw(sse_bytes(json.dumps(payload, indent=1 if "multiline" in ENGINE.sse else None)))

    def write_raw(self, data: bytes) -> bool:
        if getattr(self, "held", None) is not None:
            self.held.append(data)
            return True
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False


def token_payload(field: str, piece: str, step: int) -> dict:
    """The generated text in the field STANDIN_TOKEN_FIELD names, as vLLM streams that field."""
    if field == "text":
        return {"text": piece}
    if field.startswith("choice_"):
        return {"text": "", field.removeprefix("choice_"): piece}
    if field == "tool_calls":
        call = {"index": 0, "function": {"arguments": piece}}
        if step == 0:
            call.update(id="call_standin", type="function")
        return {"delta": {"tool_calls": [call]}}
    return {"delta": {field: piece}}


def sse_bytes(data: str) -> bytes:
    """One SSE event in the wire variant STANDIN_SSE asks for."""
    end = "\r\n" if "crlf" in ENGINE.sse else "\n"
    lines = [": keep-alive"] if "comments" in ENGINE.sse else []
    lines += ["event: chunk"] if "event" in ENGINE.sse else []
    lines += [("data:" if "compact" in ENGINE.sse else "data: ") + line for line in data.split("\n")]
    return (end.join(lines) + end + end).encode()


def _shutdown(signum, frame):
    print("INFO: Shutting down (SIGTERM)", flush=True)
    os._exit(0)


def _log(process: str, where: str, text: str) -> None:
    """A line as vLLM logs it: "(Worker pid=N) INFO MM-DD HH:MM:SS [file.py:line] text"."""
    print(f"({process} pid={os.getpid()}) INFO {time.strftime('%m-%d %H:%M:%S')} [{where}] {text}", flush=True)


def _compile(args) -> None:
    """vLLM's GPU build compiling its graphs, as the stand-in models it (STANDIN_COMPILE_S set, no
    --enforce-eager): the graphs are keyed on what changes them (the model's config.json and the flags that
    shape the graph), kept under VLLM_CACHE_ROOT as vLLM keeps them; a key found there loads in a tenth of
    the compile time (a populated cache cut a boot from 79 to 48 s, vllm#49782), a new one compiles in
    STANDIN_COMPILE_S and is kept. The lines are vLLM 0.32's (compilation/backends.py and monitor.py)."""
    compile_s = os.environ.get("STANDIN_COMPILE_S")
    if not compile_s or args.enforce_eager:
        return
    with open(os.path.join(args.model, "config.json"), "rb") as f:
        config = f.read()
    shape = json.dumps([args.dtype, args.max_model_len, args.quantization, args.kv_cache_dtype,
                        args.tensor_parallel_size, args.pipeline_parallel_size, args.speculative_config])
    key = hashlib.sha256(config + shape.encode()).hexdigest()[:10]
    root = os.path.expanduser(os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm"))
    folder = os.path.join(root, "torch_compile_cache", key, "rank_0_0", "backbone")
    started = time.monotonic()
    if os.path.isfile(os.path.join(folder, "graph")):
        time.sleep(float(compile_s) / 10)
        _log("Worker", "backends.py:296", f"[backbone] Directly load the compiled graph(s) for compile range (1, 8192) "
             f"from the cache, took {time.monotonic() - started:.3f} s")
    else:
        time.sleep(float(compile_s))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "graph"), "w") as f:
            f.write(shape)
        _log("Worker", "backends.py:399", f"[backbone] Compiling a graph for compile range (1, 8192) takes "
             f"{time.monotonic() - started:.2f} s")
    _log("Worker", "monitor.py:62", f"[backbone] torch.compile took {time.monotonic() - started:.2f} s in total "
         f"(cache {folder})")


def main(argv=None):
    global ENGINE
    signal.signal(signal.SIGTERM, _shutdown)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    fault = set(os.environ.get("STANDIN_FAULT", "").split(","))
    print(f"INFO vllm-standin: serving {args.model} on {args.host}:{args.port}", flush=True)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(f"ERROR: no config.json in model path {args.model}: not a checkpoint", flush=True)
        sys.exit(1)
    if "fail_at_start" in fault:
        print("ERROR: RuntimeError: CUDA error: out of memory (stand-in fault: fail_at_start)", flush=True)
        sys.exit(1)
    load_s = float(os.environ.get("STANDIN_SLOW_LOAD_S", "30")) if "slow_load" in fault else float(os.environ.get("STANDIN_LOAD_S", "0.5"))
    started = time.monotonic()
    _log("EngineCore", "core.py:133", f"Initializing a V1 LLM engine (v0.32.0) with config: model='{args.model}'")
    _log("Worker", "gpu_model_runner.py:4900", f"Starting to load model {args.model}...")
    time.sleep(load_s)
    _log("Worker", "default_loader.py:502", f"Loading weights took {load_s:.2f} seconds")
    _compile(args)
    _log("EngineCore", "core.py:402", f"init engine (profile, create kv cache, warmup model) took "
         f"{time.monotonic() - started:.2f} seconds")
    ENGINE = Engine(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print("INFO: Application startup complete.", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
