"""A stand-in for the Hugging Face Hub. TEST INFRASTRUCTURE, never product code.

It answers, over plain HTTP and with the Python standard library only, the calls that
huggingface_hub 2.4.0's `snapshot_download(repo_id, revision=..., cache_dir=..., endpoint=...)`
makes when Xet is not in play, the way the real Hub answers them (status codes, headers, JSON):

- GET /api/models/{org}/{name}/tree/{revision}[/{path}]?recursive=&expand=&cursor=
  The tree listing: [{"type": "file", "oid", "size", "path"[, "lfs": {"oid", "size", "pointerSize"}]},
  {"type": "directory", "oid", "size": 0, "path"}], at most `page_size` entries a page (1000, as the
  Hub; 50 with expand=true), the next page named in a GitHub-style `Link: <url>; rel="next"` header
  (the client's utils/_pagination.py follows it).
- GET /api/models/{org}/{name}[/revision/{revision}][?blobs=true]
  The repo info the client asks for when the revision is a branch name: {"id", "sha", "siblings", "private", ...}.
- HEAD and GET /{org}/{name}/resolve/{revision}/{path}
  A file kept in git: 200 with ETag "<git blob sha1>" (quoted, as the Hub sends it), X-Repo-Commit,
  Content-Length, Accept-Ranges, and the bytes (Range honoured). A file kept in LFS (name ends in
  .safetensors or .bin, or bigger than 10 MiB): 302 to the CDN, Location an absolute signed URL
  /cdn/<sha256>?repo=&commit=&filename=&Expires=&Signature=, with X-Linked-Etag "<sha256>",
  X-Linked-Size, X-Repo-Commit and ETag "<git blob sha1 of the LFS pointer>".
- HEAD and GET /cdn/<sha256>?<signed query>
  The CDN: the bytes (200), `Range: bytes=N-` / `N-M` / `-K` (206 with Content-Range), 416 past the
  end, 403 for a URL whose signature or expiry does not hold (as a signed CDN URL).
  By default the CDN is on the same origin as the Hub (cdn="same"). huggingface_hub then follows the
  HEAD redirect to it (utils/_http.py _httpx2_follow_hub_redirects_with_backoff and
  _is_same_or_hub_host) and reads the file's metadata from the CDN's answer, so on that origin /cdn
  answers as a Hub endpoint does: ETag "<sha256>" and X-Repo-Commit (without the latter the client
  raises FileMetadataError). With cdn="separate" the CDN listens on a port of its own (another
  origin, as the real Hub's CDN is another host): the client then stops at the 302, takes the
  metadata from it and drops the Authorization header for the CDN; the CDN sends no Hub headers.
- Errors, as the Hub sends them: headers X-Error-Code and X-Error-Message, JSON body {"error": ...}.
  Unknown repo: 401 RepoNotFound (the Hub answers 401, not 404, so as not to tell that a private
  repo exists); a private repo without `Authorization: Bearer <its token>`: the same 401 RepoNotFound;
  unknown revision: 404 RevisionNotFound; unknown file or folder: 404 EntryNotFound with
  X-Repo-Commit (the client caches that absence under .no_exist/<commit>/).
  An unknown route: 404 without X-Error-Code. A path with `..` (or `.`, `\\`, NUL): 400.
  Other methods than GET and HEAD: 405; no request body is ever read (the connection is closed instead).

A repository is `Repo(repo_id, files, private, token)`, files a dict {path: bytes} (or a path to
a file on disk, read when served: Repo.from_folder), at one commit whose 40-hex id is
sha1 over the sorted paths and their contents' sha256 (deterministic; not a git commit object).
Both "main" and that commit resolve; nothing else does. Folders' oids are real git tree ids.

Faults a test switches on (attributes of the HubStandIn):
- corrupt_cdn_path: a repo file path (e.g. "model.safetensors") whose bytes the CDN serves with one
  byte flipped (the middle one), same size.
- cut_after_bytes: the CDN sends that many bytes of a body, then closes the connection; once per
  file (per sha256), so the client's retry gets the whole rest.
- request_log: a list of LoggedRequest(method, path, query, range, authorization, status, listener),
  path and query as sent (percent-encoded), status set once the answer's status line is sent (before
  its body), listener "cdn+hub" (the Hub's origin) or "cdn" (the separate CDN): `authorization` says
  whether an Authorization header came, never what it held. server.requests(method, path_prefix) filters it.
- page_size, expand_page_size: entries per tree page.

Use: `with serving([Repo("org/name", files)]) as (server, endpoint): ...`, or as a script
(stdlib only, to run in a container that has only python3):
  python3 server.py --port 8080 --repo org/name=/path/to/folder [--repo ...] [--private-token-file F]
                    [--host 0.0.0.0] [--cdn-port 8081] [--page-size N] [--verbose]
With --private-token-file every repo given is private, its token the file's content.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # bytes: bigger than this goes to LFS whatever its name
SEND_CHUNK = 256 * 1024
READ_CHUNK = 1024 * 1024
FIXED_DATE = "2024-01-01T00:00:00.000Z"  # the Hub's date format (parse_datetime: %Y-%m-%dT%H:%M:%S.%fZ)
CDN_URL_TTL_S = 3600
MAX_CONNECTIONS = 128
MAX_PATH_CHARS = 4096
MAX_LOGGED = 100_000

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
REPO_ID_RE = re.compile(rf"^{_NAME}/{_NAME}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})(:[0-9]{1,5})?$")
RANGE_RE = re.compile(r"^\s*bytes\s*=\s*([0-9]{0,19})\s*-\s*([0-9]{0,19})\s*$", re.IGNORECASE)


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a blob holding `content`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The LFS pointer git keeps in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def check_repo_path(path: str) -> str:
    """A repo-relative POSIX path, or ValueError: no empty, `.` or `..` part, no leading slash, no backslash or NUL."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"bad repo path: {path!r}")
    if "\\" in path or "\0" in path or any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"bad repo path: {path!r}")
    return path


