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
  per chunk, 3x slower decode, no error (the silent bf16-drafter trap).
- `--enforce-eager`: decode 7x slower (the leftover-workaround trap).
- STANDIN_PROMPT_INFLATION: usage.prompt_tokens reports that many times the real
  prompt length (a server whose token count disagrees with the request).
- Faults (STANDIN_FAULT): `fail_at_start` exits with an error at start;
  `hang` loads, answers /health with 200, and never produces a token;
  `slow_load` takes STANDIN_SLOW_LOAD_S (default 30) to load.
- /metrics exposes vLLM's metric names, including
  vllm:spec_decode_num_drafts_total and vllm:spec_decode_num_accepted_tokens_total.
- The API key (--api-key or VLLM_API_KEY) is enforced on /v1/* as vLLM does.
- The model path must hold a config.json, as vLLM needs one: the weights must really be mounted.
- GET /standin/info reports the parsed flags and NVIDIA_VISIBLE_DEVICES as set by
  Docker's NVIDIA device request, so tests can see what the compose file asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG_LIMIT_S = 3600  # a hung request still ends, after an hour


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
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--speculative-config")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--safetensors-load-strategy")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--api-key")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--disable-log-requests", action="store_true")
    return p.parse_args(argv)


class Engine:
    def __init__(self, args):
        self.args = args
        env = os.environ
        self.prefill_tok_s = float(env.get("STANDIN_PREFILL_TOK_S", "4000"))
        decode = float(env.get("STANDIN_DECODE_TOK_S", "60"))
        self.spec = json.loads(args.speculative_config) if args.speculative_config else None
        self.k = int(self.spec.get("num_speculative_tokens", 1)) if self.spec else 0
        accepted = float(env.get("STANDIN_ACCEPTED_PER_DRAFT", str(min(self.k, 1.4)))) if self.spec else 0.0
        if self.spec and args.dtype in ("half", "float16"):
            accepted, decode = 0.0, decode / 3  # drafts all rejected, and paid for
        if args.enforce_eager:
            decode /= 7
        self.accepted_per_draft = accepted
        self.decode_tok_s = decode
        self.inflation = float(env.get("STANDIN_PROMPT_INFLATION", "1.0"))
        self.hang = env.get("STANDIN_FAULT") == "hang"
        self.lock = threading.Lock()
        self.cache: set[str] = set()
        self.metrics = {"drafts": 0, "accepted": 0, "draft_tokens": 0, "prompt": 0, "generation": 0, "requests": 0}
        self.api_key = args.api_key or env.get("VLLM_API_KEY")
        self.names = args.served_model_name or [args.model]

    def tokens_per_step(self, step: int) -> int:
        """1 + accepted tokens; spreads fractional acceptance evenly over steps."""
        if not self.spec:
            return 1
        a = self.accepted_per_draft
        return 1 + int((step + 1) * a) - int(step * a)

    def count(self, **deltas):
        with self.lock:
            for key, value in deltas.items():
                self.metrics[key] += value

    def metrics_text(self) -> str:
        m = dict(self.metrics)
        label = f'{{model_name="{self.names[0]}"}}'
        lines = [
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {m['prompt']}.0",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {m['generation']}.0",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{label} {m['requests']}.0",
        ]
        if self.spec:
            lines += [
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f"vllm:spec_decode_num_drafts_total{label} {m['drafts']}.0",
                "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                f"vllm:spec_decode_num_draft_tokens_total{label} {m['draft_tokens']}.0",
                "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                f"vllm:spec_decode_num_accepted_tokens_total{label} {m['accepted']}.0",
            ]
        return "\n".join(lines) + "\n"


ENGINE: Engine


def prompt_text(body: dict) -> str:
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body["messages"])
    prompt = body.get("prompt", "")
    return " ".join(prompt) if isinstance(prompt, list) else str(prompt)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep container logs to what matters
        pass

    def send_json(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self) -> bool:
        if ENGINE.api_key and self.headers.get("Authorization") != f"Bearer {ENGINE.api_key}":
            self.send_json(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
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
        elif self.path == "/standin/info":
            self.send_json(200, {
                "args": vars(ENGINE.args),
                "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
                "decode_tok_s": ENGINE.decode_tok_s,
                "prefill_tok_s": ENGINE.prefill_tok_s,
            })
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self.send_json(404, {"error": "not found"})
        if not self.authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if body.get("model") not in ENGINE.names:
            return self.send_json(404, {"error": f"The model `{body.get('model')}` does not exist."})
        if ENGINE.hang:
            time.sleep(HANG_LIMIT_S)  # /health still says 200 meanwhile
            return self.send_json(500, {"error": "engine hung"})
        self.generate(body, chat=self.path.endswith("chat/completions"))

    def generate(self, body: dict, chat: bool) -> None:
        text = prompt_text(body)
        real_prompt = len(text.split())
        prompt_tokens = round(real_prompt * ENGINE.inflation)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        key = hashlib.sha256(text.encode()).hexdigest()
        cached = ENGINE.args.enable_prefix_caching and key in ENGINE.cache
        ENGINE.cache.add(key)
        started = time.monotonic()
        time.sleep(real_prompt / ENGINE.prefill_tok_s * (0.1 if cached else 1.0))

        steps, produced, drafts, accepted = [], 0, 0, 0
        while produced < max_tokens:
            n = min(ENGINE.tokens_per_step(len(steps)), max_tokens - produced)
            steps.append(n)
            produced += n
            if ENGINE.spec:
                drafts += 1
                accepted += n - 1
        ENGINE.count(drafts=drafts, accepted=accepted, draft_tokens=drafts * ENGINE.k,
                     prompt=prompt_tokens, generation=produced, requests=1)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": produced, "total_tokens": prompt_tokens + produced}
        rid = f"cmpl-{uuid.uuid4().hex}"
        model = body["model"]

        if not body.get("stream"):
            time.sleep(max(0, produced - 1) / ENGINE.decode_tok_s)
            words = " ".join("tok" for _ in range(produced))
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": words}} if chat else {"text": words})
            return self.send_json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                        "model": model, "choices": [choice], "usage": usage})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        # The first token comes with the prefill; each later one at the decode rate.
        emitted = 0
        for i, n in enumerate(steps):
            target = started + real_prompt / ENGINE.prefill_tok_s * (0.1 if cached else 1.0)
            target += max(0, emitted + n - 1) / ENGINE.decode_tok_s if i else 0
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            emitted += n
            piece = " ".join("tok" for _ in range(n)) + " "
            delta = {"index": 0, "finish_reason": "length" if emitted >= produced else None}
            delta.update({"delta": {"content": piece}} if chat else {"text": piece})
            chunk = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                     "model": model, "choices": [delta]}
            if not self.write_event(chunk):
                return
        if (body.get("stream_options") or {}).get("include_usage"):
            self.write_event({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                              "model": model, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def write_event(self, payload: dict) -> bool:
        try:
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False


def main(argv=None):
    global ENGINE
    args = parse_args(sys.argv[1:] if argv is None else argv)
    fault = os.environ.get("STANDIN_FAULT", "")
    print(f"INFO vllm-standin: serving {args.model} on {args.host}:{args.port}", flush=True)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        print(f"ERROR: no config.json in model path {args.model}: not a checkpoint", flush=True)
        sys.exit(1)
    if fault == "fail_at_start":
        print("ERROR: RuntimeError: CUDA error: out of memory (stand-in fault: fail_at_start)", flush=True)
        sys.exit(1)
    load_s = float(os.environ.get("STANDIN_SLOW_LOAD_S", "30")) if fault == "slow_load" else float(os.environ.get("STANDIN_LOAD_S", "0.5"))
    time.sleep(load_s)
    ENGINE = Engine(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print("INFO: Application startup complete.", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
