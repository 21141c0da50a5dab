"""rigkit's fast paths for pyinfra's planning give pyinfra's own answers (rigkit/plumbing/pyinfra_fastpaths.py).

Nothing is simulated: both functions run on this process's real call stack, with the
installed pyinfra. A pyinfra upgrade that changes either function fails here first.
"""

from types import SimpleNamespace

import pyinfra
import pytest

from rigkit.plumbing.pyinfra_fastpaths import (
    PYINFRA_GLOBAL_ARGUMENTS,
    PYINFRA_OPERATION_ORDER,
    fast_paths_in_use,
    global_arguments_once,
    operation_order_from_frames,
    use_fast_paths,
)


def _both(state):
    # One line, so the calling frame's line number is the same for both.
    return PYINFRA_OPERATION_ORDER(state), operation_order_from_frames(state)


def _nested(state, depth):
    return _nested(state, depth - 1) if depth else _both(state)


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, "/nowhere/deploy.py", None])
def test_operation_order_matches_pyinfra(monkeypatch, is_cli, deploy_file):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
    upstream, fast = _nested(state, 3)
    assert fast == upstream
    if deploy_file == "/nowhere/deploy.py":  # not on the stack: no caller lines, as upstream
        assert fast == ([7] if is_cli else [])
    else:  # the nested calls are really in it: the comparison is not of two empty lists
        assert len(fast) >= 4


def test_operation_order_starts_at_the_first_deploy_file_frame():
    state = SimpleNamespace(current_deploy_filename=__file__, current_op_file_number=0)
    deep, shallow = _nested(state, 4)[1], _nested(state, 1)[1]
    assert len(deep) == len(shallow) + 3  # pytest's frames before this file are left out of both


def test_global_arguments_match_pyinfra():
    assert global_arguments_once() == PYINFRA_GLOBAL_ARGUMENTS()
    assert global_arguments_once() is not global_arguments_once()  # callers get their own list, as upstream


def test_switching_on_replaces_the_names_pyinfra_calls(monkeypatch):
    import importlib

    from pyinfra.api import arguments
    for module, name in [("pyinfra.api.operation", "get_operation_order_from_stack"),
                         ("pyinfra.api.facts", "all_global_arguments")]:
        monkeypatch.setattr(importlib.import_module(module), name, getattr(importlib.import_module(module), name))
    monkeypatch.setattr(arguments, "all_global_arguments", arguments.all_global_arguments)
    use_fast_paths()
    use_fast_paths()  # idempotent
    assert fast_paths_in_use()
