#!/usr/bin/python3
"""rigkit-exporter: the monitoring pack's exporter, one small process on the rig.

Installed by rigkit (role monitoring) as rigkit-exporter.service; Python 3 with Debian's
python3-prometheus-client and pynvml (the rig's nvidia-ml-py, else the copy rigkit ships). Usage:

    rigkit-exporter SETTINGS.json     serve /metrics on the settings' address and port

Every scrape reads NVML (per GPU: power, requested/enforced/default limits, SM and memory clocks,
temperature, clock event reasons, the energy counter, ECC counts where NVML has them) and rigkit's
own files: the GPU policy (configured caps and locks), the keeper's state (repairs by cause), the
watchdog's state per model (restarts), the last verification per model, the last proven start per model, the
keeper's idle-energy ledger (what the GPUs drew idle). Names and the metric set:
the rig-side runtime's rigside.metrics (DCGM's names where DCGM has the metric). Nothing is read
between scrapes (the cost follows the scrape interval), except Xid errors: NVML delivers them only
as events, which a thread waits for in bounded waits and counts (rigside.xid).

On the LAN (the settings' `key_file`), every request must carry the models' API key as
`Authorization: Bearer <key>`, as vLLM wants it; the unit copies the key's env file for it at each
start. Without the key the exporter does not start: it never serves the LAN open.

NVML is read by one reader thread at a time, started by a scrape; the scrape waits for it at most
the settings' `nvml_read_s` (5 s) counted from when that read began, then answers at once with
rigkit_exporter_nvml_up 0 and every series of rigkit's own files. A read stuck in a hung NVML call
(a wedged GPU or driver) stays the only one, and later scrapes do not wait on it: they answer
within a few milliseconds until it returns. The exporter is not restarted for it (a restart cannot
unwedge a driver; it looped: 30 s scrapes, a watchdog kill, no series between). The heartbeat to
systemd (WatchdogSec) stops only when the HTTP server's thread is gone.
"""

import os
import sys
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

# The rig-side runtime (rigkit/rigside), shipped by rigkit's rigside role before this exporter; this
# folder is rigkit.rigside.names.LIB_DIR (tests/test_layout.py keeps them equal).
sys.path.insert(0, os.environ.get("RIGKIT_LIB_DIR", "/usr/local/lib/rigkit"))
sys.dont_write_bytecode = True  # no __pycache__ beside the shipped files (the deploy owns that folder)
from rigside import atomic, keyfile, metrics, names, xid  # noqa: E402
from rigside.sdnotify import notify  # noqa: E402
from rigside.stack import STARTUP_FILE  # noqa: E402

try:
    from prometheus_client import REGISTRY, make_wsgi_app
    from prometheus_client import core
    from prometheus_client import gc_collector, platform_collector
except ImportError:
    print("rigkit-exporter: the Python module prometheus_client is missing: apt-get install python3-prometheus-client "
          "(rigkit's monitoring role installs it)", file=sys.stderr, flush=True)
    sys.exit(3)

try:
    import pynvml
except ImportError:  # the copy rigkit ships (roles/monitoring.py)
    sys.path.insert(0, names.MONITORING_NVML_DIR)
    import pynvml


HEARTBEAT_S = 5  # to systemd, well within the unit's WatchdogSec


def say(text):
    print(f"rigkit-exporter: {text}", flush=True)


