"""Which on-demand model holds the GPUs, and when that changes: requests for a model that is not loaded are
held, never refused, while the models in its way finish what they serve and are parked; the model is then
woken and proven (rigside.engine_control), and the held requests go on. A model nobody asked for in its
idle time is stopped, asleep or not (checkpointed, where its swap is a checkpoint): a sleeping engine keeps
its CUDA context, and with it its GPUs out of their empty idle; sleep is for swaps, where the next wake comes
soon. A model that could not be loaded proven is failed and its container stopped. Standard library only (it runs in
rigkit-ondemand on the rig). docs/on-demand.md.

One thread (run) does every park and wake, so two swaps never race; request threads only wait (enter) and
count themselves out (leave). Every wait is bounded: a request held longer than hold_s is answered with a
clear error naming what it waited for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .engine_control import EngineError

TURN_S = 2.0  # a model just woken serves at least this long before another waiting model takes its GPUs
FAILED_RETRY_S = 10.0  # a model that could not be woken is tried again this long after, on a new request


class Held(Exception):
    """A request not served: str() says which model it waited for, how long and for what."""


@dataclass
class Slot:
    engine: object  # rigside.engine_control.Engine (or a test's object with park/wake/name)
    conflicts: set = field(default_factory=set)  # models that cannot be loaded beside this one
    idle_park_s: float = 600.0
    state: str = "unknown"  # awake, parked, failed
    parked_as: str = ""  # asleep (its CUDA context stays), checkpointed or stopped (nothing of it on its GPUs)
    in_flight: int = 0
    waiting: list = field(default_factory=list)  # arrival times of held requests
    closed: bool = False  # no new requests admitted: another model waits for these GPUs
    awake_since: float = 0.0
    last_used: float = 0.0
    failure: str = ""
    failed_at: float = 0.0


class Scheduler:
    def __init__(self, slots: dict[str, Slot], hold_s: float = 300.0, log=print, clocks=None):
        """`clocks`: rigside.parked_clocks.ParkedClocks, or None to leave clock locks alone."""
        self.slots, self.hold_s, self.log, self.clocks = slots, hold_s, log, clocks
        self.cond = threading.Condition()
        self.changed = threading.Event()  # set at each swap's end: its state written at once, not up to 2 s later
        self.stopping = False
        self.swaps = []  # (model, what was done, seconds): what `rigkit status` and tests read
        self.doing = ""  # the swap in progress, in words (a held request's error names it)
        self.target = None  # the model the models in its way are being parked for
        now = time.monotonic()
        for slot in slots.values():  # a model's idle time and turn count from when the scheduler took it on
            slot.awake_since = slot.awake_since or now
            slot.last_used = slot.last_used or now

    # -- request threads ----------------------------------------------------------------------------------
    def enter(self, name: str) -> None:
        """Wait until `name` is loaded and open, then count a request in. Raises Held past hold_s."""
        slot = self.slots[name]
        arrived = time.monotonic()
        deadline = arrived + self.hold_s
        with self.cond:
            slot.waiting.append(arrived)
            self.cond.notify_all()
            try:
                while not (slot.state == "awake" and not slot.closed):
                    left = deadline - time.monotonic()
                    if slot.state == "failed" and slot.failed_at >= arrived:
                        raise Held(f"model {name} could not be loaded: {slot.failure}")
                    if left <= 0 or self.stopping:
                        raise Held(f"model {name} was not loaded within {self.hold_s:g} s of the request; "
                                   f"rigkit-ondemand was {self.doing or self.blocking(name)}")
                    self.cond.wait(min(left, 1.0))
            finally:
                slot.waiting.remove(arrived)
            slot.in_flight += 1
            slot.last_used = time.monotonic()

    def leave(self, name: str) -> None:
        with self.cond:
            slot = self.slots[name]
            slot.in_flight -= 1
            slot.last_used = time.monotonic()
            self.cond.notify_all()

    def blocking(self, name: str) -> str:
        busy = [f"{other} ({self.slots[other].in_flight} in flight)" for other in sorted(self.slots[name].conflicts)
                if self.slots[other].state == "awake"]
        return f"waiting for {', '.join(busy)} to finish" if busy else "waiting for its turn"

    # -- the swap thread --------------------------------------------------------------------------------------
    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="swap", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def run(self) -> None:
        while True:
            with self.cond:
                if self.stopping:
                    return
                action = self.next_action()
                if action is None:
                    self.cond.wait(1.0)
                    continue
            self.act(*action)

    def next_action(self):
        """(verb, model) to do now, or None; called with the lock held. Marks the models in the way closed."""
        now = time.monotonic()
        wanted = sorted((min(s.waiting), name) for name, s in self.slots.items()
                        if s.waiting and s.state != "awake"
                        and not (s.state == "failed" and now - s.failed_at < FAILED_RETRY_S
                                 and min(s.waiting) <= s.failed_at))
        if self.target in [name for _, name in wanted]:  # the model whose way is being cleared goes first
            wanted.sort(key=lambda pair: pair[1] != self.target)
        for _, name in wanted:
            self.target = name
            in_way = [other for other in self.slots[name].conflicts if self.slots[other].state == "awake"]
            for other in in_way:
                blocker = self.slots[other]
                if now - blocker.awake_since >= TURN_S or not (blocker.in_flight or blocker.waiting):
                    blocker.closed = True
            idle = [other for other in in_way if self.slots[other].closed and not self.slots[other].in_flight]
            if idle:
                return "park", idle[0]
            if not in_way:
                return "wake", name
        for name, slot in self.slots.items():  # stopped after their idle time, awake or asleep
            idle = not slot.in_flight and not slot.waiting and now - slot.last_used >= slot.idle_park_s
            if idle and (slot.state == "awake" or (slot.state == "parked" and slot.parked_as == "asleep")):
                slot.closed = True
                return "stop", name
        return None

    def act(self, verb: str, name: str) -> None:
        slot = self.slots[name]
        self.doing = {"park": "parking", "stop": "stopping", "wake": "loading"}[verb] + f" {name}"
        started = time.monotonic()
        try:
            if verb == "wake":
                if self.clocks:  # the policy's clock lock back before the model's first token
                    self.clocks.before_load(name)
                done, state, parked_as = slot.engine.wake(), "awake", ""
            else:
                (done, parked_as), state = slot.engine.park(deep=verb == "stop"), "parked"
                if verb == "stop":
                    done = f"idle {slot.idle_park_s:g} s: {done}"
            failure = ""
        except EngineError as error:
            done, state, parked_as, failure = f"failed: {error}", "failed", "", str(error)
        except Exception as error:  # anything else is said and kept too: the swap thread must not end unseen
            done, state, parked_as = f"failed: {type(error).__name__}: {error}", "failed", ""
            failure = f"{type(error).__name__}: {error}"
        if state == "failed" and verb == "wake":
            # not proven, but maybe holding its GPUs: never left beside the next model the scheduler loads there
            done += f"; {slot.engine.halt()}"
        seconds = time.monotonic() - started
        self.log(f"rigkit-ondemand: {name}: {done} ({seconds:.2f} s)")
        with self.cond:
            self.swaps.append((name, done, round(seconds, 3)))
            del self.swaps[:-100]
            slot.state, slot.failure, slot.closed = state, failure, False
            slot.parked_as = parked_as
            if state == "awake":
                slot.awake_since = slot.last_used = time.monotonic()
            if state == "failed":
                slot.failed_at = time.monotonic()
            self.doing = ""
            self.cond.notify_all()
            self.changed.set()
            # busy: loaded, or wanted now (its GPUs' locks would only be put back at once)
            busy = {n for n, s in self.slots.items() if s.state == "awake" or s.waiting}
        if self.clocks:  # a GPU no awake model uses gives its clock lock back
            try:
                self.clocks.settle(busy)
            except Exception as error:  # said, never the end of the swap thread
                self.log(f"rigkit-ondemand: clock locks not settled: {type(error).__name__}: {error}")