class FileEntry:
    """One file of a repo: its bytes (or a file on disk), size, hashes, and whether it is kept in LFS."""

    def __init__(self, path: str, source):
        self.path = check_repo_path(path)
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._bytes, self._file = bytes(source), None
            self.size = len(self._bytes)
        else:
            self._bytes, self._file = None, os.fspath(source)
            self.size = os.path.getsize(self._file)
        sha1 = hashlib.sha1(b"blob %d\0" % self.size)
        sha256 = hashlib.sha256()
        for chunk in self.chunks(0, self.size):
            sha1.update(chunk)
            sha256.update(chunk)
        self.sha256 = sha256.hexdigest()
        self.lfs = path.endswith(LFS_SUFFIXES) or self.size > LFS_SIZE_THRESHOLD
        if self.lfs:
            pointer = lfs_pointer(self.sha256, self.size)
            self.pointer_size = len(pointer)
            self.blob_id = git_blob_sha1(pointer)  # what git holds for an LFS file: the pointer
        else:
            self.pointer_size = None
            self.blob_id = sha1.hexdigest()

    def chunks(self, start: int, end: int, flip_at: int | None = None):
        """The bytes [start, end) in chunks; the byte at `flip_at` (if in range) inverted."""
        pos = start
        if self._bytes is not None:
            while pos < end:
                chunk = self._bytes[pos:min(pos + SEND_CHUNK, end)]
                yield _flip(chunk, pos, flip_at)
                pos += len(chunk)
            return
        with open(self._file, "rb") as f:
            f.seek(start)
            while pos < end:
                chunk = f.read(min(READ_CHUNK, end - pos))
                if not chunk:
                    raise OSError(f"{self._file} shrank while served")
                yield _flip(chunk, pos, flip_at)
                pos += len(chunk)

    def tree_item(self) -> dict:
        item = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path}
        if self.lfs:
            item["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": self.pointer_size}
        return item


def _flip(chunk: bytes, pos: int, flip_at: int | None) -> bytes:
    if flip_at is None or not pos <= flip_at < pos + len(chunk):
        return chunk
    i = flip_at - pos
    return chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]


