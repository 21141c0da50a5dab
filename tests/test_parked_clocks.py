"""rigside.parked_clocks against a stand-in nvidia-smi on PATH that records each call and fails where told (the
real tool on the simulated rig, with the policy script and rigkit-ondemand: tests/test_ondemand.py). Simulated:
nvidia-smi. Real: the policy file's format, the list file and the keeper's lock."""

from __future__ import annotations

import os
import stat

from rigkit.rigside.parked_clocks import ParkedClocks, parked, policy_locks, set_parked

POLICY = "# index limit lock offsets\n0 330 0,2200 default\n1 default default default\n2 300 210,1800 100,50\n"


def setup(tmp_path, monkeypatch, fail_on: str = ""):
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
case " $* " in *" {fail_on or 'never'} "*) echo "Setting locked GPU clocks is not supported for GPU 00000000:01:00.0." >&2; exit 3;; esac
""")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "policy.conf").write_text(POLICY)
    return {"policy_path": str(tmp_path / "policy.conf"), "parked_path": str(tmp_path / "run" / "gpu-parked"),
            "lock_path": str(tmp_path / "run" / "keeper.lock")}


def calls(tmp_path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_the_policys_locks_are_released_and_put_back_only_where_it_locks(tmp_path, monkeypatch):
    paths = setup(tmp_path, monkeypatch)
    assert policy_locks(paths["policy_path"]) == {0: "0,2200", 2: "210,1800"}
    said = set_parked({0, 1, 2}, True, **paths)
    assert said == ["GPU 0: clock lock 0,2200 MHz released while parked", "GPU 2: clock lock 210,1800 MHz released while parked"]
    assert calls(tmp_path) == ["-i 0 -rgc", "-i 2 -rgc"] and parked(paths["parked_path"]) == {0, 2}
    assert set_parked({0}, True, **paths) == [] and len(calls(tmp_path)) == 2  # already released: no call
    assert set_parked({0}, False, **paths) == ["GPU 0: clocks locked to 0,2200 MHz again"]
    assert calls(tmp_path)[-1] == "-i 0 -lgc 0,2200" and parked(paths["parked_path"]) == {2}
    assert set_parked({2}, False, gate=lambda: False, **paths) == [] and parked(paths["parked_path"]) == {2}


def test_a_lock_that_fails_to_come_back_is_off_the_list_for_the_policys_next_apply(tmp_path, monkeypatch):
    paths = setup(tmp_path, monkeypatch, fail_on="-lgc")
    set_parked({0}, True, **paths)
    [said] = set_parked({0}, False, **paths)
    assert said.startswith("GPU 0: nvidia-smi -i 0 -lgc 0,2200 exited 3: Setting locked GPU clocks is not supported"), said
    assert parked(paths["parked_path"]) == set()  # rigkit-gpu-policy's next apply locks it


def test_a_release_that_fails_leaves_the_gpu_locked_and_off_the_list(tmp_path, monkeypatch):
    paths = setup(tmp_path, monkeypatch, fail_on="-rgc")
    [said] = set_parked({0}, True, **paths)
    assert said.startswith("GPU 0: nvidia-smi -i 0 -rgc exited 3"), said
    assert parked(paths["parked_path"]) == set()


def test_rigkit_ondemands_side_keeps_a_busy_gpu_locked_and_puts_every_lock_back_as_it_stops(tmp_path, monkeypatch):
    paths = setup(tmp_path, monkeypatch)
    lines = []
    clocks = ParkedClocks({"a": [0], "b": [0, 2], "c": [1]}, {0, 2}, log=lines.append, **paths)
    clocks.settle({"a"})  # a loaded on GPU 0: only GPU 2 gives its lock back
    assert parked(paths["parked_path"]) == {2}
    clocks.settle(set())
    assert parked(paths["parked_path"]) == {0, 2}
    clocks.before_load("b")
    assert parked(paths["parked_path"]) == set() and lines[-1] == "rigkit-ondemand: GPU 2: clocks locked to 210,1800 MHz again (b loads)"
    clocks.settle(set())
    clocks.restore_all()
    assert parked(paths["parked_path"]) == set()
    clocks.settle(set())  # a swap that ends after the program began to stop releases nothing
    assert parked(paths["parked_path"]) == set()
