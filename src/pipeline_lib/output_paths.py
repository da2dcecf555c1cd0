"""Checks of a stage's output locations, made before the stage does any work.

A stage owns only what it made. An output directory it replaces must be absent, empty, or
recognisably its own (a pack's metadata.json, a snapshot's MANIFEST.json, an export's
config.json, …: the caller says how to recognise it); an output file must not be a
directory; and the place it goes must be creatable: no file where a directory is needed
on the way, and a writable nearest existing directory. Each failure is one
:class:`~pipeline_lib.errors.UsageError` line naming the path and the fix, raised before
anything is read, built or written, so a refused command leaves the disk as it was.

Standard library only (a leaf above :mod:`~pipeline_lib.errors`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .errors import UsageError


def _writable(directory: Path) -> bool:
    """Whether new entries can be made in ``directory`` (permissions, a read-only mount)."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only and os.access(directory, os.W_OK | os.X_OK)


def check_creatable(path: Path, what: str) -> None:
    """``path`` can be made: its nearest existing ancestor is a writable directory."""
    path = Path(path)
    for ancestor in Path(os.path.abspath(path)).parents:
        if not os.path.lexists(ancestor):
            continue
        if not ancestor.is_dir():
            raise UsageError(f"{what} {path}: {ancestor} is a file, not a directory; pass a "
                             "path under a directory (or move that file away)")
        if not _writable(ancestor):
            raise UsageError(f"{what} {path}: cannot create entries in {ancestor} (not "
                             "writable); pass a path in a writable directory")
        return


def check_output_file(path: Path, what: str) -> None:
    """``path`` may be written as a file (created, or an earlier result replaced)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a file; pass a file path")
    check_creatable(path, what)


def check_output_dir(path: Path, what: str, *, owned: Callable[[Path], bool],
                     kind: str) -> None:
    """``path`` may be created or replaced as a directory: absent, empty, or ``owned`` by
    this stage (``kind`` names what ``owned`` recognises, e.g. "a data pack (no
    metadata.json)")."""
    path = Path(path)
    if os.path.lexists(path):
        if not path.is_dir():
            raise UsageError(f"{what} {path} is a file, not a directory; move it away or pass "
                             "another path")
        if any(path.iterdir()) and not owned(path):
            raise UsageError(f"{what} {path} exists and is not {kind}; pass a new path or "
                             "remove it by hand (nothing was changed)")
    check_creatable(path, what)


def check_output_location(path: Path, what: str) -> None:
    """``path`` is (or can become) a directory that a stage adds files to (a run directory,
    a folder of figures): not a file, and creatable."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"{what} {path} is a file, not a directory; move it away or pass "
                         "another path")
    if path.is_dir() and not _writable(path):
        raise UsageError(f"{what} {path} is not writable; pass a writable directory")
    check_creatable(path, what)
