"""A pyinfra deploy file for tests/test_facts_once.py: read_ahead and read_once on @local.

Two facts meet only when they are asked at the same time: each touches its own file, then
waits (at most 10 s) for the other's. A third fails (its answer cannot be read); it must raise where it is asked. Twelve more
count how many of them run at once: never more than READ_AHEAD_CHANNELS.
"""

import os
import shlex

from pyinfra import logger
from pyinfra.api import FactBase

from rigkit.plumbing.facts_once import read_ahead, read_once

MEET_DIR = shlex.quote(os.environ["RIGKIT_TEST_MEET_DIR"])


class Meets(FactBase):
    def command(self, me: str, other: str) -> str:
        return (f"touch {MEET_DIR}/{me}; for i in $(seq 200); do [ -f {MEET_DIR}/{other} ] && break; sleep 0.05; "
                f"done; [ -f {MEET_DIR}/{other} ] && echo met || echo alone")

    def process(self, output) -> str:
        return list(output)[0]


class Fails(FactBase):
    def command(self) -> str:
        return "echo not-a-number"

    def process(self, output) -> int:
        return int(list(output)[0])  # raises ValueError


class Crowd(FactBase):
    """How many Crowd commands run at the moment this one has run for 0.3 s (itself included)."""

    def command(self, n: int) -> str:
        return (f"mkdir -p {MEET_DIR}/crowd; touch {MEET_DIR}/crowd/{n}; sleep 0.3; "
                f"ls {MEET_DIR}/crowd | wc -l; rm {MEET_DIR}/crowd/{n}")

    def process(self, output) -> int:
        return int(list(output)[0])


read_ahead([(Meets, {"me": "a", "other": "b"}), (Meets, {"me": "b", "other": "a"}), (Fails, {})])
logger.info(f"rigkit-test: a {read_once(Meets, me='a', other='b')}, b {read_once(Meets, me='b', other='a')}")
try:
    read_once(Fails)
    logger.info("rigkit-test: Fails did not raise")
except Exception as error:  # noqa: BLE001
    logger.info(f"rigkit-test: Fails raised where asked: {type(error).__name__}")
read_ahead([(Crowd, {"n": n}) for n in range(12)])
logger.info(f"rigkit-test: most at once {max(read_once(Crowd, n=n) for n in range(12))}")


class Present(FactBase):
    """{name: True} for each name with a file in MEET_DIR/present; each run adds a line to MEET_DIR/present.log."""

    merged_over = "names"

    @staticmethod
    def default() -> dict:
        return {}  # pyinfra's answer to an empty output

    def command(self, names: tuple[str, ...], folder: str = "present") -> str:
        quoted = " ".join(shlex.quote(n) for n in names)
        return (f"echo {quoted} >> {MEET_DIR}/{folder}.log; "
                f"for n in {quoted}; do [ -f {MEET_DIR}/{folder}/$n ] && echo $n; done; exit 0")

    def process(self, output) -> dict:
        return {line: True for line in output}


os.makedirs(os.path.join(os.environ["RIGKIT_TEST_MEET_DIR"], "present"))
for name in ("a", "b", "c"):
    open(os.path.join(os.environ["RIGKIT_TEST_MEET_DIR"], "present", name), "w").close()
read_ahead([(Present, {"names": ("a", "x")}), (Present, {"names": ("b", "a")}),
            (Present, {"names": ("c",), "folder": "other"})])
logger.info(f"rigkit-test: present {sorted(read_once(Present, names=('a', 'x')))} "
            f"{sorted(read_once(Present, names=('b', 'a')))} {sorted(read_once(Present, names=('c',), folder='other'))}")


class FailsOnce(FactBase):
    """Present's shape, but its first command's answer cannot be read (process raises)."""

    merged_over = "names"

    def command(self, names: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(n) for n in names)
        return (f"if [ -f {MEET_DIR}/failed-once ]; then for n in {quoted}; do echo $n; done; "
                f"else touch {MEET_DIR}/failed-once; echo not-a-name; fi")

    def process(self, output) -> dict:
        if "not-a-name" in output:
            raise ValueError("unreadable")
        return {line: True for line in output}


def _ask_both() -> str:
    answers = []
    for names in (("p",), ("q",)):
        try:
            answers.append(",".join(sorted(read_once(FailsOnce, names=names))))
        except ValueError:
            answers.append("raised")
    return " ".join(answers)


read_ahead([(FailsOnce, {"names": ("p",)}), (FailsOnce, {"names": ("q",)})])
first = _ask_both()
read_ahead([(FailsOnce, {"names": ("p",)}), (FailsOnce, {"names": ("q",)})])  # read again, not the stored failure
logger.info(f"rigkit-test: fails once: {first}; read ahead again: {_ask_both()}")
