"""The rig's Docker Engine as a docker SDK client, through the deploy's SSH connection.

Each connection the SDK opens becomes one SSH session on the rig (`docker system
dial-stdio`), and sshd allows 10 sessions per connection (MaxSessions). The SDK's Unix
socket adapter keeps one connection pool *per request URL* (docker-py: every container
ID, every endpoint), so an idle connection stays open for each URL it has called: ten
calls into a copy, the rig refuses the next session. One pool, replaced as the URL
changes, keeps at most a request's worth of sessions open.
"""

from __future__ import annotations

from contextlib import contextmanager

from rigkit.plumbing.ssh_forward import DOCKER_DIAL_COMMAND, forward_docker

DOCKER_API_TIMEOUT_S = 60  # one Engine API call (a copy's own wait is longer: volumes.COPY_TIMEOUT_S)


def one_pool(client) -> None:
    """Make the client's Unix socket adapter keep a single connection pool (closing the one it replaces)."""
    adapter = client.api.get_adapter("http+docker://")
    if hasattr(adapter, "pools"):
        adapter.pools = type(adapter.pools)(1, dispose_func=lambda pool: pool.close())


def dial_command(connector) -> str:
    """How the deploy's connector asks the rig for a Docker Engine connection: its
    `docker_dial_command` (the Windows connector names `docker.exe`), else the docker CLI's own."""
    return getattr(connector, "docker_dial_command", DOCKER_DIAL_COMMAND)


@contextmanager
def rig_engine(transport, dial: str = DOCKER_DIAL_COMMAND):
    """Yield a docker.DockerClient for the rig reached over `transport` (a paramiko Transport);
    `dial`: the command that connects the session to the Engine (`dial_command`)."""
    import docker  # the SDK costs an import only when a copy runs

    with forward_docker(transport, dial) as path:
        client = docker.DockerClient(base_url=f"unix://{path}", timeout=DOCKER_API_TIMEOUT_S, max_pool_size=1)
        one_pool(client)
        try:
            yield client
        finally:
            client.close()
