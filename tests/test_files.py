"""rigkit.plumbing.files.FileStates: the mode, owner and SHA-256 of many files in one command.

Nothing is simulated: the fact's command runs under /bin/sh on this machine's coreutils, the
same programs a Debian rig has, and its answer is checked against Python's own reading.
"""

import grp
import hashlib
import os
import pwd
import subprocess

from rigkit.plumbing.files import FileStates


def test_one_command_reads_every_regular_file_and_leaves_out_the_rest(tmp_path):
    files = {"plain": b"policy\n", "it's spaced": b"x" * 100_000, "empty": b""}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    os.chmod(tmp_path / "plain", 0o755)
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "plain")
    asked = [str(tmp_path / n) for n in [*files, "folder", "missing", "link"]]

    out = subprocess.run(["sh", "-c", FileStates().command(tuple(asked))], capture_output=True, text=True, timeout=30)
    states = FileStates().process(out.stdout.splitlines())

    for name, data in files.items():
        mode = format(os.stat(tmp_path / name).st_mode & 0o777, "o")
        owner = f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"
        assert states[str(tmp_path / name)] == {"mode": mode, "owner": owner, "sha256": hashlib.sha256(data).hexdigest()}
    assert str(tmp_path / "folder") not in states and str(tmp_path / "missing") not in states
    assert states[str(tmp_path / "link")]["sha256"] == hashlib.sha256(b"policy\n").hexdigest()
    assert out.returncode == 0


def test_nothing_there_is_an_empty_answer(tmp_path):
    out = subprocess.run(["sh", "-c", FileStates().command((str(tmp_path / "none"),))], capture_output=True,
                         text=True, timeout=30)
    assert (out.returncode, FileStates().process(out.stdout.splitlines())) == (0, {})
