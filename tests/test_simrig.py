"""The simulated rig itself: systemd boots, and the simulated GPU behaves like the real driver.

Simulated here (see tests/simrig/nvidia-smi): the GPUs and nvidia-smi. Real: the
container, systemd as PID 1, sshd, and the reboot (a container restart).
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.simrig

QUERY = "nvidia-smi --query-gpu=index,power.limit --format=csv,noheader,nounits"


def test_rig_boots_with_systemd_running(simrig):
    assert simrig.system_state() == "running"
    assert simrig.exec("readlink /proc/1/exe")[1].strip() == "/usr/lib/systemd/systemd"
    assert simrig.exec("systemctl is-active ssh nvidia-persistenced")[1].split() == ["active", "active"]


def test_docker_cli_and_compose_reach_the_hosts_engine(simrig):
    code, out = simrig.exec("docker compose version && docker info --format '{{.ServerVersion}}'")
    assert code == 0, out
    assert "Docker Compose version v2" in out


def test_simulated_gpu_forgets_its_settings_on_reboot(simrig):
    assert simrig.exec("nvidia-smi -pl 300 && nvidia-smi -i 1 -lgc 0,2200")[0] == 0
    assert simrig.exec(QUERY)[1].splitlines() == ["0, 300.00", "1, 300.00"]
    assert simrig.gpu_state()[1]["clock_lock"] == [0, 2200]

    simrig.reboot()

    assert simrig.exec(QUERY)[1].splitlines() == ["0, 450.00", "1, 450.00"]
    assert all(g["clock_lock"] is None for g in simrig.gpu_state())


def test_non_root_gets_insufficient_permissions(simrig):
    code, out = simrig.exec("nvidia-smi -pl 300", user="rigops")
    assert code == 4
    assert "Insufficient Permissions" in out
    assert simrig.exec(QUERY, user="rigops")[0] == 0  # reading is allowed


def test_out_of_range_cap_is_refused(simrig):
    code, out = simrig.exec("nvidia-smi -i 0 -pl 500")
    assert code == 2
    assert "is not a valid power limit which should be between 150.00 W and 450.00 W" in out


def test_gpu_count_and_model_are_configurable(simrig):
    from tests.simrig.rig import SimGpu

    original = simrig.gpus
    try:
        simrig.gpus = [SimGpu(name="NVIDIA GeForce RTX 3090", min_w=100, max_w=350, default_w=350)] * 4
        simrig.write_gpu_config()
        out = simrig.exec("nvidia-smi --query-gpu=index,name,power.max_limit --format=csv,noheader,nounits")[1]
        assert out.splitlines() == [f"{i}, NVIDIA GeForce RTX 3090, 350.00" for i in range(4)]
    finally:
        simrig.gpus = original
        simrig.write_gpu_config()


def test_a_session_refused_past_sshds_max_sessions_is_opened_once_one_closes(simrig):
    """The session rig's sshd allows 4 sessions per connection (MaxSessions 4, as hardened configs do). rigkit's
    transport asks again for a session sshd refused while one closes; paramiko's own raises at once."""
    import threading

    import paramiko

    from rigkit.plumbing.ssh import gcm_first_transport

    def connect(factory=None):
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        client.connect("127.0.0.1", port=simrig.ssh_port, username="root", key_filename=str(simrig.ssh_key),
                       look_for_keys=False, allow_agent=False, **({"transport_factory": factory} if factory else {}))
        return client

    plain, rigkits = connect(), connect(gcm_first_transport)
    try:
        held = [plain.get_transport().open_session() for _ in range(4)]
        with pytest.raises(paramiko.ChannelException, match="Connect failed"):
            plain.get_transport().open_session()  # the fifth, refused by sshd
        held += [rigkits.get_transport().open_session() for _ in range(4)]
        closing = threading.Timer(0.5, held[-1].close)
        closing.start()
        started = time.monotonic()
        fifth = rigkits.get_transport().open_session()
        waited = time.monotonic() - started
        assert 0.4 < waited < 5, waited  # refused while all 4 were open, opened once one had closed
        fifth.exec_command("true")
        assert fifth.recv_exit_status() == 0
    finally:
        plain.close()
        rigkits.close()
