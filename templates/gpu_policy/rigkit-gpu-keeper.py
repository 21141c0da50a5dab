#!/usr/bin/python3
"""rigkit GPU policy keeper: re-applies the rig's GPU policy when the GPUs lose it between deploys.

Installed by rigkit (role gpu_policy) beside the boot unit; Python 3 standard library plus pynvml
(the rig's nvidia-ml-py, else the copy rigkit ships). Usage:

    rigkit-gpu-keeper watch            rigkit-gpu-keeper.service: a light watch of each GPU's
                                       enforced power limit (NVML, every WATCH_S)
    rigkit-gpu-keeper repair CAUSE     resume (rigkit-gpu-keeper-resume.service, pulled in by the
                                       sleep targets) or driver (rigkit-gpu-keeper-driver.service,
                                       part of nvidia-persistenced.service): re-apply now

A repair runs the policy script (`rigkit-gpu-policy apply`: limits, clock locks, clock offsets),
reads the enforced limits back, and is logged with its cause (resume, driver, reset,
changed-by-hand) and counted in STATE_PATH (JSON, written atomically), which `rigkit status`
reads. The watch names a limit found back at the GPU's default `reset` (what a GPU reset or a
driver reload leaves) and any other value `changed-by-hand`.

It never fights rigkit: nothing is repaired while `rigkit tune` holds its session (its dead man's
switch timer is active), while the policy unit runs (a deploy applying a policy), or while the
policy file is newer than the last policy applied (a deploy between writing and applying it); with
no policy file (`gpu_policy: remove`) it does nothing. Holds are checked only when a limit
differs, so an idle watch costs a few NVML reads per GPU per WATCH_S.

The watch also samples each GPU's energy, power and utilization for the idle-energy ledger
(rigside.idle_energy, IDLE_ENERGY_PATH): what the GPUs drew while idle, per hour, which `rigkit
status` and the exporter read. It is saved every 15 s and when the keeper is stopped.

A repair decides on the policy it applies, under the lock it applies it with: it reads the policy
file's bytes once, under LOCK_PATH (which the policy script takes too, so a deploy's or a boot's
apply waits for the repair), checks the hold on those bytes, runs the script on a copy of them
and reads the limits back against them. A deploy that writes a new policy meanwhile is applied
after the repair, by its own run of the script; the repair is not judged against a file it did
not apply (a 300 -> 330 W deploy once made a repair log a false NOT HELD and back off 30 s).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

# The rig-side runtime (rigkit/rigside), shipped by rigkit's rigside role before this keeper; this
# folder is rigkit.rigside.names.LIB_DIR (tests/test_layout.py keeps them equal).
sys.path.insert(0, os.environ.get("RIGKIT_LIB_DIR", "/usr/local/lib/rigkit"))
sys.dont_write_bytecode = True  # no __pycache__ beside the shipped files (the deploy owns that folder)
from rigside import atomic, idle_energy, lock, names  # noqa: E402
from rigside.sdnotify import notify  # noqa: E402

POLICY_PATH = names.GPU_POLICY_PATH
POLICY_SCRIPT = names.GPU_POLICY_SCRIPT_PATH
POLICY_UNIT = names.GPU_POLICY_UNIT
APPLIED_STAMP = names.GPU_POLICY_APPLIED_PATH  # sha256 of the policy file last applied (the script writes it)
STATE_PATH = names.GPU_KEEPER_STATE_PATH
IDLE_ENERGY_PATH = names.IDLE_ENERGY_PATH  # what the GPUs drew idle (rigside.idle_energy): status and the exporter read it
LOCK_PATH = names.GPU_KEEPER_LOCK_PATH
TUNE_TIMER = f"{names.TUNE_DEADMAN_UNIT}.timer"  # rigkit tune's dead man's switch: armed for the whole session
WATCH_S = 1.5
GRACE_S = 1.0  # after a change is seen: a resume or driver trigger arriving now names the cause
APPLY_TIMEOUT_S = 120
GPU_WAIT_S = 30  # how long the policy script waits for GPUs after a driver reload or resume
RETRY_AFTER_S = (30, 60, 120, 300, 600)  # a limit that did not hold after a repair: back off
EVENTS_KEPT = 20
TOLERANCE_W = 0.5
CAUSES = names.GPU_KEEPER_CAUSES  # the keys of the state file's counts (status and the exporter read them)
RESUME, DRIVER, RESET, CHANGED_BY_HAND = CAUSES

try:
    import pynvml
except ImportError:  # the copy rigkit ships (roles/gpu_policy.py)
    sys.path.insert(0, names.GPU_POLICY_NVML_DIR)
    import pynvml


def say(text):
    print(f"rigkit-gpu-keeper: {text}", flush=True)


def now_iso():
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_policy():
    """The policy file's bytes, read once, or None where there is none: a repair decides on these, applies
    these and stamps these, whatever a deploy writes to the file meanwhile."""
    try:
        with open(POLICY_PATH, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def policy(content=None):
    """{index: "330" | "default"} from the policy's bytes (read from the file when not given), or None
    where there is none."""
    content = read_policy() if content is None else content
    if content is None:
        return None
    wanted = {}
    for line in content.decode("utf-8", "replace").splitlines():
        cells = line.split()
        if cells and not cells[0].startswith("#") and len(cells) >= 2:
            wanted[int(cells[0])] = cells[1]
    return wanted


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def systemctl_show(unit, prop):
    try:
        done = subprocess.run(["systemctl", "show", unit, "-p", prop, "--value"], capture_output=True, text=True,
                              timeout=10)
        return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def hold_reason(content):
    """Why a repair must wait now, or None. `content`: the policy's bytes as read for this decision."""
    if content is None:
        return "no GPU policy on this rig (gpu_policy: remove)"
    if systemctl_show(TUNE_TIMER, "ActiveState") == "active":
        return "rigkit tune holds its session"
    if systemctl_show(POLICY_UNIT, "ActiveState") in ("activating", "deactivating", "reloading"):
        return "the policy unit is applying the policy (a deploy or a boot)"
    if atomic.bytes_sha256(content) != read_text(APPLIED_STAMP):
        return "the policy file differs from the last policy applied (a deploy is applying a new one)"
    return None


