"""Starting and stopping the NVML sampler (rigkit/verify/telemetry.py, shipped to the rig) over a
shell on the rig: the commands verification and tune both send. The rig's own nvidia-ml-py is
preferred; the pynvml copy rigkit ships beside the sampler is the fallback."""

from __future__ import annotations

import shlex

from .names import RUN_DIR

SAMPLE_HZ = 50
START_WAIT_S = 20  # the sampler says "sampling" in its log once NVML answered
MAX_S = 900  # a sampler left behind stops itself


def python_with_nvml(nvml_dir: str, nohup: bool = False) -> str:
    """`python3` with pynvml importable: the rig's own, else the shipped copy in `nvml_dir`."""
    return (f"if python3 -c 'import pynvml' 2>/dev/null; then P=; else P={nvml_dir}; fi; "
            f"PYTHONPATH=$P {'nohup ' if nohup else ''}python3")


TAKEOVER_WAIT_S = 5  # a sampler left behind ends within this once told (it writes its samples first)


def start_command(sampler: str, nvml_dir: str, gpus, hz: int, out: str, max_s: int) -> str:
    """Start the sampler in the background, writing to `out` in the root-only RUN_DIR (not /tmp: a
    local user could plant a symlink at a predictable /tmp path); prints its pid, also kept in
    `out`.pid. A sampler left behind (its controller killed before it was stopped) stops itself after
    `max_s`; before that, the next start for the same `out` stops it first, so that two samplers never
    write one file (the pid is trusted only while that process's command line names `out`)."""
    quoted, pid_file = shlex.quote(out), shlex.quote(out + ".pid")
    indices = ",".join(str(i) for i in gpus)
    # Quiet (stderr to /dev/null, the whole block): the caller reads the pid from the last line printed.
    takeover = (f"{{ old=$(cat {pid_file}); case $old in ''|*[!0-9]*) old=;; esac; "
                f"if [ -n \"$old\" ] && tr '\\0' ' ' < /proc/$old/cmdline | "
                f"grep -qF -- {shlex.quote(f'--out {out} --max-seconds')}; "
                f"then kill -TERM $old; for i in $(seq 1 {TAKEOVER_WAIT_S * 10}); do kill -0 $old || break; "
                f"sleep 0.1; done; kill -KILL $old; fi; }} 2>/dev/null; ")
    return (f"mkdir -p -m 700 {RUN_DIR}; {takeover}rm -f {quoted}; {python_with_nvml(nvml_dir, nohup=True)} "
            f"{sampler} --gpus {indices} --hz {int(hz)} --out {quoted} --max-seconds {int(max_s)} > {quoted}.log 2>&1 & "
            f"echo $! > {pid_file}; echo $!")


def started_command(pid: str, out: str, wait_s: int = START_WAIT_S) -> str:
    """Succeeds once the sampler said "sampling"; fails with its log when it died or `wait_s` passed."""
    quoted = shlex.quote(out)
    return (f"for i in $(seq 1 {wait_s * 10}); do grep -q sampling {quoted}.log && exit 0; "
            f"kill -0 {pid} 2>/dev/null || break; sleep 0.1; done; cat {quoted}.log; exit 1")


def stop_command(pid: str, out: str) -> str:
    """Stop the sampler; succeeds once it wrote its samples to `out` (within 10 s)."""
    quoted = shlex.quote(out)
    return (f"kill -TERM {pid}; for i in $(seq 1 100); do [ -f {quoted} ] && exit 0; sleep 0.1; done; "
            f"cat {quoted}.log; exit 1")
