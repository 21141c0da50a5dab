"""A rig that reboots (or a network that drops) in the middle of a python.call: one line that says
so, no traceback. Reproduced by hand on the demo rig (`docker restart` during verification): pyinfra
printed paramiko's traceback, "Unexpected error in Python callback: SSHException('SSH session not
active')" and then only "No hosts remaining!". Here the callbacks rigkit hands to python.call are
checked for the wrapper, and the wrapper is run against the errors paramiko and sockets raise."""

from __future__ import annotations

import ast
import socket

import paramiko
import pytest
from pyinfra.api.exceptions import OperationError

from rigkit.ssh import rig_call
from tests.conftest import REPO


@pytest.mark.parametrize("error", [paramiko.SSHException("SSH session not active"), EOFError(),
                                   ConnectionResetError(104, "Connection reset by peer"), socket.timeout("timed out")])
def test_a_lost_connection_is_one_line_naming_what_to_do(error):
    def callback():
        raise error

    with pytest.raises(OperationError) as caught:
        rig_call(callback)()
    text = str(caught.value)
    assert text.startswith(f"lost the SSH connection to the rig ({type(error).__name__}")
    assert "Deploy again once it answers" in text and "\n" not in text


def test_other_errors_and_results_pass_through():
    assert rig_call(lambda x: x + 1)(1) == 2
    with pytest.raises(ZeroDivisionError):
        rig_call(lambda: 1 / 0)()


def test_every_python_call_of_rigkit_is_wrapped():
    """A new python.call without rig_call would bring the traceback back."""
    unwrapped, found = [], 0
    for path in [*REPO.glob("roles/*.py"), *REPO.glob("rigkit/**/*.py"), REPO / "status.py", REPO / "deploy.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "python.call":
                found += 1
                function = next((k.value for k in node.keywords if k.arg == "function"), None)
                if not (isinstance(function, ast.Call) and ast.unparse(function.func) == "rig_call"):
                    unwrapped.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not unwrapped, unwrapped
    assert found >= 4  # verify, gateway verify, the weights copy, status