class RigCollector:
    """prometheus-client calls collect() once per scrape."""

    def __init__(self, settings, xids):
        self.settings = settings
        self.xids = xids
        self.read_s = float(settings.get("nvml_read_s", 5))
        self.lock = threading.Lock()  # guards the reader's start: one NVML read at a time
        self.reader, self.read = None, None  # the reader thread, and {"since": t, "readings": ...} it fills
        self.nvml_ready = False
        self.nvml_said = False

    def describe(self):
        return []  # registering then reads nothing (no NVML call before the first scrape)

    def gpu_readings(self):
        """This scrape's NVML readings, or None: NVML failed, or has not answered within `read_s` of the
        read's start (that read goes on alone; the next scrape starts another only once it returned)."""
        with self.lock:
            if self.reader is None or not self.reader.is_alive():
                self.read = {"since": time.monotonic()}
                self.reader = threading.Thread(target=self._read_into, args=(self.read,), name="nvml", daemon=True)
                self.reader.start()
            reader, read = self.reader, self.read
        reader.join(max(0.0, read["since"] + self.read_s - time.monotonic()))
        return None if reader.is_alive() else read.get("readings")

    def _read_into(self, read):
        read["readings"] = self.read_gpus()

    def read_gpus(self):
        try:
            if not self.nvml_ready:
                pynvml.nvmlInit()
                self.nvml_ready = True
            readings = [metrics.read_gpu(pynvml, index) for index in self.settings["gpus"]]
            self.nvml_said = False
            return readings
        except Exception as exc:  # pynvml.NVMLError and kin: report nvml_up 0, try again next scrape
            if not self.nvml_said:
                say(f"NVML does not answer ({exc}); scrapes report NVML down until it does")
                self.nvml_said = True
            self.nvml_ready = False
            return None

    def read_files(self):
        s = self.settings
        try:
            with open(s["policy_path"]) as f:
                policy = metrics.parse_policy(f.read())
        except OSError:
            policy = {}
        keeper = atomic.read_json(s["keeper_state_path"])
        watchdog, verified, starts = {}, {}, {}
        for model in s["models"]:
            start = atomic.read_json(os.path.join(s["stacks_dir"], model, STARTUP_FILE))
            if isinstance(start, dict):
                starts[model] = start
            state = atomic.read_json(os.path.join(s["watchdog_state_dir"], f"{model}.json"))
            if isinstance(state, dict):
                watchdog[model] = state
            summary = atomic.read_json(os.path.join(s["verify_summary_dir"], f"{model}.json"))
            if isinstance(summary, dict):
                verified[model] = summary
        idle = atomic.read_json(s["idle_energy_path"]) if s.get("idle_energy_path") else None
        return policy, keeper if isinstance(keeper, dict) else None, watchdog, verified, starts, idle

    def collect(self):
        readings = self.gpu_readings()
        policy, keeper, watchdog, verified, starts, idle = self.read_files()
        families = metrics.build(readings, policy, keeper, watchdog, verified, self.settings["models"], time.time(),
                                 self.xids.snapshot(), starts, idle)
        yield from metrics.to_prometheus(families, core)


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds the exporter up


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):  # no line per scrape in the journal
        pass


def keyed(app, key):
    """The app behind the models' key: a request without it gets vLLM's answer, 401 Unauthorized."""
    def guarded(environ, start_response):
        if keyfile.authorized(environ.get("HTTP_AUTHORIZATION"), key):
            return app(environ, start_response)
        body = b'{"error": "Unauthorized"}'
        start_response("401 Unauthorized", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    return guarded


def lan_key(path):
    """The models' key from the exporter's copy of their env file (read as Compose reads it), or
    None with the reason said."""
    try:
        key = keyfile.env_value(path, keyfile.API_KEY_ENV_NAME)
    except OSError as exc:
        say(f"cannot read the API key at {path} ({exc.strerror or exc}); rigkit-exporter.service's ExecStartPre "
            "copies it there from the models' key file: not serving the LAN without it")
        return None
    if not key:
        say(f"{path} sets no {keyfile.API_KEY_ENV_NAME}: not serving the LAN without the key")
    return key or None


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    settings = atomic.read_json(argv[1])
    if not isinstance(settings, dict):
        say(f"cannot read the settings {argv[1]} (missing or not JSON); rigkit's monitoring role writes them")
        return 2
    key = lan_key(settings["key_file"]) if settings.get("key_file") else None
    if settings.get("key_file") and key is None:
        return 2  # never serve the LAN without the key
    for collector in (gc_collector.GC_COLLECTOR, platform_collector.PLATFORM_COLLECTOR):
        REGISTRY.unregister(collector)  # the process collector stays: process_cpu_seconds_total is the exporter's cost
    app = make_wsgi_app(REGISTRY) if key is None else keyed(make_wsgi_app(REGISTRY), key)
    xids = xid.XidCounts()
    collector = RigCollector(settings, xids)
    REGISTRY.register(collector)
    server = make_server(settings["address"], int(settings["port"]), app, ThreadingServer, handler_class=QuietHandler)
    http = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    http.start()
    threading.Thread(target=xid.watch, args=(pynvml, settings["gpus"], xids, threading.Event(), say), name="xid",
                     daemon=True).start()
    say(f"serving /metrics on {settings['address']}:{settings['port']}"
        f"{' (with the API key)' if key else ''} for GPUs {settings['gpus']}")
    notify("READY=1")
    while http.is_alive():
        notify("WATCHDOG=1")
        time.sleep(HEARTBEAT_S)
    say("the HTTP server stopped; exiting for systemd to restart the exporter")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
