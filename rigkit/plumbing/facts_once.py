"""Read a fact once per host and deploy run, and read ahead: all of a rig's questions at once.

pyinfra 3 keeps no fact cache: every `host.get_fact` is a command and a round trip. While a
deploy file is loaded (pyinfra's planning phase, before anything changes on the rig), several
operations ask the same question -- each `rigkit.plumbing.files.put` of a role asks for the state of
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

Questions of one kind are asked as one: a fact whose answer is a dict by path or unit declares
the argument it reads over (`merged_over = "paths"`), and `read_ahead` asks it once for every
path the roles want (`merged_reads`); each role's question is answered with its own paths.
The demo rig's four file questions and two unit questions are two commands: each
command costs the rig a session and a shell (about 7 ms of CPU) before its own work.

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


class _Part:
    """A question answered from a wider read of the same fact (`merged_over`): its members only."""

    def __init__(self, whole: Any, members: tuple):
        self.whole, self.members = whole, set(members)  # whole: the wider read's greenlet or answer

    def answer(self) -> Any:
        whole = self.whole
        if isinstance(whole, _Part):
            whole = whole.answer()
        elif isinstance(whole, gevent.Greenlet):
            whole = whole.get()
        if isinstance(whole, _Failed):
            return whole
        return {member: value for member, value in whole.items() if member in self.members}


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
    if isinstance(answer, _Part):
        answer = answer.answer()
    elif isinstance(answer, gevent.Greenlet):
        answer = answer.get()
    if isinstance(answer, _Failed):
        del _answers[key]  # asked again, it is read again
        raise answer.error
    _answers[key] = answer
    return answer


def _known(key: tuple) -> bool:
    """Answered or being read; a read that failed is read again when asked ahead again (a wider
    read stays stored after the questions it answered raised)."""
    answer = _answers.get(key)
    if isinstance(answer, _Part):
        answer = answer.whole
    if isinstance(answer, gevent.Greenlet) and answer.ready() and isinstance(answer.value, _Failed):
        return False
    return key in _answers


def merged_reads(reads: Iterable[Read]) -> list[tuple[Read, list[Read]]]:
    """The reads `read_ahead` sends, each with the questions it answers: questions of a fact
    with `merged_over` that differ only in that argument become one read of all its values
    (in the order first asked, each once)."""
    merged: dict[tuple, tuple[Read, list[Read]]] = {}
    for fact, kwargs in reads:
        over = getattr(fact, "merged_over", None)
        group = (fact, tuple(sorted((k, v) for k, v in kwargs.items() if k != over)))  # all of them if None
        if over is None:
            merged.setdefault(group, ((fact, kwargs), [(fact, kwargs)]))  # asked twice: read once
            continue
        (_, wider), asked = merged.get(group, ((fact, {**kwargs, over: ()}), []))
        members = tuple(dict.fromkeys((*wider[over], *kwargs[over])))
        merged[group] = ((fact, {**wider, over: members}), [*asked, (fact, kwargs)])
    return list(merged.values())


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

    for (fact, kwargs), asked in merged_reads(reads):
        if all(_known(_key(f, k)) for f, k in asked):
            continue
        if not _known(_key(fact, kwargs)):
            _answers[_key(fact, kwargs)] = gevent.spawn(ask, fact, kwargs)
        reading = _answers[_key(fact, kwargs)]
        for question in asked:
            if not _known(_key(*question)):
                over = fact.merged_over  # only merged questions differ from the read
                _answers[_key(*question)] = _Part(reading, question[1][over])
