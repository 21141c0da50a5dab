"""The results history on the control machine: `results/<rig>/<model>/*.json`, written atomically,
read by kind and by the time inside each document.

One folder holds several kinds of document: `verification` (rigkit.verify.result), `gate` (a
rollout's proof) and `tune` (rigkit tune). Each says its kind in a `kind` field; a document
written before that field existed is a verification if it has `passed`, a tune document if its
file is named `tune-*`. File names are never the order: a tune file named `tune-...` sorts after
every verification, and a clock set wrong names a file wrongly; the `time` inside is what counts.

A file that cannot be read as one result (truncated JSON, `[]`, no readable `time`) is skipped,
never taken as a failure or as the end of the history; each one is named in a warning.
Writes go to a temporary file in the same folder, fsynced, then `os.replace`d over the name:
a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

KINDS = ("verification", "gate", "tune")
Warn = Callable[[str], None]


@dataclass
class History:
    """The readable documents of one kind, newest first, and a warning per file skipped."""

    documents: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def kind_of(document: dict, path: Path) -> str | None:
    """The document's kind; None when it says none and is not recognisably an older one."""
    kind = document.get("kind")
    if kind is not None:
        return kind if kind in KINDS else None
    if Path(path).name.startswith("tune-"):
        return "tune"
    if "passed" in document:
        return "verification"
    return None


def document_time(document: dict) -> datetime | None:
    """The `time` inside the document as an aware datetime (a naive one is read as UTC)."""
    try:
        when = datetime.fromisoformat(str(document["time"]).replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def read_history(folder: Path, kind: str = "verification") -> History:
    """Every readable document of `kind` in `folder`, newest first by the time inside it."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    history = History()
    dated = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            history.warnings.append(f"{path}: skipped, not readable as JSON ({_short(exc)}); "
                                    "a write cut off? move it aside")
            continue
        if not isinstance(document, dict):
            history.warnings.append(f"{path}: skipped, holds a JSON {type(document).__name__}, not a result document")
            continue
        found = kind_of(document, path)
        if found is None:
            history.warnings.append(f"{path}: skipped, its kind is unknown (kind {document.get('kind')!r}, "
                                    f"no 'passed', not named tune-*)")
            continue
        if found != kind:
            continue
        when = document_time(document)
        if when is None:
            history.warnings.append(f"{path}: skipped, no readable 'time' in it ({document.get('time')!r})")
            continue
        dated.append((when, path.name, document))
    dated.sort(key=lambda d: (d[0], d[1]), reverse=True)
    history.documents = [d for _, _, d in dated]
    return history


def stderr_warning(text: str) -> None:
    print(f"rigkit: warning: {text}", file=sys.stderr)


def write_document(path: Path, document: dict) -> Path:
    """Write `document` as JSON at `path` atomically: temp file beside it, fsync, os.replace, fsync the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(document, indent=2) + "\n").encode()
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(folder)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is atomic
    finally:
        os.close(folder)
    return path


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__

