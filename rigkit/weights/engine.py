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

from rigkit.sshforward import forward_docker

DOCKER_API_TIMEOUT_S = 60  # one Engine API call (a copy's own wait is longer: volumes.COPY_TIMEOUT_S)


def one_pool(client) -> None:
    """Make the client's Unix socket adapter keep a single connection pool (closing the one it replaces)."""
    adapter = client.api.get_adapter("http+docker://")
    if hasattr(adapter, "pools"):
        adapter.pools = type(adapter.pools)(1, dispose_func=lambda pool: pool.close())


@contextmanager
def rig_engine(transport):
    """Yield a docker.DockerClient for the rig reached over `transport` (a paramiko Transport)."""
    import docker  # the SDK costs an import only when a copy runs

    with forward_docker(transport) as path:
        client = docker.DockerClient(base_url=f"unix://{path}", timeout=DOCKER_API_TIMEOUT_S, max_pool_size=1)
        one_pool(client)
        try:
            yield client
        finally:
            client.close()