class Repo:
    """A model repository at one commit: `files` {repo path: bytes or a path on disk}."""

    def __init__(self, repo_id: str, files: dict, private: bool = False, token: str | None = None):
        if not REPO_ID_RE.match(repo_id) or "--" in repo_id or ".." in repo_id:
            raise ValueError(f"bad repo id: {repo_id!r} (ORG/NAME)")
        if private and not token:
            raise ValueError("a private repo needs a token")
        self.repo_id, self.private, self.token = repo_id, bool(private), token
        self.entries = {path: FileEntry(path, files[path]) for path in sorted(files)}
        commit = hashlib.sha1()
        for path, entry in self.entries.items():
            commit.update(path.encode() + b"\0" + entry.sha256.encode() + b"\n")
        self.commit = commit.hexdigest()
        self.folders = {"/".join(p.split("/")[:i]) for p in self.entries for i in range(1, p.count("/") + 1)}
        self.tree_ids = self._tree_ids()

    @classmethod
    def from_folder(cls, repo_id: str, folder, private: bool = False, token: str | None = None) -> Repo:
        """Every regular file under `folder` (not .git, not symlinks), read when served."""
        root = os.path.abspath(os.fspath(folder))
        if not os.path.isdir(root):
            raise ValueError(f"not a folder: {root}")
        files = {}
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d != ".git" and not os.path.islink(os.path.join(dirpath, d)))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                files[os.path.relpath(full, root).replace(os.sep, "/")] = full
        return cls(repo_id, files, private=private, token=token)

    def _tree_ids(self) -> dict:
        """The git tree id of every folder ("" the root), as git computes them."""
        ids: dict[str, bytes] = {}
        for folder in sorted(self.folders | {""}, key=lambda f: -(f.count("/") + 1 if f else 0)):
            prefix = folder + "/" if folder else ""
            children = []
            for path, entry in self.entries.items():
                if path.startswith(prefix) and "/" not in path[len(prefix):]:
                    children.append((path[len(prefix):].encode(), b"100644", bytes.fromhex(entry.blob_id)))
            for sub in self.folders:
                if sub.startswith(prefix) and "/" not in sub[len(prefix):]:
                    children.append((sub[len(prefix):].encode(), b"40000", ids[sub]))
            children.sort(key=lambda c: c[0] + (b"/" if c[1] == b"40000" else b""))
            body = b"".join(mode + b" " + name + b"\0" + oid for name, mode, oid in children)
            ids[folder] = hashlib.sha1(b"tree %d\0" % len(body) + body).digest()
        return {folder: oid.hex() for folder, oid in ids.items()}

    def listing(self, path: str, recursive: bool) -> list | None:
        """The tree items under folder `path` ("" the root), or None when it is no folder."""
        if path and path not in self.folders:
            return None
        prefix = path + "/" if path else ""
        items = []
        for folder in sorted(self.folders):
            rest = folder[len(prefix):]
            if folder.startswith(prefix) and rest and (recursive or "/" not in rest):
                items.append({"type": "directory", "oid": self.tree_ids[folder], "size": 0, "path": folder})
        for file_path, entry in self.entries.items():
            rest = file_path[len(prefix):]
            if file_path.startswith(prefix) and (recursive or "/" not in rest):
                items.append(entry.tree_item())
        items.sort(key=lambda item: item["path"])
        return items


