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
import os
import socket
import subprocess
import time

import paramiko
from pyinfra.api.exceptions import OperationError

from rigkit.config.inventory import HOST_KEY_CHECKING

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


SESSION_RETRY_S = 10.0  # how long a session refused past sshd's MaxSessions is asked for again


class GcmFirstTransport(paramiko.Transport):
    """paramiko's Transport asking for AES-GCM first (then its usual order: a server without GCM gets
    what it got before), and asking again for a session sshd refused past its MaxSessions (open_channel). paramiko's own first choice, aes128-ctr with hmac-sha2-256, costs the
    controller's CPU twice per byte; measured through one channel from the simulated rig's OpenSSH,
    1 GiB each way: receive 345-376 MB/s (ctr) vs 596-645 MB/s (gcm), send 161-185 vs 214-253 MB/s.
    The deploy's connection carries little bulk (the weights relay has its own `ssh`, openssh_command);
    what it does carry (the rig engine's API through `docker system dial-stdio`, files put on the rig)
    costs the controller less CPU so."""

    _preferred_ciphers = tuple(sorted(paramiko.Transport._preferred_ciphers, key=lambda name: "-gcm@" not in name))

    def open_channel(self, kind, *args, **kwargs):
        """A session sshd refuses ("Connect failed": past its MaxSessions, 4 in some hardened configs) is asked
        for again until SESSION_RETRY_S: a finished command's session is freed only once sshd has read the
        client's close, which can still be on its way (the deploy's read-aheads, pyinfra's own command and the
        engine API's `docker system dial-stdio` share one connection). Any other refusal, or one that lasts,
        is raised as before."""
        deadline, pause = time.monotonic() + SESSION_RETRY_S, 0.02
        while True:
            try:
                return super().open_channel(kind, *args, **kwargs)
            except paramiko.ChannelException as error:
                if kind != "session" or error.code != paramiko.OPEN_FAILED_CONNECT_FAILED or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)  # gevent's sleep in a deploy (pyinfra patches time): other greenlets run meanwhile
            pause = min(pause * 2, 0.5)


def gcm_first_transport(sock, **kwargs) -> paramiko.Transport:
    """paramiko's `transport_factory` hook (SSHClient.connect), set for every rig in group_data/all.py."""
    return GcmFirstTransport(sock, **kwargs)


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
    """`function` as a python.call callback that fails its operation in one line: an OperationError
    it raises, or a lost SSH connection (the rig rebooted, the network dropped), is logged as the
    host's error and the operation fails. pyinfra prints any exception raised in a callback with its
    traceback ("Unexpected error in Python callback"); a callback taking `state` and `host` instead
    returns its status (pyinfra.api.command.FunctionCommand.execute), which is what this does."""

    @functools.wraps(function)
    def call(state, host, *args, **kwargs):
        from pyinfra import logger
        from pyinfra.context import ctx_config, ctx_host

        with ctx_config.use(state.config.copy()), ctx_host.use(host):
            try:
                function(*args, **kwargs)
            except OperationError as exc:
                message = str(exc)
            except LOST_CONNECTION_ERRORS as exc:
                message = lost_connection_text(exc)
            else:
                return True
        host.log_styled(message, fg="red", log_func=logger.error)
        return False

    return call


def lost_connection_text(error: BaseException | None) -> str:
    """One line for a command or call cut off by a lost SSH connection; `error` where one was raised."""
    what = f" ({type(error).__name__}: {error or 'closed'})" if error is not None else ""
    return (f"lost the SSH connection to the rig{what}: was it rebooted, or did the network drop? Deploy "
            "again once it answers: an interrupted rollout is seen as pending and finished then")


KEEPALIVE_S, KEEPALIVE_COUNT = 15, 20  # a silent rig is given up after 300 s (the weights relay's stall rule)


@functools.cache
def gcm_first_option() -> tuple[str, ...]:
    """OpenSSH's client asked for AES-GCM first (its default is chacha20-poly1305, which the AES
    instructions of any recent CPU do not speed up), the rest of its list kept: `-o Ciphers=^...`,
    where this `ssh` knows the `^` form (`ssh -G` parses it without connecting)."""
    option = ("-o", "Ciphers=^aes128-gcm@openssh.com")
    try:
        parsed = subprocess.run(["ssh", "-G", *option, "rigkit-check"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return option if parsed.returncode == 0 else ()


def _config_path(path: str) -> str:
    """A path as an ssh_config value: quoted (spaces), its % doubled (ssh expands %-tokens in it)."""
    return '"' + os.path.expanduser(path).replace("%", "%%") + '"'


def openssh_command(target) -> list[str] | None:
    """OpenSSH's `ssh` reaching a rig as pyinfra's connection to it does (an SshTarget from
    rigkit.config.inventory: hostname, port, user, key, SSH config, known hosts and their checking),
    never prompting (BatchMode), the remote command to follow; None where it cannot (SshTarget.openssh_refusal)."""
    if target.openssh_refusal() is not None:
        return None
    checking = HOST_KEY_CHECKING[target.strict_host_key_checking]
    argv = ["ssh", "-T", "-x", "-a", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={checking}",
            "-o", "ConnectTimeout=30", "-o", f"ServerAliveInterval={KEEPALIVE_S}",
            "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}", "-o", "LogLevel=ERROR",
            # its own connection: a shared master would ignore these options and outlive a kill
            "-o", "ControlMaster=no", "-o", "ControlPath=none", *gcm_first_option()]
    if target.config_file:
        argv += ["-F", os.path.expanduser(target.config_file)]
    if target.known_hosts_file:
        argv += ["-o", f"UserKnownHostsFile={_config_path(target.known_hosts_file)}"]
    if target.key_file:  # that key only, as pyinfra (no agent, no default keys)
        argv += ["-o", f"IdentityFile={_config_path(target.key_file)}", "-o", "IdentitiesOnly=yes"]
    if target.port != 22:  # else the SSH config's Port, as pyinfra reads it there
        argv += ["-p", str(target.port)]
    if target.user:
        argv += ["-l", str(target.user)]
    return [*argv, "--", target.hostname]
