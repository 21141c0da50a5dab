"""A small OpenAI-compatible streaming server on a real GPU. TEST INFRASTRUCTURE.

A randomly initialised Llama from `transformers` (no download: random weights, a
whitespace "tokenizer" that hashes words into the vocabulary) generates greedily with a KV
cache, one token per forward pass, and streams each token as soon as it exists. The server
records when it emitted every token (time.monotonic()), and GET /truth returns its own
figures for every request since it started, in order: that is the truth the benchmark client must find
(a benchmark sends several: a warm-up, calibration requests, the measured one, its repeat).

    python3 tests/gpu/llm_server.py --port 18555 [--layers 16 --hidden 2048]

Serves /health, /v1/completions (stream with stream_options.include_usage, ignore_eos,
max_tokens; usage in the last chunk, finish_reason "length") and /truth. Binds 127.0.0.1.
It only reads the GPU's settings (it sets none).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 32000
GENERATE = threading.Lock()  # one request on the GPU at a time: the truth is per request
TRUTH: list[dict] = []


def build_model(layers: int, hidden: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 4 // 1,
                         num_hidden_layers=layers, num_attention_heads=hidden // 128,
                         num_key_value_heads=max(1, hidden // 512), max_position_embeddings=8192)
    return LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()


def token_ids(prompt: str) -> list[int]:
    return [zlib.crc32(word.encode()) % VOCAB for word in prompt.split()]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model: LlamaForCausalLM

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvicorn does

    def send_json(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {})
        elif self.path == "/truth":
            self.send_json(200, TRUTH)
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/v1/completions":
            return self.send_json(404, {"error": "not found"})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        ids = token_ids(body.get("prompt", "")) or [1]
        max_tokens = int(body.get("max_tokens", 16))
        with GENERATE:
            self.generate(body, ids, max_tokens)

    def event(self, payload: dict) -> None:
        data = f"data: {json.dumps(payload)}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    @torch.inference_mode()
    def generate(self, body: dict, ids: list[int], max_tokens: int) -> None:
        received = time.monotonic()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        emits, past = [], None
        inputs = torch.tensor([ids], device="cuda")
        for n in range(max_tokens):  # ignore_eos: exactly max_tokens tokens, bounded
            out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())  # .item() waits for the GPU: the token exists now
            emits.append(time.monotonic())
            self.event({"id": "cmpl-gpu", "object": "text_completion", "model": body.get("model"),
                        "choices": [{"index": 0, "text": f" t{token}", "finish_reason": None}]})
            inputs = torch.tensor([[token]], device="cuda")
        self.event({"id": "cmpl-gpu", "object": "text_completion", "model": body.get("model"),
                    "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        self.event({"id": "cmpl-gpu", "object": "text_completion", "model": body.get("model"), "choices": [],
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": len(emits),
                              "total_tokens": len(ids) + len(emits)}})
        self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        self.wfile.flush()
        TRUTH.append({
            "prompt_tokens": len(ids), "completion_tokens": len(emits),
            "server_ttft_s": emits[0] - received,
            "server_decode_tok_s": (len(emits) - 1) / (emits[-1] - emits[0]) if len(emits) > 1 else None,
            "server_decode_s": emits[-1] - emits[0],
        })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    args = parser.parse_args()
    Handler.model = build_model(args.layers, args.hidden)
    with torch.inference_mode():  # compile kernels and warm the allocator before the first request
        Handler.model(input_ids=torch.ones((1, 64), dtype=torch.long, device="cuda"))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