class LoggedRequest:
    """One request the stand-in received. `authorization`: whether the header came (never its value)."""

    __slots__ = ("method", "path", "query", "range", "authorization", "status", "listener")

    def __init__(self, method, path, query, range_, authorization, listener):
        self.method, self.path, self.query, self.range = method, path, query, range_
        self.authorization, self.status, self.listener = authorization, None, listener

    def __repr__(self):
        auth = " auth" if self.authorization else ""
        rng = f" Range={self.range}" if self.range else ""
        return f"<{self.listener} {self.method} {self.path}{rng}{auth} -> {self.status}>"


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, standin: HubStandIn, roles: frozenset):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.standin, self.roles = standin, roles
        self._conns: set = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self):
        # HTTPServer.server_bind looks the host's FQDN up (a DNS query, slow where there is none): not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[0], self.server_address[1]

    def verify_request(self, request, client_address):
        with self._conns_lock:
            if len(self._conns) >= MAX_CONNECTIONS:
                return False
            self._conns.add(request)
        return True

    def shutdown_request(self, request):
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self):
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HubStandIn:
    """The stand-in: a Hub listener (and, with cdn="separate", a CDN listener on a port of its own)."""

    def __init__(self, repos, host: str = "127.0.0.1", port: int = 0, *, cdn: str = "same",
                 cdn_port: int = 0, verbose: bool = False):
        if cdn not in ("same", "separate"):
            raise ValueError("cdn: 'same' or 'separate'")
        self.repos = {}
        for repo in repos:
            if repo.repo_id in self.repos:
                raise ValueError(f"repo {repo.repo_id} given twice")
            self.repos[repo.repo_id] = repo
        self.page_size = 1000
        self.expand_page_size = 50
        self.corrupt_cdn_path: str | None = None
        self.cut_after_bytes: int | None = None
        self.request_log: list[LoggedRequest] = []
        self.verbose = verbose
        self.cdn = cdn
        self._lock = threading.Lock()
        self._cut_done: set = set()
        self._secret = os.urandom(32)
        self._by_sha256 = {e.sha256: e for r in self.repos.values() for e in r.entries.values() if e.lfs}
        hub_roles = frozenset({"hub", "cdn"} if cdn == "same" else {"hub"})
        self._hub = _Listener((host, port), self, hub_roles)
        self._cdn = _Listener((host, cdn_port), self, frozenset({"cdn"})) if cdn == "separate" else None
        self._threads: list = []

    @property
    def endpoint(self) -> str:
        return _url_for(self._hub)

    @property
    def cdn_endpoint(self) -> str:
        return _url_for(self._cdn or self._hub)

    @property
    def cdn_port(self) -> int:
        return (self._cdn or self._hub).server_address[1]

    def start(self) -> HubStandIn:
        for listener in (self._hub, self._cdn):
            if listener is not None:
                t = threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                     name=f"hub-standin-{'+'.join(sorted(listener.roles))}")
                t.start()
                self._threads.append(t)
        return self

    def close(self):
        for listener in (self._hub, self._cdn):
            if listener is not None:
                if self._threads:
                    listener.shutdown()
                listener.close_connections()
                listener.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def requests(self, method: str | None = None, path_prefix: str = "") -> list:
        with self._lock:
            return [r for r in self.request_log
                    if (method is None or r.method == method) and r.path.startswith(path_prefix)]

    def clear_log(self):
        with self._lock:
            self.request_log.clear()

    def _log(self, entry: LoggedRequest):
        with self._lock:
            self.request_log.append(entry)
            if len(self.request_log) > MAX_LOGGED:  # bounded, for a long-running script
                del self.request_log[:len(self.request_log) - MAX_LOGGED // 2]

    def _take_cut(self, key: str) -> bool:
        with self._lock:
            if key in self._cut_done:
                return False
            self._cut_done.add(key)
            return True

    def _sign(self, sha256: str, repo_id: str, commit: str, filename: str, expires: str) -> str:
        message = "\n".join((sha256, repo_id, commit, filename, expires)).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


def _url_for(listener: _Listener) -> str:
    host, port = listener.server_address[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _header_safe(text: str, limit: int = 300) -> str:
    """Printable ASCII only (no CR/LF into a header), bounded."""
    return "".join(c if " " <= c <= "~" else "?" for c in text[:limit])


def _bool_param(query: dict, name: str) -> bool:
    return query.get(name, ["false"])[0].strip().lower() in ("1", "true", "yes")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hub-standin"
    timeout = 30  # an idle keep-alive connection or a stalled client is dropped after this

    # --- plumbing ---------------------------------------------------------------------------

    def version_string(self):
        return self.server_version

    def log_message(self, format, *args):
        if self.server.standin.verbose:
            sys.stderr.write(f"hub-standin: {self.address_string()} {format % args}\n")

    def do_GET(self):
        self._serve(head=False)

    def do_HEAD(self):
        self._serve(head=True)

    def _refuse_method(self):
        self.close_connection = True  # its body, if any, is never read
        self._entry = LoggedRequest(self.command, urlsplit(_header_safe(self.path, MAX_PATH_CHARS)).path, "", None,
                                    self.headers.get("Authorization") is not None, "+".join(sorted(self.server.roles)))
        self.server.standin._log(self._entry)
        self._error(405, None, "Method not allowed", head=False, extra={"Allow": "GET, HEAD", "Connection": "close"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method

    def send_response(self, code, message=None):
        entry = getattr(self, "_entry", None)
        if entry is not None:
            entry.status = code
        super().send_response(code, message)

    def _serve(self, head: bool):
        standin = self.server.standin
        self._entry = None
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length", "0").strip() != "0":
            self.close_connection = True  # request bodies are not read: drop the connection after answering
        split = urlsplit(_header_safe(self.path, MAX_PATH_CHARS))
        self._entry = LoggedRequest(self.command, split.path, split.query, self.headers.get("Range"),
                                    self.headers.get("Authorization") is not None,
                                    "+".join(sorted(self.server.roles)))
        standin._log(self._entry)
        if len(self.path) > MAX_PATH_CHARS:
            return self._error(414, None, "URI too long", head)
        if not self.path.startswith("/") or not all("!" <= c <= "~" for c in self.path):
            return self._error(400, None, "Bad request target", head)  # origin-form, printable ASCII only
        try:
            self._route(split, head)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True

    def _route(self, split, head: bool):
        roles = self.server.roles
        raw = split.path.split("/")[1:]
        parts = [unquote(p) for p in raw]
        for part in parts:
            if "\\" in part or "\0" in part or any(p in (".", "..") for p in part.split("/")):
                return self._error(400, None, "Invalid path", head)
        try:
            query = parse_qs(split.query, keep_blank_values=True, max_num_fields=32)
        except ValueError:
            return self._error(400, None, "Invalid query", head)
        n = len(parts)
        if "cdn" in roles and n == 2 and parts[0] == "cdn":
            return self._cdn(parts[1], query, head)
        if "hub" in roles:
            if n >= 4 and parts[0] == "api" and parts[1] == "models":
                repo_id, rest = f"{parts[2]}/{parts[3]}", parts[4:]
                if not rest:
                    return self._info(repo_id, "main", query, head)
                if rest[0] == "revision" and len(rest) == 2:
                    return self._info(repo_id, rest[1], query, head)
                if rest[0] == "tree" and len(rest) >= 2:
                    return self._tree(repo_id, rest[1], "/".join(rest[2:]).strip("/"), query, split.path, head)
            elif n >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
        return self._error(404, None, "Not Found", head)

    def _send(self, status: int, body: bytes, head: bool, headers: dict | None = None,
              content_type: str = "application/json; charset=utf-8"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Request-Id", f"Root={uuid.uuid4()}")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, data, head: bool, headers: dict | None = None):
        self._send(200, json.dumps(data).encode(), head, headers)

    def _error(self, status: int, code: str | None, message: str, head: bool, extra: dict | None = None):
        message = _header_safe(message)
        headers = {"X-Error-Message": message, **(extra or {})}
        if code is not None:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), head, headers)

    def _public_base(self, port: int | None = None) -> str:
        """http://host[:port] as the client reached us (Host header), for absolute URLs we hand out."""
        host = self.headers.get("Host", "")
        if not HOST_RE.match(host):
            base = _url_for(self.server)
            return base if port is None else f"{base.rsplit(':', 1)[0]}:{port}"
        if port is None:
            return f"http://{host}"
        hostname = host.rsplit(":", 1)[0] if not host.endswith("]") and ":" in host else host
        return f"http://{hostname}:{port}"

    # --- the Hub ----------------------------------------------------------------------------

    def _authorized(self, repo: Repo) -> bool:
        if not repo.private:
            return True
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), repo.token.encode())

    def _repo_at(self, repo_id: str, revision: str, head: bool) -> Repo | None:
        repo = self.server.standin.repos.get(repo_id)
        if repo is None or not self._authorized(repo):
            self._error(401, "RepoNotFound", "Repository not found", head)
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
            return None
        return repo

    def _info(self, repo_id: str, revision: str, query: dict, head: bool):
        repo = self._repo_at(repo_id, revision, head)
        if repo is None:
            return
        blobs = _bool_param(query, "blobs")
        siblings = []
        for entry in repo.entries.values():
            sibling = {"rfilename": entry.path}
            if blobs:
                sibling.update(size=entry.size, blobId=entry.blob_id)
                if entry.lfs:
                    sibling["lfs"] = {"sha256": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
            siblings.append(sibling)
        org = repo.repo_id.split("/")[0]
        self._json({
            "_id": repo.commit[:24], "id": repo.repo_id, "modelId": repo.repo_id, "author": org,
            "sha": repo.commit, "lastModified": FIXED_DATE, "createdAt": FIXED_DATE, "private": repo.private,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
        }, head)

    def _tree(self, repo_id: str, revision: str, path: str, query: dict, raw_path: str, head: bool):
        repo = self._repo_at(repo_id, revision, head)
        if repo is None:
            return
        recursive, expand = _bool_param(query, "recursive"), _bool_param(query, "expand")
        items = repo.listing(path, recursive)
        if items is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", head,
                               {"X-Repo-Commit": repo.commit})
        offset = 0
        if "cursor" in query:
            try:
                offset = int(base64.urlsafe_b64decode(query["cursor"][0].encode()).decode().removeprefix("offset:"))
            except (ValueError, UnicodeDecodeError):
                offset = -1
            if not 0 <= offset <= len(items):
                return self._error(400, None, "Invalid cursor", head)
        size = max(1, min(self.server.standin.page_size, self.server.standin.expand_page_size) if expand
                   else self.server.standin.page_size)
        page = items[offset:offset + size]
        if expand:
            last_commit = {"id": repo.commit, "title": "Stand-in commit", "date": FIXED_DATE}
            page = [dict(item, lastCommit=last_commit) for item in page]
        headers = {}
        if offset + size < len(items):
            cursor = base64.urlsafe_b64encode(f"offset:{offset + size}".encode()).decode()
            params = urlencode({"recursive": str(recursive).lower(), "expand": str(expand).lower(), "cursor": cursor})
            headers["Link"] = f'<{self._public_base()}{raw_path}?{params}>; rel="next"'
        self._json(page, head, headers)

    def _resolve(self, repo_id: str, revision: str, path: str, head: bool):
        repo = self._repo_at(repo_id, revision, head)
        if repo is None:
            return
        entry = repo.entries.get(path)
        if entry is None:
            return self._error(404, "EntryNotFound", "Entry not found", head, {"X-Repo-Commit": repo.commit})
        if not entry.lfs:
            return self._content(entry, head, "text/plain; charset=utf-8",
                                 {"ETag": f'"{entry.blob_id}"', "X-Repo-Commit": repo.commit})
        standin = self.server.standin
        expires = str(int(time.time()) + CDN_URL_TTL_S)
        params = {"repo": repo.repo_id, "commit": repo.commit, "filename": entry.path, "Expires": expires,
                  "Signature": standin._sign(entry.sha256, repo.repo_id, repo.commit, entry.path, expires)}
        base = self._public_base(None if standin.cdn == "same" else standin.cdn_port)
        location = f"{base}/cdn/{entry.sha256}?{urlencode(params)}"
        self._send(302, f"Found. Redirecting to {location}".encode(), head, {
            "Location": location,
            "X-Repo-Commit": repo.commit,
            "X-Linked-Etag": f'"{entry.sha256}"',
            "X-Linked-Size": str(entry.size),
            "ETag": f'"{entry.blob_id}"',
            "Accept-Ranges": "bytes",
        }, content_type="text/plain; charset=utf-8")

    # --- the CDN ----------------------------------------------------------------------------

    def _cdn(self, sha256: str, query: dict, head: bool):
        standin = self.server.standin
        q = {k: v[0] for k, v in query.items()}
        fields = [q.get(k, "") for k in ("repo", "commit", "filename", "Expires")]
        denied = not SHA256_RE.match(sha256) or not all(fields) or not hmac.compare_digest(
            q.get("Signature", ""), standin._sign(sha256, *fields))
        if not denied and (not fields[3].isdigit() or int(fields[3]) < time.time()):
            denied = True
        if denied:
            body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code>" \
                   b"<Message>Access denied</Message></Error>"
            return self._send(403, body, head, content_type="application/xml")
        entry = standin._by_sha256.get(sha256)
        if entry is None:
            return self._send(404, b"Not Found", head, content_type="text/plain")
        name = entry.path.rsplit("/", 1)[-1]
        headers = {
            "ETag": f'"{sha256}"',
            "Cache-Control": "public, max-age=604800, immutable",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}; filename=\"{_header_safe(name).replace(chr(34), '')}\";",
        }
        if standin.cdn == "same":
            headers["X-Repo-Commit"] = fields[1]  # on the Hub's origin, as a Hub endpoint answers (see the docstring)
        flip_at = entry.size // 2 if standin.corrupt_cdn_path == fields[2] and entry.size else None
        self._content(entry, head, "application/octet-stream", headers, flip_at=flip_at, cut_key=sha256)

    def _content(self, entry: FileEntry, head: bool, content_type: str, headers: dict,
                 flip_at: int | None = None, cut_key: str | None = None):
        """The entry's bytes, with Range (206/416) honoured, perhaps cut short once (cut_after_bytes)."""
        size, start, end, status = entry.size, 0, entry.size, 200
        headers = {**headers, "Accept-Ranges": "bytes"}
        span = _parse_range(self.headers.get("Range"), size)
        if span == "unsatisfiable":
            return self._send(416, b"", head, {**headers, "Content-Range": f"bytes */{size}"}, content_type)
        if span is not None:
            (start, end), status = span, 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(end - start))
        self.send_header("X-Request-Id", f"Root={uuid.uuid4()}")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if head:
            return
        standin = self.server.standin
        limit = standin.cut_after_bytes
        if cut_key is None or limit is None or end - start <= limit or not standin._take_cut(cut_key):
            limit = None
        sent = 0
        for chunk in entry.chunks(start, end, flip_at):
            if limit is not None and sent + len(chunk) >= limit:
                self.wfile.write(chunk[:limit - sent])
                self.wfile.flush()
                self.close_connection = True  # the connection ends mid-body, as a dropped one does
                return
            self.wfile.write(chunk)
            sent += len(chunk)


