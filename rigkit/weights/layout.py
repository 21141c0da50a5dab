"""Where a model's weights are on the rig, as the copier must see them. Pure; no Docker."""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath

from rigkit.config.paths import is_windows_path
from rigkit.config.schema import ModelConfig


def helper_image(model: ModelConfig) -> str:
    """The image the copier runs in: any with python3; by default the model's serving image."""
    return model.spec.weights.helper_image or model.spec.image


def source_layout(source: str) -> tuple[str, str]:
    """(the folder to mount, the model folder inside it, in POSIX form: the copier's view). A
    Hugging Face cache snapshot (models--ORG--NAME/snapshots/<revision>) holds only symlinks into
    ../../blobs, so the whole models--ORG--NAME folder is mounted and the links may point anywhere
    inside it. A Windows source (`C:\\models\\x`, as Docker Desktop takes bind sources) keeps its
    Windows spelling for the mount."""
    path = PureWindowsPath(source) if is_windows_path(source) and ":" in source[:2] else PurePosixPath(source)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith(("models--", "datasets--")):
        return str(path.parent.parent), path.relative_to(path.parent.parent).as_posix()
    return source, "."
