"""rigkit.plumbing.systemd_units: a unit's state read in one `systemctl show`, with pyinfra's meanings.

Pure: parses `systemctl show` output as systemd prints it (blocks separated by a blank line;
a unit that does not exist still gets a block). The deploys over SSH in test_gpu_policy.py
and test_status.py run the command against the simulated rig's real systemd.
"""

from rigkit.plumbing.systemd_units import UnitStates, _settled

SHOW = """Id=rigkit-gpu-policy.service
SubState=exited
UnitFileState=enabled

Id=rigkit-watchdog.timer
SubState=dead
UnitFileState=disabled

Id=nothing.service
SubState=dead
UnitFileState=
"""


def test_states_mean_what_pyinfra_means():
    states = UnitStates().process(SHOW.splitlines())
    # A oneshot with RemainAfterExit is "exited": running, as pyinfra's SystemdStatus says.
    assert states["rigkit-gpu-policy.service"] == {"running": True, "enabled": True}
    assert states["rigkit-watchdog.timer"] == {"running": False, "enabled": False}
    assert states["nothing.service"] == {"running": False, "enabled": False}
    assert UnitStates().process([]) == {} and UnitStates.default() == {}


def test_settled_only_when_every_asked_state_holds():
    on = {"running": True, "enabled": True}
    assert _settled(on, running=True, enabled=True) and _settled(on, running=None, enabled=True)
    assert not _settled(on, running=False, enabled=False)
    assert not _settled({"running": False, "enabled": True}, running=True, enabled=True)
    assert not _settled(None, running=True, enabled=None)  # not read: left to systemd.service
