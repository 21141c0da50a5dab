"""A rig that reboots (or a network that drops) in the middle of a python.call: one line that says
so, no traceback. Reproduced by hand on the demo rig (`docker restart` during verification): pyinfra
printed paramiko's traceback, "Unexpected error in Python callback: SSHException('SSH session not
active')" and then only "No hosts remaining!". Here the callbacks rigkit hands to python.call are
checked for the wrapper, and the wrapper is run against the errors paramiko and sockets raise."""

from __future__ import annotations

import ast
import socket
import types

import paramiko
import pytest
from pyinfra.api.exceptions import OperationError

from rigkit.plumbing.ssh import rig_call
from tests.conftest import REPO


class Host:
    """What pyinfra hands a callback that takes `state` and `host`: here, only what the wrapper uses."""

    print_prefix = "[rig] "

    def __init__(self):
        self.logged: list[str] = []

    def log_styled(self, message, fg=None, log_func=None):
        self.logged.append(message)


def call(callback, *args):
    from pyinfra.api import Config

    host = Host()
    status = rig_call(callback)(types.SimpleNamespace(config=Config()), host, *args)
    return status, host.logged


@pytest.mark.parametrize("error", [paramiko.SSHException("SSH session not active"), EOFError(),
                                   ConnectionResetError(104, "Connection reset by peer"), socket.timeout("timed out")])
def test_a_lost_connection_fails_the_operation_in_one_line_naming_what_to_do(error):
    def callback():
        raise error

    status, logged = call(callback)
    assert status is False
    (text,) = logged
    assert text.startswith(f"lost the SSH connection to the rig ({type(error).__name__}")
    assert "Deploy again once it answers" in text and "\n" not in text


def test_an_operation_error_is_the_operations_one_line_and_other_errors_are_raised():
    def failing():
        raise OperationError("verification of m failed: decode 50 tok/s below 80")

    assert call(failing) == (False, ["verification of m failed: decode 50 tok/s below 80"])
    assert call(lambda x: None, 1) == (True, [])
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        call(lambda: 1 / 0)


def test_pyinfra_passes_state_and_host_to_the_wrapper():
    """FunctionCommand.execute calls a callback with `state` and `host` first, and takes its return
    value as the status, only when its own argument list names both: the wrapper's must."""
    from inspect import getfullargspec

    args = getfullargspec(rig_call(lambda: None)).args
    assert "state" in args and "host" in args


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
