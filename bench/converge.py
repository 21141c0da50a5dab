"""How long a deploy takes when nothing changed: rigkit against Ansible, in one run.

Starts simulated rigs (tests/simrig: systemd, sshd on 127.0.0.1, real SSH), converges each
once, then times converged runs side by side, alternating tools (ABBA) to cancel drift:
- the demo rig (inventory/rigs/sim.yml: GPU policy, weights on volumes, two served models);
- 1 and 8 GPU-policy-only rigs (tests/data/rigs/policy.yml), rigkit's deploy.py against an
  equivalent Ansible playbook (the same files, unit and "apply now when changed" handler),
  ansible-core installed by this script into its own virtual environment, over the same SSH
  with the same key (pipelining on: Ansible's fastest documented mode).
rigkit runs as its users run it, `rigkit deploy INVENTORY` (pyinfra's CLI with rigkit's shorter
start, rigkit/plumbing/pyinfra_start.py); the demo rig is also timed with plain `pyinfra -y INVENTORY
deploy.py` to show what that start saves. Prints medians and the ratios the converge issue sets
targets for, and the CPU each side used: the controller's (the deploy process) and the
simulated rigs' (their containers' cgroups), which share this machine's cores, with the floor
that sharing puts under T(8): the controller's start (a run whose one rig refuses the
connection) runs alone, the rest of its work and the rigs' on all cores.

    .venv/bin/python bench/converge.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rigkit.config.loader import load_rig  # noqa: E402
from rigkit.plumbing.render import render, template_text  # noqa: E402
from tests.simrig.rig import STATE_ROOT, SimRig, ssh_keypair  # noqa: E402

ANSIBLE_VENV = STATE_ROOT / "bench-ansible"
POLICY_RIG = REPO / "tests/data/rigs/policy.yml"
FIRST_PORT = 2240


def rigkit_inventory(folder: Path, rigs: list[SimRig], rig_file: Path) -> Path:
    key = ssh_keypair()
    hosts = ",\n".join(
        f'    ("{r.name}", {{"ssh_hostname": "127.0.0.1", "ssh_port": {r.ssh_port}, "ssh_user": "root", '
        f'"ssh_key": "{key}", "ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "off", '
        f'"rig_file": "{rig_file}"}})' for r in rigs)
    path = folder / f"rigkit-{len(rigs)}.py"
    path.write_text(f"rigs = [\n{hosts},\n]\n")
    return path


def ansible_files(folder: Path, rigs: list[SimRig]) -> tuple[Path, Path]:
    """An inventory and a playbook doing the GPU policy role's work, as an Ansible user writes it."""
    rig = load_rig(POLICY_RIG, REPO / "tests/data/models")
    (folder / "gpu-policy.sh").write_text(template_text("gpu_policy/rigkit-gpu-policy.sh"))
    (folder / "gpu-policy.conf").write_text(
        render("gpu_policy/gpu-policy.conf.j2", rig_name=rig.name, rig_file=rig.file, gpus=rig.spec.gpus))
    (folder / "unit.service").write_text(render(
        "gpu_policy/rigkit-gpu-policy.service.j2", script_path="/usr/local/sbin/rigkit-gpu-policy",
        policy_path="/etc/rigkit/gpu-policy.conf", wait_for_gpus_s=120, lock_wait_s=150, before_units=[]))
    inventory = folder / f"hosts-{len(rigs)}.ini"
    inventory.write_text("[rigs]\n" + "".join(
        f"{r.name} ansible_host=127.0.0.1 ansible_port={r.ssh_port} ansible_user=root "
        f"ansible_ssh_private_key_file={ssh_keypair()} ansible_python_interpreter=/usr/bin/python3\n" for r in rigs))
    playbook = folder / "gpu-policy.yml"
    playbook.write_text(f"""- hosts: rigs
  gather_facts: false
  tasks:
    - name: Install the GPU policy script
      ansible.builtin.copy: {{src: {folder}/gpu-policy.sh, dest: /usr/local/sbin/rigkit-gpu-policy, mode: "0755"}}
      notify: apply
    - name: Write the rig's GPU policy
      ansible.builtin.copy: {{src: {folder}/gpu-policy.conf, dest: /etc/rigkit/gpu-policy.conf, mode: "0644"}}
      notify: apply
    - name: Install the boot-time GPU policy unit
      ansible.builtin.copy: {{src: {folder}/unit.service, dest: /etc/systemd/system/rigkit-gpu-policy.service, mode: "0644"}}
      notify: [reload, apply]
    - name: Enable the GPU policy at boot
      ansible.builtin.systemd_service: {{name: rigkit-gpu-policy.service, enabled: true}}
  handlers:
    - name: reload
      ansible.builtin.systemd_service: {{daemon_reload: true}}
    - name: apply
      ansible.builtin.command: systemctl restart rigkit-gpu-policy.service
""")
    return inventory, playbook