def _parse_range(header: str | None, size: int):
    """(start, end) of a single `bytes=` range, "unsatisfiable", or None to ignore it (absent, invalid,
    several ranges: the whole body with 200, as RFC 9110 allows)."""
    m = RANGE_RE.match(header) if header is not None else None
    if m is None or not (m.group(1) or m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:  # the last N bytes
        n = int(last)
        return "unsatisfiable" if n == 0 or size == 0 else (max(size - n, 0), size)
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(int(last) + 1, size) if last else size


@contextmanager
def serving(repos, host: str = "127.0.0.1", *, cdn: str = "same"):
    """Run the stand-in on an ephemeral port in threads: yields (server, endpoint_url)."""
    server = HubStandIn(repos, host=host, port=0, cdn=cdn).start()
    try:
        yield server, server.endpoint
    finally:
        server.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A stand-in for the Hugging Face Hub (TEST INFRASTRUCTURE).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--repo", action="append", required=True, metavar="ORG/NAME=FOLDER")
    parser.add_argument("--private-token-file", help="every repo given is private, its token this file's content")
    parser.add_argument("--cdn-port", type=int, help="serve the CDN on this port (another origin, as the Hub's CDN)")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    token = None
    if args.private_token_file:
        with open(args.private_token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            parser.error("the token file is empty")
    repos = []
    for spec in args.repo:
        repo_id, sep, folder = spec.partition("=")
        if not sep:
            parser.error(f"--repo {spec!r}: ORG/NAME=FOLDER")
        repos.append(Repo.from_folder(repo_id, folder, private=token is not None, token=token))
    server = HubStandIn(repos, host=args.host, port=args.port, cdn="separate" if args.cdn_port else "same",
                        cdn_port=args.cdn_port or 0, verbose=args.verbose)
    server.page_size = max(1, args.page_size)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    print(f"hub stand-in on {server.endpoint} (CDN {server.cdn_endpoint})", flush=True)
    for repo in repos:
        print(f"repo {repo.repo_id} commit {repo.commit} files {len(repo.entries)}"
              f"{' private' if repo.private else ''}", flush=True)
    while not stop.wait(1):
        pass
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
