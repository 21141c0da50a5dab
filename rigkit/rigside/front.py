"""The front of an on-demand model: it listens on the model's own address and port, where clients and the
gateway reach it, and passes each request to the engine on the rig's loopback once the scheduler
(rigside.swap) has the model loaded. Standard library only (it runs in rigkit-ondemand on the rig).
docs/on-demand.md.

What it passes on: the OpenAI routes (/v1/...), which wait for the model, and /metrics, /version,
/tokenize and /detokenize, which do not (answered by the engine when it is up). /health is the front's own:
200 while the model can be served (loaded or loadable), 503 once it could not be loaded. Nothing else,
so vLLM's development routes (sleep, wake, collective_rpc) never leave the rig. GET /v1/models, while the
model is parked, is answered with the engine's own answer from its last proven load (the engine's proof,
rigside.engine_control), so a client that lists models does not load them; before any, it waits like
every /v1/ route. /metrics of a parked model whose engine is not running (the "stop" swap) is 200 with no
sample, not 502: Prometheus keeps the target up, and a parked model is not a model down.

Bounds: a request's head and body (MAX_BODY_BYTES, a Content-Length required: an OpenAI client sends one),
the wait for the model (the scheduler's hold_s) and each read from the engine (READ_TIMEOUT_S).
"""

from __future__ import annotations

import hmac
import http.client
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from .swap import Held

MAX_BODY_BYTES = 32 << 20
READ_TIMEOUT_S = 600.0  # one read from the engine: a long prefill sends nothing for a while
PASSED_WITHOUT_WAKE = ("/metrics", "/version", "/tokenize", "/detokenize")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length"}


def error_body(status: int, message: str, kind: str) -> bytes:
    """An OpenAI error object, as vLLM answers one."""
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


class FrontHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rigkit-ondemand"

    def log_message(self, fmt, *args):  # requests are the engine's to log; the front logs its swaps
        pass

    def answer(self, status: int, body: bytes, extra: dict | None = None,
               content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.handle_request()

    def do_POST(self):
        self.handle_request()

    def handle_request(self):
        front = self.server.front
        path = urlsplit(self.path).path
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            return self.answer(411, error_body(411, "a request body needs a Content-Length", "BadRequestError"))
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            return self.answer(413, error_body(413, f"a request body is at most {MAX_BODY_BYTES} bytes",
                                               "BadRequestError"))
        body = self.rfile.read(length) if length else b""
        if path == "/health":
            failed = front.scheduler.slots[front.name].state == "failed"
            return self.answer(503 if failed else 200, b"")
        slot = front.scheduler.slots[front.name]
        if (self.command == "GET" and path == "/v1/models" and slot.state != "awake"
                and getattr(slot.engine, "models", None) is not None):
            return self.answer_models(slot.engine)
        if path.startswith("/v1/"):
            try:
                front.scheduler.enter(front.name)
            except Held as held:
                return self.answer(503, error_body(503, str(held), "ServiceUnavailableError"), {"Retry-After": "5"})
            try:
                self.relay(body)
            finally:
                front.scheduler.leave(front.name)
        elif path in PASSED_WITHOUT_WAKE:
            self.relay(body)
        else:
            self.answer(404, json.dumps({"detail": "Not Found"}).encode())

    def answer_models(self, engine) -> None:
        """The kept /v1/models answer, behind the key the engine itself checks (vLLM's --api-key: 401
        {"error": "Unauthorized"}, tests/data/vllm-0.32/error-401.json)."""
        key = engine.key()
        sent = self.headers.get("Authorization", "")
        if key and not hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
            return self.answer(401, b'{"error":"Unauthorized"}')
        return self.answer(200, json.dumps(engine.models).encode())

    def relay(self, body: bytes) -> None:
        front = self.server.front
        upstream = http.client.HTTPConnection(front.engine_host, front.engine_port, timeout=READ_TIMEOUT_S)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
            except (OSError, http.client.HTTPException) as error:
                if urlsplit(self.path).path == "/metrics" and front.scheduler.slots[front.name].state == "parked":
                    return self.answer(200, f"# {front.name} is parked by rigkit-ondemand: no engine runs\n".encode(),
                                       content_type="text/plain; version=0.0.4; charset=utf-8")
                return self.answer(502, error_body(502, f"the engine of {front.name} did not answer: {error}",
                                                   "BadGatewayError"))
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            length = response.getheader("Content-Length")
            if length is not None and length.isdigit():
                self.send_header("Content-Length", length)
                self.end_headers()
                left = int(length)
                while left > 0:
                    piece = response.read(min(left, 65536))
                    if not piece:
                        break
                    self.wfile.write(piece)
                    left -= len(piece)
                if left:
                    self.close_connection = True
                return
            # a stream (vLLM's SSE is chunked): each piece goes out as it comes
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                piece = response.read1(65536)
                if not piece:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException):
            self.close_connection = True  # the client left, or the engine stopped mid-answer
        finally:
            upstream.close()


class Front(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str, listen: tuple[str, int], engine_url: str, scheduler):
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self.address_family = family
        super().__init__(listen, FrontHandler)
        self.front = self
        self.name, self.scheduler = name, scheduler
        parts = urlsplit(engine_url)
        self.engine_host, self.engine_port = parts.hostname, parts.port

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name=f"front-{self.name}", daemon=True)
        thread.start()
        return thread
