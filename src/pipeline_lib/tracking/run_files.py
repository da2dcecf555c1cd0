"""The tracking files of a run directory: checked before a stage touches them, and their
I/O errors as one line.

``tracking.json``, the outbox and its sync state, the locks and ``tracking_files/`` (the
parent run's config artifacts and markers) are written by every tracked stage, under the
CLI and under Snakemake alike. A folder where one of them goes, a file this user cannot
read or write, or a read-only disk used to end in a traceback somewhere inside a stage
(under Snakemake, in the job's log). :func:`check_tracking_files` refuses each of them in
one :class:`~pipeline_lib.errors.TrackingError` line naming the path and the fix, before
the stage's work; :func:`tracking_io` turns an error met later anyway (a race, a full disk)
into the same kind of line.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import TrackingError
from ..spec.layout import RunLayout

_TURN_OFF = "or turn tracking off (tracking.enabled=false; --no-track on the command line)"


def tracking_paths(run_dir: Path) -> list[tuple[Path, bool]]:
    """(path, is a folder) of every tracking file and folder of ``run_dir``."""
    layout = RunLayout.at(run_dir)
    files = [layout.tracking_json, layout.tracking_lock, layout.outbox,
             layout.outbox_sync_state, layout.outbox_sync_lock, layout.tracking_ready,
             layout.parent_config, layout.parent_open, layout.parent_done,
             layout.headline_versions]
    return [(layout.tracking_files, True)] + [(path, False) for path in files]


def _wrong_kind(path: Path, folder: bool) -> str:
    found, wanted = ("a file", "a directory") if folder else ("a directory", "a file")
    return (f"{path} is {found}, where loopline's tracking keeps {wanted}; move it aside "
            f"and rerun (loopline never makes {found} there)")


def _no_access(path: Path) -> str | None:
    """Why this process cannot read and write ``path`` (None: it can)."""
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror}); fix its permissions, {_TURN_OFF}"
    if read_only:
        return (f"{path} is on a read-only file system, and the run's tracking records are "
                f"written there; make it writable, {_TURN_OFF}")
    mode = os.R_OK | os.W_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, mode):
        return (f"{path} cannot be read and written by this user; fix its permissions "
                f"(chmod u+rw), {_TURN_OFF}")
    return None


def check_tracking_files(run_dir: Path) -> None:
    """Every tracking path of ``run_dir`` that exists is of its kind (file or folder) and
    readable and writable here; one TrackingError line otherwise (see the module)."""
    for path, folder in tracking_paths(Path(run_dir)):
        if not os.path.lexists(path):
            continue
        if path.is_dir() != folder:
            raise TrackingError(_wrong_kind(path, folder))
        reason = _no_access(path)
        if reason is not None:
            raise TrackingError(reason)


@contextlib.contextmanager
def tracking_io(path: Path) -> Iterator[None]:
    """Run reads and writes of the tracking file ``path``; an OSError becomes one
    TrackingError line naming it (a folder there, permissions, a full or read-only disk)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EISDIR or Path(path).is_dir():
            raise TrackingError(_wrong_kind(Path(path), False)) from None
        fix = {errno.EACCES: "fix its permissions", errno.EPERM: "fix its permissions",
               errno.EROFS: "make its disk writable", errno.ENOSPC: "free space there",
               errno.EDQUOT: "free space there", errno.EFBIG: "free space there"
               }.get(exc.errno or 0, "check the disk")
        raise TrackingError(f"cannot read or write the tracking record {path}: "
                            f"{exc.strerror or exc}; {fix}, {_TURN_OFF}") from None