class Gpus:
    """NVML, initialised once and again after it failed (a driver reload)."""

    def __init__(self):
        self.handles = None
        self.lost = False  # NVML failed since it last answered: a driver reload or a GPU reset
        self.ledger_said = False  # a ledger that cannot be written is said once

    def read(self, indexes):
        """{index: (enforced W, default W)}, or None where NVML does not answer."""
        try:
            if self.handles is None:
                pynvml.nvmlInit()
                self.handles = {}
            found = {}
            for index in indexes:
                if index not in self.handles:
                    self.handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
                handle = self.handles[index]
                found[index] = (pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                                pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000.0)
            return found
        except pynvml.NVMLError as exc:
            self.lost_nvml(exc)
            return None

    def sample_energy(self, ledger, indexes):
        """Each GPU's energy, power and utilization into the idle-energy ledger (rigside.idle_energy). Never the
        end of the watch, whose job is the policy: a ledger that cannot be written (a full or read-only disk)
        is said once and tried again at the next save."""
        for index in indexes:
            try:
                ledger.add(index, time.monotonic(), *idle_energy.read_gpu(pynvml, self.handles[index]))
            except (pynvml.NVMLError, KeyError, TypeError, ValueError):  # the limits' next read says what NVML did
                ledger.forget(index)
        try:
            ledger.save()
            self.ledger_said = False
        except Exception as exc:
            if not self.ledger_said:
                say(f"cannot write the idle-energy ledger {IDLE_ENERGY_PATH} ({exc}); the policy is still watched")
            self.ledger_said = True

    def lost_nvml(self, exc):
        if not self.lost:
            say(f"NVML does not answer ({exc}); retrying every {WATCH_S} s")
        self.lost = True
        self.handles = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def wanted_w(want, default_w):
    return default_w if want == "default" else float(want)


