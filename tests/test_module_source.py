"""rigkit.plumbing.render.module_source: the files rigkit ships to rigs as they are (pynvml, the
telemetry sampler), read without running the module. Nothing simulated: the installed modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.plumbing.render import module_source


def test_the_source_is_the_modules_file_and_the_module_does_not_run():
    code = ("import sys; from rigkit.plumbing.render import module_source; data = module_source('pynvml'); "
            "print(len(data), 'pynvml' in sys.modules)")
    size, imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                    check=True).stdout.split()
    import pynvml
    import rigkit.verify.telemetry

    assert int(size) == len(Path(pynvml.__file__).read_bytes()) and imported == "False"
    assert module_source("pynvml") == Path(pynvml.__file__).read_bytes()
    assert module_source("rigkit.verify.telemetry") == Path(rigkit.verify.telemetry.__file__).read_bytes()


def test_a_missing_module_is_named():
    with pytest.raises(FileNotFoundError, match="no_such_module_here is not installed"):
        module_source("no_such_module_here")
