"""LiteLLM from PyPI for the tests, in its own venv (.state/litellm-venv): litellm[proxy]'s pins are
not rigkit's, so it is kept out of .venv. Made on first use, reused while the pinned version holds.
Never 1.107.0 (a compromised release)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rigkit.gateway import LITELLM_VERSION

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".state" / "litellm-venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / f".litellm-{LITELLM_VERSION}-2"
# redis needs async-timeout below Python 3.11.3: the rig image (tests/gateway/image.py) has 3.11.2.
EXTRA = ["async-timeout>=4.0.3"]


def litellm_python() -> Path:
    """The venv's python, with litellm[proxy]==LITELLM_VERSION installed (minutes the first time)."""
    assert LITELLM_VERSION != "1.107.0", "LiteLLM 1.107.0 was a compromised release"
    if STAMP.is_file() and PYTHON.is_file():
        return PYTHON
    if not PYTHON.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"litellm[proxy]=={LITELLM_VERSION}", *EXTRA], check=True, timeout=1200)
    STAMP.touch()
    return PYTHON