def differing(wanted, found):
    """{index: (found W, wanted W)} for each GPU whose enforced limit is not the policy's."""
    out = {}
    for index, want in wanted.items():
        if index not in found:
            continue
        enforced, default = found[index]
        target = wanted_w(want, default)
        if abs(enforced - target) >= TOLERANCE_W:
            out[index] = (enforced, target)
    return out


def load_state():
    try:
        with open(STATE_PATH) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    state.setdefault("counts", {cause: 0 for cause in CAUSES})
    state.setdefault("events", [])
    return state


def save_state(state):
    """Atomic (rigside.atomic): a reader sees the old document or the new one, never half of one."""
    os.makedirs(os.path.dirname(STATE_PATH), exist_ok=True)
    atomic.write_text(STATE_PATH, json.dumps(state, indent=1))


def record(cause, before, after, ok, detail, seconds, held=None):
    state = load_state()
    if held is None:
        state["counts"][cause] = state["counts"].get(cause, 0) + 1
        state["events"] = (state["events"] + [{
            "time": now_iso(), "cause": cause, "ok": ok, "seconds": round(seconds, 2), "detail": detail,
            "gpus": [{"index": i, "found_w": round(f, 1), "wanted_w": round(w, 1),
                      "after_w": round(after[i][0], 1) if after and i in after else None}
                     for i, (f, w) in sorted(before.items())],
        }])[-EVENTS_KEPT:]
    state["holding"] = held
    state["updated"] = now_iso()
    save_state(state)
    _held["known"] = bool(held)


_held = {"known": None}  # whether the state file says "holding" (read once, then kept in step)


def clear_hold():
    """The policy holds again after a hold (a tune session restored it): the state file says so."""
    if _held["known"] is None:
        _held["known"] = bool(load_state().get("holding"))
    if _held["known"]:
        state = load_state()
        state["holding"] = None
        state["updated"] = now_iso()
        save_state(state)
        _held["known"] = False


