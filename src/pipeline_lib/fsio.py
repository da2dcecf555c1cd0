"""Small file helpers every layer shares: an atomic text write and a file's sha256.

A leaf (standard library only): config, data, checkpoint, tracking, train and bench all
import it. Whole snapshot directories are published by :mod:`pipeline_lib.checkpoint.fsutil`.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

_HASH_CHUNK = 1 << 20  # bytes read per update: cache-sized pieces hash fastest here
# A full disk, an exhausted quota, a file-size limit, a read-only file system.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def write_text_atomic(path: Path, text: str, *, fsync: bool = False,
                      if_changed: bool = False) -> bool:
    """Write ``text`` to ``path`` through a hidden sibling renamed onto it; True if written.

    A reader sees the old content or the new, never a torn file, even if the writer is
    killed. The sibling (``.{name}.{pid}.tmp``) is unique per process, so parallel jobs
    writing the same file never share one. ``fsync`` flushes the data to disk before the
    rename (for records that must survive a crash of the machine); ``if_changed`` leaves a
    file that already holds ``text`` alone (no new mtime, so nothing downstream reruns).
    """
    path = Path(path)
    if if_changed and path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def output_file_problem(path: Path, *, directory: bool = False) -> str | None:
    """Why the file (or with ``directory``, the directory) ``path`` cannot be written,
    checked before any work is done: it is a directory (a file), or something above it is a
    file; None when neither (other failures, such as permissions or a full disk, show when
    it is written)."""
    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    if not directory and path.is_dir():
        return f"{path} is a directory"
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{blocker} is a file, not a directory"
    return None


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in pieces (bounded memory)."""
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def is_write_failure(exc: OSError, *targets: Path) -> bool:
    """Whether ``exc`` came from writing ``targets`` (a file below one of them is named) or
    is a storage failure (:data:`WRITE_ERRNOS`; a failed ``write()`` names no file), rather
    than from reading an input."""
    name = str(exc.filename or "")
    return exc.errno in WRITE_ERRNOS or any(name.startswith(str(t)) for t in targets)
