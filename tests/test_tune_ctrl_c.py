"""Ctrl-C reaches `rigkit tune`'s main greenlet, where the sweep's `finally` restores the rig.

Real: gevent's monkey-patching exactly as `rigkit tune` gets it (by importing pyinfra_cli to read
the inventory), threads that are greenlets, a real SIGINT. Simulated: paramiko's transport thread,
played by a busy thread. Without rigkit's handler, the interrupt is raised in whichever greenlet
runs at that moment (here the one sending it), the main greenlet never sees it, and a sweep would
neither stop nor restore: that is what made tests/test_tune_rig.py::test_ctrl_c_restores_at_once
hang once in a full-suite run.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROBE = r'''
import os, signal, sys, threading, time
import pyinfra_cli.inventory  # patches the standard library with gevent, as `rigkit tune` does
from rigkit.tune.command import _ctrl_c_to_main_greenlet
_ctrl_c_to_main_greenlet()
state = {"worker": "running"}
def worker():  # stands in for paramiko's transport thread: busy, yielding now and then
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            sum(range(20000))
            time.sleep(0)
        state["worker"] = "finished"
    except KeyboardInterrupt:
        state["worker"] = "killed by Ctrl-C"
threading.Thread(target=worker, daemon=True).start()
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    threading.Event().wait(5)
    print("main: not interrupted;", state["worker"])
except KeyboardInterrupt:
    print("main: interrupted;", state["worker"])
'''


def test_ctrl_c_interrupts_the_main_greenlet_and_no_other():
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert run.stdout.strip() == "main: interrupted; running", run.stdout + run.stderr
