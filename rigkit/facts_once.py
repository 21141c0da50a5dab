"""Read a fact once per host and deploy run, and read ahead: all of a rig's questions at once.

pyinfra 3 keeps no fact cache: every `host.get_fact` is a command and a round trip. While a
deploy file is loaded (pyinfra's planning phase, before anything changes on the rig), several
operations ask the same question -- each `rigkit.files.put` of a role asks for the state of
the role's whole batch, and preflight and the weights role both ask for each volume's state --
so the demo rig's converged deploy sent 15 FileStates commands for 4 distinct batches. Within
planning the answers cannot differ, so `read_once` answers repeats from memory.

The roles' questions also do not depend on each other's answers: each role knows from the rig
file alone what it will ask (its `<role>_reads(rig)`, beside its code). `read_ahead` starts
them all at once, at most READ_AHEAD_CHANNELS (2) at a time, each on its own channel of the rig's
one SSH connection, so a rig answers in about the time of its slowest questions rather than
the sum of all of them (the demo rig: ten commands, 0.43 s one after another). `read_once`
then waits for the answer it needs; a question that failed raises there, where the role asks
it, as it would have without reading ahead.

Use both only where a fact is read while planning; a callback that runs during execution, after
operations may have changed the rig, must call `host.get_fact` itself.
"""

from __future__ import annotations

from typing import Any, Iterable

import gevent
from gevent.lock import Semaphore
from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.context import ctx_host, ctx_state

Read = tuple[type[FactBase], dict[str, Any]]  # a question: the fact and its arguments

# sshd refuses a connection's sessions past its MaxSessions: 10 by default, 4 in some hardened
# configs, and a refused session is an SSH error that fails the rig. A finished command's session
# is freed only when sshd has read the client's close, which can still be on its way when the
# next command opens one: with three read-ahead commands plus pyinfra's own, a rig allowing 4
# refused sessions now and then (the test rig runs with 4). Two leave a session spare.
READ_AHEAD_CHANNELS = 2
_channels: dict[tuple, Semaphore] = {}  # per (run, host)

# {(id of the run's State, host name, fact class, sorted kwargs): answer, or the greenlet asking}
_answers: dict[tuple, Any] = {}


class _Failed:
    """A read-ahead that raised: kept to raise where the question is asked (a greenlet that
    raised would also print its traceback to the user)."""

    def __init__(self, error: BaseException):
        self.error = error


def _key(fact: type[FactBase], kwargs: dict[str, Any]) -> tuple:
    return (id(host.state), host.name, fact, tuple(sorted(kwargs.items())))


def read_once(fact: type[FactBase], **kwargs: Any) -> Any:
    key = _key(fact, kwargs)
    if key not in _answers:
        _answers[key] = host.get_fact(fact, **kwargs)
    answer = _answers[key]
    if isinstance(answer, gevent.Greenlet):
        answer = _answers[key] = answer.get()
    if isinstance(answer, _Failed):
        del _answers[key]  # asked again, it is read again
        raise answer.error
    return answer


def read_ahead(reads: Iterable[Read]) -> None:
    """Start reading each fact now, concurrently; `read_once` with the same arguments waits for it."""
    this_host = host._get_module()  # the greenlets below start without pyinfra's context
    channels = _channels.setdefault((id(this_host.state), this_host.name), Semaphore(READ_AHEAD_CHANNELS))

    def ask(fact: type[FactBase], kwargs: dict[str, Any]) -> Any:
        try:
            with channels, ctx_state.use(this_host.state), ctx_host.use(this_host):
                answer = this_host.get_fact(fact, **kwargs)
                gevent.sleep(0)  # let paramiko answer sshd's close before the slot is reused
                return answer
        except Exception as error:  # noqa: BLE001 -- raised again by read_once, where it is asked
            return _Failed(error)

    for fact, kwargs in reads:
        key = _key(fact, kwargs)
        if key not in _answers:
            _answers[key] = gevent.spawn(ask, fact, kwargs)
