"""rigkit's SSH connections without Nagle's delay.

paramiko leaves TCP_NODELAY off. Each small command then waits for a delayed ACK before
its last packet goes out: ~40-50 ms a round trip on Linux loopback (FIELD-NOTES, "SSH
round trips"), ~6 ms with the option set. OpenSSH's own client sets it for interactive
sessions. pyinfra's SSH connector (3.x) does not; until it does upstream, deploy.py and
verify.py set it on each host's connection once it is open. It changes nothing but the
timing: the bytes sent are the same.
"""

from __future__ import annotations

import functools
import logging
import socket

import paramiko
from pyinfra.api.exceptions import OperationError

# What a connection lost in the middle of a python.call looks like from paramiko and the sockets.
LOST_CONNECTION_ERRORS = (paramiko.SSHException, EOFError, ConnectionError, socket.timeout)


def tcp_nodelay(host) -> bool:
    """Set TCP_NODELAY on `host`'s SSH socket; False where there is none (local connector, a
    proxy-jump channel)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True


def quiet_paramiko() -> None:
    """paramiko's transport thread logs a failed handshake (a port that accepts TCP but sends no SSH
    banner) with a traceback on stderr; the caller already reports the failure in one line."""
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


def named_connect_error(address: str, timeout_s: float, error: object) -> str | None:
    """One line for an SSH handshake that never began, naming the wait; None for other errors."""
    text = str(error)
    if "banner" in text.lower() or "No existing session" in text:
        return (f"no SSH banner from {address} within {timeout_s:g} s: the port accepts TCP connections "
                "but nothing answers as an SSH server there (a wrong ssh_port, or sshd hung?)")
    return None


def rig_call(function):
    """`function` as a python.call callback whose lost SSH connection (the rig rebooted, the network
    dropped) ends the operation with one line saying so. pyinfra prints any exception other than an
    OperationError raised in a callback as a traceback, and then only "No hosts remaining!"."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except LOST_CONNECTION_ERRORS as exc:
            raise OperationError(
                f"lost the SSH connection to the rig ({type(exc).__name__}: {exc or 'closed'}): was it rebooted, "
                "or did the network drop? Deploy again once it answers: an interrupted rollout is seen as "
                "pending and finished then") from None

    return call
