"""One on-demand model's vLLM, driven from the rig: put to sleep, woken, stopped, started, and proven by a
canary after every wake. Standard library only (it runs in rigkit-ondemand on the rig).

vLLM's sleep routes are development routes (VLLM_SERVER_DEV_MODE=1): the engine of an on-demand model listens
on the rig's loopback only, where rigkit-ondemand reaches them; clients reach the model through the front
(rigside.front), which never passes those routes on. docs/on-demand.md.

The canary: one fixed greedy completion (temperature 0) with its logprobs, recorded from a start rigkit
proved, and asked again after every wake. A wake can answer healthy HTTP with corrupted output (public
reports of vLLM's sleep mode); the canary's tokens must be equal and each logprob within CANARY_TOLERANCE.

The proof file keeps the canary and the engine's /v1/models answer for the config they were recorded
with (the SHA-256 of its proven compose file): a rigkit-ondemand restarted (every deploy restarts it)
proves the next wake against it instead of restarting the model cold, and its front answers /v1/models
from it while the model is parked instead of loading it. A changed config leaves them unused until the
next proven start records them again.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from . import atomic, gpu_checkpoint
from .gpu_checkpoint import CheckpointError
from .keyfile import api_key as key_of
from .probe import NoAnswer, complete_at

CANARY_PROMPT = "The capital of France is Paris. The capital of Italy is"
CANARY_TOKENS = 8
CANARY_TOLERANCE = 0.02  # logprobs of one greedy decode on one GPU agree far closer; corruption is far off
MAX_ANSWER_BYTES = 1 << 20  # anything the engine sends is bounded before it is decoded
CALL_TIMEOUT_S = 30.0
CREATE_TIMEOUT_S = 1800  # rigkit-stack's bound on `compose up`, which may pull an image of many GB
# A sleep must free what the model held on its GPUs but its CUDA context: at most this much may stay (vLLM
# 0.14 once kept 16 GB per GPU after a sleep, vllm#32714; a context is a few hundred MiB).
LEFT_AFTER_SLEEP_MIB = 2048
LEFT_AFTER_SLEEP_SHARE = 0.10
# A level-1 sleep copies the weights, a checkpoint all the process's GPU memory, to host RAM: at most what the model
# holds on its GPUs. So much must be available, and this much more stay free for the rig itself; else the model is
# stopped instead (level 2 would discard the weights, which vLLM must then be given again through development RPC
# routes before a wake serves right: not done, docs/on-demand.md).
HOST_RAM_RESERVE_MIB = 4096
# A checkpoint releases the process's context too: what may stay is only what held_mib (a share of the card)
# overstates vLLM's real use by (with 2% of held_mib on top, memory_not_freed)
LEFT_AFTER_CHECKPOINT_MIB = 512


class EngineError(Exception):
    """The engine did not do what was asked; str() says what and what it answered."""


@dataclass
class Engine:
    """How to reach and drive one model's engine. `swap`: "sleep" (vLLM's sleep mode, level
    `sleep_level`), "checkpoint" (its CUDA processes parked by cuda-checkpoint, rigside.gpu_checkpoint: the
    tool at `checkpoint_tool`, the container's processes as `pids` prints them) or "stop" (the container is
    stopped and started again, warm from its compile cache). `stop` and `start`: the commands that stop and
    start its container (Compose's, built by rigkit)."""

    name: str
    served_name: str
    url: str  # http://127.0.0.1:PORT, the engine's own loopback port
    swap: str = "sleep"
    sleep_level: int = 1
    stop: list[str] = field(default_factory=list)
    start: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)
    # Where `start` finds no container (removed by hand, or by `docker container prune`, which removes every
    # stopped one, and a parked model's is stopped): the command that creates it again from the proven config,
    # and what gives its environment when it runs (rigside.keyfile.compose_env: the keys a rotation has the
    # servers accept now).
    create: list[str] = field(default_factory=list)
    create_env: object = None
    ready_timeout_s: float = 600.0
    # Where the models' key is read from for each call (a stack's settings: api_key_env_file), so a key rotated
    # while the program runs is the one sent; or the key itself (tests).
    key_settings: dict | None = None
    api_key: str | None = None
    canary: dict | None = None  # {"tokens": [...], "token_logprobs": [...]} of a start rigkit proved
    # What the model holds on its GPUs when loaded (MiB, all its GPUs together), and a command that prints the
    # MiB used on each of its GPUs, one number a line (nvidia-smi's memory.used): a sleep is proven by the drop.
    held_mib: int = 0
    memory_probe: list[str] = field(default_factory=list)
    # The proof file (above) and the config file whose digest it must name to be used; none: kept in memory only.
    proof_file: str | None = None
    config_file: str | None = None
    models: dict | None = None  # the engine's /v1/models answer, from its last proven start or wake
    checkpoint_tool: str = ""  # cuda-checkpoint, for swap "checkpoint"
    meminfo: str = "/proc/meminfo"  # the host's memory (MemAvailable): a park that copies to host RAM must fit
    pids: list[str] = field(default_factory=list)  # prints the container's processes' PIDs (docker top), one a line

    # -- the proof, kept across restarts of the program ------------------------------------------------------
    def load_proof(self) -> bool:
        """Take the canary and the models' answer from the proof file if it was recorded with the config in
        force now; whether it was."""
        proof = atomic.read_json(self.proof_file) if self.proof_file else None
        digest = atomic.sha256(self.config_file) if self.config_file else None
        if not isinstance(proof, dict) or digest is None or proof.get("config_sha256") != digest:
            return False
        canary, models = proof.get("canary"), proof.get("models")
        if not (isinstance(canary, dict) and isinstance(canary.get("tokens"), list)
                and isinstance(canary.get("token_logprobs"), list)):
            return False
        self.canary = canary
        self.models = models if isinstance(models, dict) else None
        return True

    def proven(self) -> None:
        """After the canary agreed: read /v1/models and keep it, with the canary, in the proof file."""
        try:
            status, answer = self.call("GET", "/v1/models", timeout_s=10)
        except OSError:
            status, answer = 0, None
        if status == 200 and isinstance(answer, dict) and isinstance(answer.get("data"), list):
            self.models = answer
        digest = atomic.sha256(self.config_file) if self.config_file else None
        if self.proof_file and digest:
            os.makedirs(os.path.dirname(self.proof_file), mode=0o700, exist_ok=True)
            atomic.write_text(self.proof_file, json.dumps(
                {"config_sha256": digest, "canary": self.canary, "models": self.models}) + "\n")

    # -- HTTP, bounded ------------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: dict | None = None, timeout_s: float = CALL_TIMEOUT_S):
        """(status, decoded JSON or None) of one request to the engine; raises OSError when it cannot be reached."""
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        key = self.key()
        if key and path.startswith("/v1/"):
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read(MAX_ANSWER_BYTES + 1)
        if len(raw) > MAX_ANSWER_BYTES:
            raise EngineError(f"{self.name}: {path} answered more than {MAX_ANSWER_BYTES} bytes")
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def key(self) -> str | None:
        return key_of(self.key_settings) if self.key_settings else self.api_key

    def is_sleeping(self, cuda_states: dict[int, str] | None = None) -> bool | None:
        """True or False as vLLM says (for swap "checkpoint": whether its processes are checkpointed, from
        `cuda_states` where the caller read them already); None when the engine cannot be reached (stopped,
        starting)."""
        if self.swap == "checkpoint" and gpu_checkpoint.is_parked(
                self.cuda_states() if cuda_states is None else cuda_states):
            return True
        try:
            status, answer = self.call("GET", "/is_sleeping", timeout_s=5)
        except OSError:
            return None
        if status == 404 and self.swap in ("stop", "checkpoint"):  # no development routes: an engine that never sleeps
            return False
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("is_sleeping"), bool):
            raise EngineError(f"{self.name}: /is_sleeping answered {status} {str(answer)[:200]}")
        return answer["is_sleeping"]

    # -- the canary -----------------------------------------------------------------------------------------
    def ask_canary(self) -> dict:
        status, answer = self.call("POST", "/v1/completions", {
            "model": self.served_name, "prompt": CANARY_PROMPT, "max_tokens": CANARY_TOKENS, "temperature": 0,
            "logprobs": 1, "ignore_eos": True})
        try:
            logprobs = answer["choices"][0]["logprobs"]
            tokens, values = list(logprobs["tokens"]), [float(v) for v in logprobs["token_logprobs"]]
        except (TypeError, KeyError, IndexError, ValueError) as error:
            raise EngineError(f"{self.name}: the canary's completion answered {status} without logprobs "
                              f"({type(error).__name__}: {str(answer)[:200]})") from None
        return {"tokens": tokens, "token_logprobs": values}

    def canary_differs(self) -> str | None:
        """Why the canary now differs from the recorded one; None when it agrees. Records it if none was."""
        now = self.ask_canary()
        if self.canary is None:
            self.canary = now
            return None
        was = self.canary
        if now["tokens"] != was["tokens"]:
            first = next((i for i, (a, b) in enumerate(zip(now["tokens"], was["tokens"])) if a != b),
                         min(len(now["tokens"]), len(was["tokens"])))
            return (f"the canary's greedy tokens differ from token {first} on: {now['tokens'][first:first + 3]} "
                    f"where a proven start gave {was['tokens'][first:first + 3]}")
        worst = max((abs(a - b) for a, b in zip(now["token_logprobs"], was["token_logprobs"])), default=0.0)
        if worst > CANARY_TOLERANCE:
            return f"the canary's tokens agree but a logprob is off by {worst:.3f} (at most {CANARY_TOLERANCE})"
        return None

    # -- park and wake ----------------------------------------------------------------------------------------
    def park(self, deep: bool = False) -> tuple[str, str]:
        """Free the model's GPUs: (what was done, in words; how it is parked: "asleep", where its CUDA context
        stays on its GPUs, or "checkpointed" or "stopped", where nothing of it does). `deep`: nothing may stay,
        so a model that would sleep is stopped: a sleeping engine keeps its CUDA context, which keeps a GPU out
        of its empty idle (121.5 W against 78.8 W on an H200, docs/on-demand.md); a checkpoint leaves nothing."""
        why = ""
        if self.swap == "checkpoint":  # nothing stays on its GPUs: the same when idle (deep) as for a swap
            try:
                states = gpu_checkpoint.cuda_states(self.checkpoint_tool, self.container_pids())
            except (CheckpointError, EngineError) as error:
                states, why = {}, f"its CUDA processes could not be read: {error}"
            if gpu_checkpoint.is_parked(states):
                return "checkpointed already", "checkpointed"
            why = why or self.host_ram_short("a checkpoint copies its process's GPU memory")
            if not why:
                try:
                    before = self.memory_used()
                    parked = gpu_checkpoint.checkpoint(self.checkpoint_tool, states)
                    why = self.memory_not_freed(before, "checkpointed", allowed_mib=LEFT_AFTER_CHECKPOINT_MIB)
                    if not why:
                        return f"checkpointed ({len(parked)} CUDA process{'es' if len(parked) > 1 else ''})", "checkpointed"
                except (CheckpointError, EngineError) as error:
                    why = f"cuda-checkpoint failed: {error}"
        elif self.swap == "sleep" and not deep:
            why = self.host_ram_short("a level-1 sleep copies its weights")
            if not why:
                try:
                    before = self.memory_used()
                    status, answer = self.call("POST", f"/sleep?level={self.sleep_level}", timeout_s=120)
                    if status == 200 and self.is_sleeping() is True:
                        why = self.memory_not_freed(before)
                        if not why:
                            return f"asleep (level {self.sleep_level})", "asleep"
                    else:
                        why = f"/sleep answered {status} {str(answer)[:200]} and /is_sleeping does not say asleep"
                except (OSError, EngineError) as error:
                    why = f"/sleep failed: {error}"
        # The rest is stopped: the "stop" swap, an idle model that would sleep, and a park that did not take (a
        # sleep or checkpoint that failed may hold the GPUs still: never left running beside the next model).
        run(self.stop, f"{self.name}: stopping its container" + (f" ({why})" if why else ""), 120)
        return (f"stopped ({why})" if why else "stopped"), "stopped"

    def memory_used(self) -> int | None:
        """MiB used on the model's GPUs, all together, as memory_probe prints it; None without a probe."""
        if not self.memory_probe:
            return None
        try:
            done = subprocess.run(self.memory_probe, capture_output=True, text=True, timeout=30)
            values = [int(float(line)) for line in done.stdout.split()[:64]]
        except (OSError, subprocess.TimeoutExpired, ValueError) as error:
            raise EngineError(f"{self.name}: the GPUs' memory could not be read: {error}") from None
        if done.returncode or not values:
            raise EngineError(f"{self.name}: the GPUs' memory could not be read: exit {done.returncode} "
                              f"{(done.stderr or done.stdout).strip()[-200:]}")
        return sum(values)

    def memory_not_freed(self, before: int | None, said: str = "asleep", allowed_mib: int | None = None) -> str:
        """Why the park did not free the model's memory (it says `said`, but the GPUs say otherwise); "". A
        sleep may leave its CUDA context (LEFT_AFTER_SLEEP_*); a checkpoint leaves nothing, but what the model
        holds is known only as its share of the card (held_mib), which vLLM's use can fall short of by a few
        hundred MiB (`allowed_mib`, plus 2% of what it held)."""
        if before is None or not self.held_mib:
            return ""
        after = self.memory_used()
        left = self.held_mib - (before - after)
        allowed = (max(LEFT_AFTER_SLEEP_MIB, round(self.held_mib * LEFT_AFTER_SLEEP_SHARE)) if allowed_mib is None
                   else allowed_mib + round(self.held_mib * 0.02))
        if left > allowed:
            return (f"it says {said} but freed {before - after} MiB of the {self.held_mib} MiB it held: {left} MiB "
                    f"left on its GPUs, more than {allowed}")
        return ""

    def host_ram_short(self, copy: str) -> str:
        """Why host RAM cannot take what parking would copy there (up to what the model holds on its GPUs, with
        HOST_RAM_RESERVE_MIB left free); "" where it can, or where either is not known."""
        if not self.held_mib:
            return ""
        try:
            with open(self.meminfo) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            available = int(fields["MemAvailable"].split()[0]) // 1024
        except (OSError, KeyError, ValueError, IndexError):
            return ""
        if available >= self.held_mib + HOST_RAM_RESERVE_MIB:
            return ""
        return (f"host RAM: {available} MiB available, and {copy} there, up to the {self.held_mib} MiB it holds on "
                f"its GPUs, with {HOST_RAM_RESERVE_MIB} MiB to stay free")

    def container_pids(self) -> list[int]:
        """The container's processes (host PIDs, as `pids` prints them); [] where it runs none."""
        if not self.pids:
            raise EngineError(f"{self.name}: no command to list its container's processes")
        try:
            done = subprocess.run(self.pids, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise EngineError(f"{self.name}: its container's processes could not be listed: {error}") from None
        if done.returncode:
            return []  # no such container, or not running
        return [int(word) for word in done.stdout.split()[:4096] if word.isascii() and word.isdigit()]

    def cuda_states(self) -> dict[int, str]:
        """{pid: CUDA state} of the container's CUDA processes (swap "checkpoint"), read once for a wake; {}
        where they cannot be read (no container, the tool failing): then vLLM is asked, and the canary judges."""
        try:
            return gpu_checkpoint.cuda_states(self.checkpoint_tool, self.container_pids())
        except (CheckpointError, EngineError):
            return {}

    def halt(self) -> str:
        """Stop the container, whatever it holds: a model that could not be brought back proven must not hold its
        GPUs beside the next one. What was done, in words."""
        try:
            run(self.stop, f"{self.name}: stopping its container", 120)
            return "its container stopped"
        except EngineError as error:
            return str(error)

    def wake(self) -> str:
        """Bring the model back and prove it; a wake the canary refuses is followed by a cold restart. What
        was done, in words. Raises EngineError when the model cannot be brought back proven."""
        states = self.cuda_states() if self.swap == "checkpoint" else None
        sleeping = self.is_sleeping(states)
        if sleeping is None:  # stopped (the "stop" swap, or a container gone): a warm start
            how = "started"
            try:
                run(self.start, f"{self.name}: starting its container", 120)
            except EngineError as error:
                if not self.create:
                    raise
                # as rigkit-stack's `up`: it may pull the image again (docker system prune -a removes it too)
                run(self.create, f"{self.name}: creating its container again ({error})", CREATE_TIMEOUT_S,
                    env=self.create_env() if self.create_env else None)
                how = "started (its container was gone: created again from its proven config)"
            self.wait_ready()
        elif sleeping:
            if self.canary is None:  # nothing to prove a wake against: a start rigkit proves is the reference
                return self.cold_restart("no canary recorded yet to prove a wake against")
            if self.swap == "checkpoint":
                try:
                    gpu_checkpoint.restore(self.checkpoint_tool, states)
                except (CheckpointError, EngineError) as error:
                    return self.cold_restart(f"its restore from the checkpoint failed: {error}")
                how = "restored from its checkpoint"
            else:
                status, answer = self.call("POST", "/wake_up", timeout_s=120)
                if status != 200 or self.is_sleeping() is not False:
                    return self.cold_restart(f"/wake_up answered {status} {str(answer)[:200]}")
                how = "woken"
        else:
            how = "already awake"
        try:
            differs = self.canary_differs()
        except OSError as error:  # e.g. an engine that says awake but cannot serve: its process locked
            differs = f"the canary was not answered ({error})"
        if differs:
            return self.cold_restart(f"after it was {how}, {differs}")
        self.proven()
        return f"{how}, canary equal"

    def cold_restart(self, reason: str) -> str:
        run(self.restart, f"{self.name}: restarting its container ({reason})", 180)
        self.wait_ready()
        differs = self.canary_differs()
        if differs:
            raise EngineError(f"{self.name}: after a cold restart ({reason}), {differs}")
        self.proven()
        return f"cold restart ({reason}), canary equal"

    def wait_ready(self) -> None:
        """Until the engine answers a completion, bounded by ready_timeout_s."""
        deadline = time.monotonic() + self.ready_timeout_s
        last = "nothing yet"
        pause = 0.1
        while time.monotonic() < deadline:
            try:  # the runtime's one-token readiness probe, as rigkit-stack proves a start
                complete_at(self.url, self.served_name, self.key(), "ready?", 1, 30)
                return
            except NoAnswer as error:
                last = str(error)[:200]
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
        raise EngineError(f"{self.name}: no completion within {self.ready_timeout_s:g} s of its start ({last})")


def run(command: list[str], what: str, timeout_s: float, env: dict | None = None) -> None:
    """Run `command` (no shell), bounded; raises EngineError saying `what` failed and how."""
    if not command:
        raise EngineError(f"{what}: no command to do it")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise EngineError(f"{what}: still running after {timeout_s:g} s") from None
    except OSError as error:
        raise EngineError(f"{what}: {error}") from None
    if done.returncode:
        raise EngineError(f"{what}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
