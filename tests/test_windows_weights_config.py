"""Windows weights sources, before any rig is touched: where the copier mounts them, and which
ones the Windows fact's `docker.exe run --mount` could not carry. Pure; simulates nothing."""

from __future__ import annotations

import pytest

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.weights.layout import source_layout
from tests.conftest import DATA, copy_catalog

WIN_RIG = DATA / "rigs" / "windows.yml"
LINUX_SOURCE = "source: /srv/rigkit-sim-models/win-alpha"


def test_windows_sources_keep_their_spelling_and_a_cache_snapshot_mounts_its_model_folder():
    assert source_layout("C:\\models\\Qwen3-27B-AWQ") == ("C:\\models\\Qwen3-27B-AWQ", ".")
    hf = "C:\\hf\\hub\\models--Qwen--Qwen3-27B\\snapshots\\abc123"
    assert source_layout(hf) == ("C:\\hf\\hub\\models--Qwen--Qwen3-27B", "snapshots/abc123")
    assert source_layout("/srv/hf/models--a--b/snapshots/r") == ("/srv/hf/models--a--b", "snapshots/r")


@pytest.mark.parametrize("source", ["C:\\models\\a,b", 'C:\\models\\a"b'], ids=["comma", "double-quote"])
def test_a_windows_volume_source_the_mount_cannot_carry_is_refused(tmp_path, source):
    catalog = copy_catalog(tmp_path, win_alpha=[(LINUX_SOURCE, f"source: '{source}'")])
    with pytest.raises(ConfigError) as caught:
        load_rig(WIN_RIG, catalog)
    assert f"win-alpha.yml: weights.source: {source!r}: a Windows source copied onto a volume may not contain " \
        "a comma, a double quote or a control character" in str(caught.value)


def test_the_same_source_is_accepted_as_a_bind_mount_and_plain_ones_as_volumes(tmp_path):
    bind = copy_catalog(tmp_path / "bind", win_alpha=[(LINUX_SOURCE, "source: 'C:\\models\\a,b'\n  storage: bind")])
    assert load_rig(WIN_RIG, bind).models[0].spec.weights.storage == "bind"
    plain = copy_catalog(tmp_path / "plain", win_alpha=[(LINUX_SOURCE, "source: 'C:\\models\\My Models\\a'")])
    assert load_rig(WIN_RIG, plain).models[0].spec.weights.source == "C:\\models\\My Models\\a"