def ensure_ansible() -> Path:
    playbook_bin = ANSIBLE_VENV / "bin" / "ansible-playbook"
    if not playbook_bin.exists():
        print("installing ansible-core into", ANSIBLE_VENV, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "ansible-core"], check=True, timeout=600)
    return playbook_bin


CPU_S: dict[str, list[float]] = {}  # the controller's own CPU (user + sys) per run, by label
RIG_CPU_S: dict[str, list[float]] = {}  # the simulated rigs' CPU per run, by label


def container_cpu_s(name: str) -> float | None:
    """CPU seconds a container has used so far, from its cgroup (v1 or v2); None if not found."""
    cid = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], capture_output=True, text=True).stdout.strip()
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
    if cid and v1.is_file():
        return int(v1.read_text()) / 1e9
    for v2 in (Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"), Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat")):
        if cid and v2.is_file():
            usage = dict(line.split() for line in v2.read_text().splitlines())
            return int(usage["usage_usec"]) / 1e6
    return None


def rigs_cpu_s(names: list[str]) -> float | None:
    used = [container_cpu_s(name) for name in names]
    return None if None in used else sum(used)


def timed(command: list[str], env: dict | None = None, label: str = "", rigs: list[str] = ()) -> float:
    rig_before = rigs_cpu_s(list(rigs)) if rigs else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if label:
        CPU_S.setdefault(label, []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if label and rig_before is not None:
        time.sleep(0.5)  # the rigs' sshd sessions end after the deploy process has gone
        RIG_CPU_S.setdefault(label, []).append(rigs_cpu_s(list(rigs)) - rig_before)
    return elapsed


def start_cpu_s(rigkit: list[str], folder: Path) -> float:
    """The controller's CPU before any rig answers: `rigkit deploy` on an inventory whose one
    rig refuses the connection (a closed port on 127.0.0.1) imports, loads the inventory, is
    refused at once and exits. This part of a run cannot overlap with any rig's work."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]  # free now, and nothing listens on it
    inventory = folder / "refused.py"
    inventory.write_text(f'rigs = [("refused", {{"ssh_hostname": "127.0.0.1", "ssh_port": {closed_port}, '
                         f'"rig_file": "{POLICY_RIG}"}})]\n')
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(rigkit + [str(inventory)], cwd=REPO, capture_output=True, timeout=120)  # fails: no rig left
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def reference_loop_s() -> float:
    """A fixed pure-Python loop: this shared VM's speed moves by up to 2x within minutes, so the
    absolute times above are read against it (ratios from one run are what the bench is for)."""
    started = time.perf_counter()
    total = 0
    for n in range(5_000_000):
        total += n
    return time.perf_counter() - started


def changed_ansible(output: str) -> int:
    return sum(int(part.split("=")[1]) for line in output.splitlines() if "changed=" in line
               for part in line.split() if part.startswith("changed="))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rigkit = [str(Path(sys.executable).with_name("rigkit")), "deploy"]  # what users run
    pyinfra = [sys.executable, "-m", "pyinfra", "-y"]  # plain pyinfra, for the demo rig's comparison
    ansible_env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_PIPELINING="True",
                       ANSIBLE_FORKS="8", ANSIBLE_NOCOLOR="1")
    playbook_bin = ensure_ansible()

    print("starting the demo rig and 8 GPU-policy rigs", flush=True)
    subprocess.run([sys.executable, "-m", "tests.simrig", "up"], cwd=REPO, check=True, capture_output=True)
    rigs = [SimRig(name=f"rigkit-bench-{n}", ssh_port=FIRST_PORT + n).start(log=lambda m: None) for n in range(8)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            demo_inventory = "inventory/sim.py"
            one, eight = (rigkit_inventory(folder, rigs[:1], POLICY_RIG), rigkit_inventory(folder, rigs, POLICY_RIG))
            ans_one, playbook = ansible_files(folder, rigs[:1])
            ans_eight, _ = ansible_files(folder, rigs)
            # Converge everything once (first deploys are not what is measured).
            timed(rigkit + [demo_inventory])
            timed(rigkit + [str(eight)])
            timed([str(playbook_bin), "-i", str(ans_eight), str(playbook)], ansible_env)
            check = subprocess.run([str(playbook_bin), "-i", str(ans_eight), str(playbook)], env=ansible_env,
                                   capture_output=True, text=True, timeout=600)
            assert changed_ansible(check.stdout) == 0, check.stdout  # converged: the comparison is fair

            times: dict[str, list[float]] = {k: [] for k in ("demo", "demo-pyinfra", "rk1", "an1", "rk8", "an8")}
            loops_s = [reference_loop_s()]
            starts_s: list[float] = []
            names = [r.name for r in rigs]
            for n in range(args.repeats):
                order = [("rk1", "an1"), ("rk8", "an8")] if n % 2 == 0 else [("an1", "rk1"), ("an8", "rk8")]
                demo = [("demo", rigkit + [demo_inventory]), ("demo-pyinfra", pyinfra + [demo_inventory, "deploy.py"])]
                for key, command in demo if n % 2 == 0 else demo[::-1]:
                    times[key].append(timed(command, label=key, rigs=["rigkit-sim"]))
                for pair in order:
                    for key in pair:
                        if key.startswith("rk"):
                            inv, used = (one, names[:1]) if key == "rk1" else (eight, names)
                            times[key].append(timed(rigkit + [str(inv)], label=key, rigs=used))
                        else:
                            inv = ans_one if key == "an1" else ans_eight
                            times[key].append(timed([str(playbook_bin), "-i", str(inv), str(playbook)], ansible_env))
                starts_s.append(start_cpu_s(rigkit, folder))  # in each round: the machine's speed drifts
                loops_s.append(reference_loop_s())
                print(f"round {n + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                      flush=True)
            start_s = statistics.median(starts_s)
    finally:
        for rig in rigs:
            rig.remove()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedians of {args.repeats} converged runs (zero changes each):")
    print(f"  demo rig (policy + weights + 2 models): rigkit {med['demo']:.2f} s   (target <= 1.5 s); "
          f"plain pyinfra {med['demo-pyinfra']:.2f} s")
    print(f"  1 GPU-policy rig:  rigkit {med['rk1']:.2f} s, Ansible {med['an1']:.2f} s, "
          f"rigkit/Ansible {med['rk1'] / med['an1']:.2f}   (target <= 0.4)")
    print(f"  8 GPU-policy rigs: rigkit {med['rk8']:.2f} s, Ansible {med['an8']:.2f} s, "
          f"rigkit/Ansible {med['rk8'] / med['an8']:.2f}")
    print(f"  rigkit T(8)/T(1) {med['rk8'] / med['rk1']:.2f}   (target <= 1.3); "
          f"Ansible T(8)/T(1) {med['an8'] / med['an1']:.2f}")
    cpu = {k: statistics.median(v) for k, v in CPU_S.items()}
    print(f"  rigkit's own CPU (user + sys of the deploy process): demo {cpu['demo']:.2f} s, "
          f"1 rig {cpu['rk1']:.2f} s, 8 rigs {cpu['rk8']:.2f} s, 8/1 {cpu['rk8'] / cpu['rk1']:.2f}")
    if "rk8" in RIG_CPU_S:
        rig_cpu = {k: statistics.median(v) for k, v in RIG_CPU_S.items()}
        cores = os.cpu_count() or 1
        # On this machine the rigs' work and the controller's share `cores` CPUs, and the
        # controller is one Python thread: T(8) can be no shorter than either bound.
        # The controller's start (before any rig answers) runs alone; the rest of its work and the
        # rigs' share the cores.
        floor_8 = max(cpu["rk8"], start_s + (cpu["rk8"] - start_s + rig_cpu["rk8"]) / cores)
        print(f"  the simulated rigs' CPU (their cgroups): demo rig {rig_cpu['demo']:.2f} s, 1 rig {rig_cpu['rk1']:.2f} s, "
              f"8 rigs {rig_cpu['rk8']:.2f} s; the controller's start (before any rig answers) {start_s:.2f} s")
        print(f"  CPU floor of T(8) on these {cores} cores: {floor_8:.2f} s (the start, then the rest of the controller's "
              f"and the rigs' CPU on {cores} cores), so T(8)/T(1) >= {floor_8 / med['rk1']:.2f} here whatever the tool "
              "does; real rigs bring their own CPUs")
    print(f"  reference loop: {min(loops_s):.2f}-{max(loops_s):.2f} s over the rounds (the machine's speed while measuring)")


if __name__ == "__main__":
    main()
