"""The command line: which verb runs, on which folders, and how its failures end (a report and an exit
code)."""

import errno
import json
import sys

from . import state
from .check import check
from .local_copy import copy
from .receive import receive
from .send import manifest, send
from .state import SourceError, report
from .verify import verify


def run_action(action, say):
    """Run one mode; its failures as a report through `say` and an exit code."""
    try:
        return action()
    except SourceError as exc:
        say(status="error", error=str(exc))
        return 2
    except BrokenPipeError:
        say(status="error", error="the target rig stopped reading the stream")
        return 2
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            say(status="error", error="no space", needed_bytes=0, free_bytes=0)
            return 3
        say(status="error", error=f"{exc.strerror}: {exc.filename}")
        return 2


def main(argv):
    if len(argv) >= 2 and argv[1] == "check-each":
        return check_each(argv)
    relay = {"manifest": manifest, "send": send, "receive": receive}
    if len(argv) in (3, 4) and argv[1] in relay:
        state.SRC = state.DST = argv[2]
        action = relay[argv[1]]
        if argv[1] == "receive" and len(argv) == 4:
            action = lambda: receive(int(argv[3]))  # noqa: E731
        # The sender's stdout is the stream: its report goes to stderr.
        say = (lambda **f: print(json.dumps(f), file=sys.stderr, flush=True)) if argv[1] == "send" else report
        return run_action(action, say)
    actions = {"check": check, "copy": copy, "verify": verify}
    if len(argv) < 2 or argv[1] not in actions or len(argv) > 5:
        report(status="error", error=f"usage: check|copy|verify [SRC DST [ROOT]] | manifest|send VOLUME | receive "
               f"VOLUME [CHUNK_BYTES], not {argv[1:]!r}")
        return 2
    state.SRC, state.DST = (argv[2], argv[3]) if len(argv) >= 4 else (state.SRC, state.DST)
    state.ROOT = argv[4] if len(argv) == 5 else state.SRC
    return run_action(actions[argv[1]], report)


def check_each(argv):
    """check for several volumes in one python3 start (the deploy's fact asks for all of a rig's
    volumes at once): "volume NAME" before each one's report."""
    rest = argv[2:]
    if not rest or len(rest) % 4:
        report(status="error", error=f"usage: check-each NAME SRC DST ROOT [NAME SRC DST ROOT ...], not {rest!r}")
        return 2
    for i in range(0, len(rest), 4):
        name, src, dst, root = rest[i:i + 4]
        print(f"volume {name}", flush=True)
        try:
            main([argv[0], "check", src, dst, root])
        except Exception as exc:  # one volume's surprise (a manifest missing a key) is its own answer
            report(status="error", error=f"{type(exc).__name__}: {exc}")
    return 0
