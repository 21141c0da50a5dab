"""Where a model's weights are on the rig, as the copier must see them. Pure; no Docker."""

from __future__ import annotations

from pathlib import PurePosixPath


def source_layout(source: str) -> tuple[str, str]:
    """(the folder to mount, the model folder inside it). A Hugging Face cache snapshot
    (models--ORG--NAME/snapshots/<revision>) holds only symlinks into ../../blobs, so the
    whole models--ORG--NAME folder is mounted and the links may point anywhere inside it."""
    path = PurePosixPath(source)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith(("models--", "datasets--")):
        return str(path.parent.parent), str(path.relative_to(path.parent.parent))
    return source, "."
