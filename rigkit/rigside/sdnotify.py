"""systemd's notify protocol (sd_notify): READY=1 for a Type=notify unit, WATCHDOG=1 as the
heartbeat WatchdogSec waits for. A rig-side program stuck in a hung NVML call stops sending it and
systemd restarts it (the GPU policy keeper, the monitoring exporter)."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> None:
    """Send `message` to systemd; nothing when not run by systemd (no NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), address)
    except OSError:
        pass