def apply_policy(content):
    """(ok, the script's last line): the script run on `content` (the bytes decided on), under the lock the
    caller holds (the script would otherwise wait for it)."""
    env = dict(os.environ, RIGKIT_GPU_WAIT_S=str(GPU_WAIT_S), RIGKIT_GPU_POLICY_LOCK_HELD="1")
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(APPLIED_STAMP), prefix="gpu-policy.keeper.") as snapshot:
        snapshot.write(content)
        snapshot.flush()
        try:
            done = subprocess.run([POLICY_SCRIPT, "apply", snapshot.name], capture_output=True, text=True, env=env,
                                  timeout=APPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, f"{POLICY_SCRIPT} did not finish within {APPLY_TIMEOUT_S} s"
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    for line in lines:
        print(line, flush=True)
    return done.returncode == 0, (lines[-1] if lines else f"exit {done.returncode}")


def repair(gpus, cause, before, always):
    """Under the lock: re-apply (when `always`, or when a limit still differs), read back, record.
    Returns the limits that did not hold, {index: (found, wanted)}, or None when nothing was done."""
    with lock.held(LOCK_PATH):  # the policy script takes it too: a deploy's apply waits for this repair
        content = read_policy()
        wanted = policy(content)
        if wanted is None:
            return None
        held = hold_reason(content)
        if held:
            if load_state().get("holding") != held:
                say(f"not repairing ({cause}): {held}")
                record(cause, {}, None, False, held, 0, held=held)
            return None
        found = gpus.read(list(wanted))
        if not always:
            if found is None:
                return None
            before = differing(wanted, found)
            if not before:
                return None  # repaired meanwhile (a resume or driver trigger, a deploy)
        elif found is not None:
            before = {i: (found[i][0], wanted_w(w, found[i][1])) for i, w in wanted.items() if i in found}
        started = time.monotonic()
        ok, detail = apply_policy(content)
        after = gpus.read(list(wanted))
        failed = differing(wanted, after) if after is not None else {i: v for i, v in before.items()}
        ok = ok and not failed
        if failed and not detail.startswith("rigkit-gpu-policy: FAILED"):
            detail = "; ".join(f"GPU {i}: {f:.0f} W enforced after re-applying, policy says {w:.0f} W"
                               for i, (f, w) in sorted(failed.items()))
        seconds = time.monotonic() - started
        say(f"repaired ({cause}) in {seconds:.1f} s: " + ("; ".join(
            f"GPU {i} {f:.0f} W -> {wanted_w_after(after, i, w):.0f} W" for i, (f, w) in sorted(before.items()))
            or "re-applied") + ("" if ok else f"; NOT HELD: {detail}"))
        record(cause, before, after, ok, detail, seconds)
        return failed


def wanted_w_after(after, index, fallback):
    return after[index][0] if after and index in after else fallback


def classify(before, found):
    """A limit back at the GPU's default is what a GPU reset or driver reload leaves."""
    if found and all(abs(found[i][0] - found[i][1]) < TOLERANCE_W for i in before):
        return RESET
    return CHANGED_BY_HAND


def watch():
    gpus = Gpus()
    ledger = idle_energy.Ledger(IDLE_ENERGY_PATH)

    def stopped(signum, frame):  # systemd's stop: keep the ledger's last seconds
        try:
            ledger.save(force=True)
        except Exception as exc:
            say(f"stopping: cannot write the idle-energy ledger {IDLE_ENERGY_PATH} ({exc})")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)
    notify("READY=1")
    say(f"watching the enforced power limits every {WATCH_S} s ({POLICY_PATH})")
    policy_mtime, wanted = None, None
    backoff, retry_at = 0, 0.0
    while True:
        notify("WATCHDOG=1")
        try:
            mtime = os.stat(POLICY_PATH).st_mtime
        except FileNotFoundError:
            mtime, wanted = None, None
        if mtime is not None and mtime != policy_mtime:
            wanted = policy()
        policy_mtime = mtime
        if wanted:
            was_lost = gpus.lost
            found = gpus.read(list(wanted))
            if found is not None:
                gpus.lost = False
                gpus.sample_energy(ledger, list(found))
                before = differing(wanted, found)
                if was_lost:  # NVML came back: a driver reload; locks are gone whatever the limits say
                    time.sleep(GRACE_S)
                    failed = repair(gpus, DRIVER, before, always=True)
                elif before and time.monotonic() >= retry_at:
                    time.sleep(GRACE_S)
                    failed = repair(gpus, classify(before, found), before, always=False)
                else:
                    failed = None
                    if not before:
                        clear_hold()
                if failed:
                    retry_at = time.monotonic() + RETRY_AFTER_S[min(backoff, len(RETRY_AFTER_S) - 1)]
                    backoff += 1
                elif failed is not None:
                    backoff, retry_at = 0, 0.0
        time.sleep(WATCH_S)


def repair_now(cause):
    if cause == DRIVER and not driver_restarted_since_apply():
        say("nvidia-persistenced started before the policy was last applied (a boot): nothing to repair")
        return 0
    failed = repair(Gpus(), cause, {}, always=True)
    return 1 if failed else 0


def driver_restarted_since_apply():
    """At boot the policy unit runs after nvidia-persistenced: no repair then. systemd's monotonic
    timestamps (us) say which of the two became active last."""
    driver = systemctl_show("nvidia-persistenced.service", "ActiveEnterTimestampMonotonic")
    applied = systemctl_show(POLICY_UNIT, "ActiveEnterTimestampMonotonic")
    try:
        return int(driver) > int(applied)
    except ValueError:
        return True


def main(argv):
    if argv[1:2] == ["watch"]:
        watch()
    elif len(argv) == 3 and argv[1] == "repair" and argv[2] in (RESUME, DRIVER):
        return repair_now(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
