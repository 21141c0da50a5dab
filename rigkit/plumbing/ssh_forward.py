"""Reach a port on the rig's loopback from the control machine, through the deploy's SSH connection.

vLLM binds 127.0.0.1 on the rig, so the benchmark goes through a local port
forwarded over the existing paramiko transport (`direct-tcpip` channels), like
`ssh -L`; the rig's Docker Engine is reached the same way through `docker system
dial-stdio`. Under pyinfra's gevent the threads here are greenlets.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from contextlib import contextmanager


def _pump(source, sink) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.close()
            except OSError:
                pass


@contextmanager
def forward(transport, remote_port: int, remote_host: str = "127.0.0.1"):
    """Yield a local port on 127.0.0.1 that connects to remote_host:remote_port on the rig."""
    with _serve(lambda address: transport.open_channel("direct-tcpip", (remote_host, remote_port), address)) as port:
        yield port


# Run by the rig's login shell as the SSH session's command; its stdin and stdout become one
# connection to the Engine API. A connector may name another spelling (`docker_dial_command`).
DOCKER_DIAL_COMMAND = "docker system dial-stdio"


@contextmanager
def forward_docker(transport, dial_command: str = DOCKER_DIAL_COMMAND):
    """Yield the path of a local Unix socket that speaks to the rig's Docker Engine, as
    `ssh host docker system dial-stdio` does for the docker CLI (`dial_command`: the
    connector's spelling of that command, e.g. `docker.exe ...` on Windows): use it as
    docker.DockerClient(base_url=f"unix://{path}"). The Engine API is root on the rig, so
    the socket lives in a folder only the deploying user can enter (a TCP port on loopback
    would be open to every local user)."""

    def dial(address):
        channel = transport.open_session()
        channel.exec_command(dial_command)
        return channel

    with tempfile.TemporaryDirectory(prefix="rigkit-docker-") as folder:  # mode 700
        path = os.path.join(folder, "docker.sock")
        with _serve(dial, unix_path=path):
            yield path


OPEN_RETRY_S = 10.0  # sshd frees a closed session's slot (MaxSessions, 10 by default) a moment later


def _open_with_retries(open_channel, address):
    """A channel, or None. A refusal is retried for a few seconds: a client that opens
    connections in quick succession (the docker SDK replacing pooled ones) can briefly hold
    more sessions than sshd's MaxSessions while the closed ones are still being torn down."""
    deadline = time.monotonic() + OPEN_RETRY_S
    while True:
        try:
            return open_channel(address)
        except Exception:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)


@contextmanager
def _serve(open_channel, unix_path: str | None = None):
    if unix_path:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(unix_path)
        os.chmod(unix_path, 0o600)
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.5)
    stop = threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                client, address = listener.accept()
            except (socket.timeout, OSError):
                continue
            channel = _open_with_retries(open_channel, address)
            if channel is None:  # the rig refused: close this connection, keep serving
                client.close()
                continue
            threading.Thread(target=_pump, args=(client, channel), daemon=True).start()
            threading.Thread(target=_pump, args=(channel, client), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield unix_path or listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()
