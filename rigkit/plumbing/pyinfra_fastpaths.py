"""Two of pyinfra's planning helpers, computed without the work they repeat for every operation.

A converged deploy is mostly planning, and profiling it (docs/performance.md) found two
helpers of pyinfra 3.10 spending most of that time on answers that never change:

- `get_operation_order_from_stack` wants the file name and line number of each caller frame,
  to order operations as the deploy code lists them. It gets them from `inspect.stack()` and
  `inspect.getframeinfo()`, which also look up each frame's module (a scan of `sys.modules`)
  and read its source lines: about 40% of the planning time of 8 rigs. A frame's
  `f_code.co_filename` and `f_lineno` are the same two values (`getframeinfo` returns exactly
  these for source files), read directly.
- `all_global_arguments` evaluates `typing.get_type_hints` on one fixed class for every
  operation on every host; its answer is computed once here.

Both replacements give the same results as pyinfra's own functions: tests/test_pyinfra_fastpaths.py
compares them on real call stacks, with the installed pyinfra, so an upgrade that changes
either function fails there instead of reordering anyone's operations. Until pyinfra does the
same upstream, deploy.py switches them on before planning.
"""

from __future__ import annotations

import functools
import importlib
import sys
import typing

import pyinfra
from pyinfra.api import arguments, util

# By module path: `pyinfra.api.operation` as an attribute is the decorator, not the module.
_operation_module = importlib.import_module("pyinfra.api.operation")
_facts_module = importlib.import_module("pyinfra.api.facts")


# pyinfra's own functions, kept for the equivalence tests (use_fast_paths replaces module names).
PYINFRA_OPERATION_ORDER = util.get_operation_order_from_stack
PYINFRA_GLOBAL_ARGUMENTS = arguments.all_global_arguments


def operation_order_from_frames(state) -> list[int]:
    """pyinfra.api.util.get_operation_order_from_stack, from frame attributes alone."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()  # outermost first, as pyinfra walks them

    start = 0
    if state.current_deploy_filename:
        # From the *first* frame in the deploy file. When it is not on the stack, upstream's
        # loop stops at its own frame (skipped, being pyinfra's): no caller line at all.
        names = [f.f_code.co_filename for f in frames]
        deploy_file = state.current_deploy_filename
        start = names.index(deploy_file) if deploy_file in names else len(frames)

    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    line_numbers += [f.f_lineno for f in frames[start:]
                     if not f.f_code.co_filename.startswith(util.PYINFRA_INSTALL_DIR)]
    return line_numbers


@functools.cache
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(typing.get_type_hints(arguments.AllArguments).items())


def global_arguments_once() -> list[tuple[str, type]]:
    """pyinfra.api.arguments.all_global_arguments, its type hints evaluated once."""
    return list(_global_arguments())


def use_fast_paths() -> None:
    """Point pyinfra's planning at the two functions above (idempotent)."""
    _operation_module.get_operation_order_from_stack = operation_order_from_frames
    arguments.all_global_arguments = global_arguments_once
    _facts_module.all_global_arguments = global_arguments_once


def fast_paths_in_use() -> bool:
    return (_operation_module.get_operation_order_from_stack is operation_order_from_frames
            and arguments.all_global_arguments is global_arguments_once
            and _facts_module.all_global_arguments is global_arguments_once)
