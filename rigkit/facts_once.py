"""Read a fact once per host and deploy run.

pyinfra 3 keeps no fact cache: every `host.get_fact` is a command and a round trip. While a
deploy file is loaded (pyinfra's planning phase, before anything changes on the rig), several
operations ask the same question -- each `rigkit.files.put` of a role asks for the state of
the role's whole batch, and preflight and the weights role both ask for each volume's state --
so the demo rig's converged deploy sent 15 FileStates commands for 4 distinct batches. Within
planning the answers cannot differ, so `read_once` answers repeats from memory.

Use it only where a fact is read while planning; a callback that runs during execution, after
operations may have changed the rig, must call `host.get_fact` itself.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import FactBase

# {(id of the run's State, host name, fact class, sorted kwargs): answer}
_answers: dict[tuple, Any] = {}


def read_once(fact: type[FactBase], **kwargs: Any) -> Any:
    key = (id(host.state), host.name, fact, tuple(sorted(kwargs.items())))
    if key not in _answers:
        _answers[key] = host.get_fact(fact, **kwargs)
    return _answers[key]
