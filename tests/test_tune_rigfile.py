"""The rig-file change a sweep proposes: a diff that touches only the chosen values, comments kept,
and a written copy that rigkit's own loader accepts (the independent read)."""

from __future__ import annotations

import pytest

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.tune.cells import Cell
from rigkit.tune.rigfile import RigFileError, edit_text, propose, write_copy

RIG = """\
# Home rig: two 3090s. Caps from the knee measured in March.
os: linux
psu_w: 1100   # 1100 W unit, 12 V single rail
system_w: 200
gpus:
  - index: 0
    model: RTX 3090
    power_limit_w: 330   # was stock 350; trips at 4 cards
    clock_lock_mhz: [210, 1800]  # floor kept for the display
  # the second card sits in the x4 slot
  - index: 1
    model: RTX 3090
    # no cap yet
models: []
"""


@pytest.fixture
def rig_file(tmp_path):
    (tmp_path / "catalog").mkdir()
    path = tmp_path / "home.yml"
    path.write_text(RIG)
    return path


def test_the_diff_changes_only_the_chosen_values_and_keeps_every_comment(rig_file):
    change = propose(rig_file, {0: Cell(250, 1700), 1: Cell(250)})
    removed = [line for line in change.diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in change.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert removed == ["-    power_limit_w: 330   # was stock 350; trips at 4 cards",
                       "-    clock_lock_mhz: [210, 1800]  # floor kept for the display"]
    assert added == ["+    power_limit_w: 250   # was stock 350; trips at 4 cards",
                     "+    clock_lock_mhz: [210, 1700]  # floor kept for the display",
                     "+    power_limit_w: 250"]
    comments = [line.split("#", 1)[1] for line in RIG.splitlines() if "#" in line]
    assert all(comment in change.text for comment in comments)
    assert change.notes == ()


def test_the_written_copy_is_accepted_by_load_rig(rig_file, tmp_path):
    dest = tmp_path / "home-tuned.yml"
    config = write_copy(rig_file, {0: Cell(250, 1700), 1: Cell(260, None)}, dest, tmp_path / "catalog")
    reread = load_rig(dest, tmp_path / "catalog").spec  # read again, not the object write_copy returned
    assert [g.power_limit_w for g in reread.gpus] == [250, 260]
    assert (reread.gpus[0].clock_lock_mhz.floor_mhz, reread.gpus[0].clock_lock_mhz.ceiling_mhz) == (210, 1700)
    assert reread.gpus[1].clock_lock_mhz is None and config.spec == reread
    assert rig_file.read_text() == RIG  # the original is untouched


def test_unlocking_writes_null_and_a_bare_ceiling_stays_bare(tmp_path):
    text = RIG.replace("[210, 1800]", "1800")
    assert "clock_lock_mhz: 1700  # floor" in edit_text(text, {0: Cell(330, 1700)})
    assert "clock_lock_mhz: null  # floor" in edit_text(text, {0: Cell(330, None)})


def test_a_copy_the_loader_refuses_is_not_left_behind(rig_file, tmp_path):
    dest = tmp_path / "bad.yml"
    with pytest.raises(ConfigError, match="outside 100-400 W"):
        write_copy(rig_file, {0: Cell(450)}, dest, tmp_path / "catalog")
    assert not dest.exists()


def test_offsets_are_written_for_the_boot_time_policy_and_removed_with_null(rig_file, tmp_path):
    change = propose(rig_file, {0: Cell(330, 1800, 1800, 100)})
    added = [line for line in change.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(added) == 1 and "+    clock_offsets_mhz: {memory: 1800, graphics: 100}" in change.diff
    assert "applied at boot by the GPU policy" in change.notes[0]
    rig = write_copy(rig_file, {0: Cell(330, 1800, 1800, 100)}, tmp_path / "home.yml", tmp_path / "catalog")
    assert (rig.spec.gpus[0].clock_offsets_mhz.memory, rig.spec.gpus[0].clock_offsets_mhz.graphics) == (1800, 100)
    back = edit_text(change.text, {0: Cell(330, 1800)})
    assert "    clock_offsets_mhz: null" in back and back.replace("    clock_offsets_mhz: null\n", "") == RIG


def test_files_that_cannot_be_edited_safely_by_line_are_refused():
    flow = "os: linux\npsu_w: 1000\nsystem_w: 200\ngpus:\n  - {index: 0, model: RTX 3090}\n"
    with pytest.raises(RigFileError, match="line 5: write each GPU in block style"):
        edit_text(flow, {0: Cell(250)})
    multi = "os: linux\ngpus:\n  - index: 0\n    clock_lock_mhz:\n      - 0\n      - 1800\n"
    with pytest.raises(RigFileError, match=r"gpus\[0\].clock_lock_mhz spans several lines"):
        edit_text(multi, {0: Cell(250, 1700)})
    with pytest.raises(RigFileError, match="no GPU with index 3"):
        edit_text(RIG, {3: Cell(250)})


def test_insertion_keeps_windows_line_ends_and_an_unterminated_last_line():
    crlf = RIG.replace("\n", "\r\n")
    edited = edit_text(crlf, {1: Cell(250)})
    assert "    model: RTX 3090\r\n    power_limit_w: 250\r\n    # no cap yet" in edited
    tail = "os: linux\ngpus:\n  - index: 0\n    model: RTX 3090"
    assert edit_text(tail, {0: Cell(250)}) == tail + "\n    power_limit_w: 250"
