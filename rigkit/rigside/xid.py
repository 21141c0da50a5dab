"""Xid errors per GPU, counted from NVML's events: what the monitoring exporter reports of them.

NVML has no Xid counter to read at scrape time: it delivers each Xid as an event, to an event set
the reader registered beforehand (nvmlDeviceRegisterEvents with nvmlEventTypeXidCriticalError), and
only once. So a background thread of the exporter waits on its event set in bounded waits
(nvmlEventSetWait_v2 with a timeout of WAIT_MS, so it notices a stop and never blocks anything
else), and counts what arrives; a scrape reads the counts without calling NVML for them. Xids
before the exporter started are not seen (the kernel log has them: `journalctl -k | grep Xid`).

Standard library only; `nvml` is the pynvml module (nvidia-ml-py) or a stand-in with its names.
"""

from __future__ import annotations

import threading

XID_EVENT = 0x8  # pynvml.nvmlEventTypeXidCriticalError
NVML_ERROR_NOT_SUPPORTED = 3  # pynvml's: the GPU does not have the event type
NVML_ERROR_TIMEOUT = 10  # pynvml.NVML_ERROR_TIMEOUT: the wait ended without an event
WAIT_MS = 1000  # one wait on the event set; the thread checks for a stop between waits
RETRY_S = 30  # after NVML failed (not loaded yet, a driver reload): register again this much later


class XidCounts:
    """What the watcher saw, shared with the scrapes: per GPU index, the Xids counted since it
    started watching that GPU and the last Xid's value."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watched: tuple[int, ...] = ()
        self._counts: dict[int, int] = {}
        self._last: dict[int, int] = {}

    def watching(self, gpus) -> None:
        with self._lock:
            self._watched = tuple(sorted(gpus))

    def record(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._counts[gpu] = self._counts.get(gpu, 0) + 1
            self._last[gpu] = xid

    def snapshot(self) -> dict[int, tuple[int, int]]:
        """{GPU index: (Xids counted, the last Xid or 0)} for every GPU whose Xid events are watched."""
        with self._lock:
            return {gpu: (self._counts.get(gpu, 0), self._last.get(gpu, 0)) for gpu in self._watched}


def _timed_out(nvml, exc: Exception) -> bool:
    timeout = getattr(nvml, "NVMLError_Timeout", None)
    return (isinstance(timeout, type) and isinstance(exc, timeout)) or getattr(exc, "value", None) == NVML_ERROR_TIMEOUT


def register(nvml, gpus) -> tuple[object, list[int]]:
    """A new event set with Xid events registered for each of `gpus` that has them (a GPU whose NVML
    does not support them is left out); returns (the set, the GPUs watched)."""
    event_set = nvml.nvmlEventSetCreate()
    watched = []
    for index in gpus:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            if nvml.nvmlDeviceGetSupportedEventTypes(handle) & XID_EVENT:
                nvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
                watched.append(index)
        except Exception as exc:  # NVMLError_NotSupported: not on this GPU; anything else is NVML failing
            if getattr(exc, "value", None) != NVML_ERROR_NOT_SUPPORTED and "not supported" not in str(exc).lower():
                nvml.nvmlEventSetFree(event_set)
                raise
    return event_set, watched


def wait_once(nvml, event_set, counts: XidCounts, wait_ms: int = WAIT_MS) -> bool:
    """One bounded wait on the event set; an Xid that arrives is counted. True when one was."""
    wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
    try:
        data = wait(event_set, wait_ms)
    except Exception as exc:
        if _timed_out(nvml, exc):
            return False
        raise
    if not data.eventType & XID_EVENT:
        return False
    counts.record(int(nvml.nvmlDeviceGetIndex(data.device)), int(data.eventData))
    return True


def watch(nvml, gpus, counts: XidCounts, stop: threading.Event, say=print, wait_ms: int = WAIT_MS,
          retry_s: float = RETRY_S) -> None:
    """Count Xids of `gpus` into `counts` until `stop` is set (the exporter's thread). NVML failing
    ends the GPUs' watch (counts.snapshot then leaves them out) until a registration succeeds again."""
    said, initialised = None, False
    while not stop.is_set():
        event_set = None
        try:
            if not initialised:
                nvml.nvmlInit()  # NVML counts its inits: the scrapes' own stays theirs
                initialised = True
            event_set, watched = register(nvml, gpus)
            counts.watching(watched)
            if said != "watching":
                say(f"watching Xid events of GPUs {watched}" if watched else
                    "no GPU here reports Xid events through NVML; Xid metrics are left out")
                said = "watching"
            if not watched:
                stop.wait(retry_s)
                continue
            while not stop.is_set():
                wait_once(nvml, event_set, counts, wait_ms)
        except Exception as exc:  # pynvml.NVMLError and kin: NVML down or reloaded; try again later
            counts.watching(())
            initialised = False
            if said != "failed":
                say(f"Xid events cannot be watched ({exc}); trying again every {retry_s:g} s")
                said = "failed"
            stop.wait(retry_s)
        finally:
            if event_set is not None:
                try:
                    nvml.nvmlEventSetFree(event_set)
                except Exception:  # NVML already gone: nothing left to free
                    pass
