"""Lock files that name their holders, changed only by compare-and-swap.

The run's training lease (:mod:`pipeline_lib.train.lease`) and the results directory's
workflow lock (:mod:`pipeline_lib.workflow.results_lock`) are small JSON files saying who
holds them. They live on shared file systems (NFS, Lustre) where the one atomic test is
"create this name unless it exists", so every change goes through :meth:`HolderFile.change`:

* a new file is a complete temporary file hard-linked to the name (``link`` fails when the
  name exists: two creators never both win, and no reader sees half a record);
* an existing file is replaced or removed only under a *claim*: a sibling
  ``{name}.claim-{inode}-{mtime}`` created exclusively for that version of the file.
  Whoever holds the claim checks that the file is still that version, renames its new
  record over it (or removes it) and drops the claim. Two takers of one stale lock, or a
  release beside a take-over, can therefore never both succeed: the loser sees another
  version and decides again.

A claim lives for the microseconds of one rename; one left by a process killed inside them
is named, with the fix, after a few tries (never removed blindly: that would reopen the
race it closes).

Whether a holder still runs: :func:`process_state` says *alive* for a process on this host
whose pid runs with the start time recorded (``/proc/<pid>/stat`` with the boot id: a
reused pid is another process, *gone*), *gone* when it does not, and *unknown* for a
process on another host, which nothing here can check (the callers say how to proceed if
that host or job is gone). Standard library only: the Snakefile imports it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import PipelineError

ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"
_TRIES = 50  # compare-and-swap attempts before a left claim is reported
_RETRY_S = 0.05
Stamp = tuple[int, int, int]  # (inode, mtime in ns, size): one version of a holder file


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one that is not ours to signal counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from its third field on (None where there is none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": the comm may hold spaces


def process_start(pid: int) -> str | None:
    """When process ``pid`` started: ``{boot id}:{clock ticks after boot}`` from /proc
    (None where there is no /proc, or no such process)."""
    fields = _stat_fields(pid)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{fields[19]}" if fields and len(fields) > 19 else None  # field 22


def this_process() -> dict[str, Any]:
    """This process as a holder: host, pid, start time and when it took the lock."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": process_start(os.getpid()), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def process_state(holder: Mapping[str, Any]) -> str:
    """:data:`ALIVE`, :data:`GONE` or :data:`UNKNOWN` (another host) for a holder record of
    :func:`this_process`."""
    if holder.get("host") != socket.gethostname():
        return UNKNOWN
    try:
        pid = int(holder.get("pid", -1))
    except (TypeError, ValueError):
        return GONE
    fields = _stat_fields(pid)
    if not pid_alive(pid) or (fields and fields[0] in ("Z", "X")):
        return GONE  # no such process, or a dead one not yet reaped by its parent
    started, now = holder.get("started"), process_start(pid)
    if started and now and started != now:
        return GONE  # the pid was reused by a process that started later
    return ALIVE


class HolderFile:
    """One lock file holding a JSON record (see the module docstring). File problems (a
    directory in its place, no permission, a read-only disk, a record it did not write)
    raise ``error`` as one line naming the path and the fix."""

    def __init__(self, path: Path, what: str, error: type[PipelineError]) -> None:
        self.path, self.what, self.error = Path(path), what, error

    def change(self, decide: Callable[[dict[str, Any] | None], dict[str, Any] | None]
               ) -> dict[str, Any] | None:
        """Replace the record (None: no file) by ``decide(record)``, atomically; ``decide``
        runs again whenever another process changed the file meanwhile, and may raise to
        refuse. Returns the record now in place."""
        for _ in range(_TRIES):
            record, stamp = self.read()
            new = decide(record)
            if new == record or self._swap(stamp, new):
                return new
            time.sleep(_RETRY_S)
        claims = sorted(self.path.parent.glob(f"{self.path.name}.claim-*"))
        left = claims[0] if claims else self.path
        raise self.error(f"cannot change the {self.what} {self.path}: {left} stays in the way "
                         "(left by a process killed while changing it); if no loopline job "
                         f"or Snakemake is starting or ending on it now, delete {left} and "
                         "rerun")

    def read(self) -> tuple[dict[str, Any] | None, Stamp | None]:
        """The record and its version (None, None when there is no file)."""
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                blob = fh.read()
        except FileNotFoundError:
            return None, None
        except IsADirectoryError:
            raise self.error(f"the {self.what} {self.path} is a directory, not a file: move it "
                             "away (or remove it if it holds nothing of yours) and "
                             "rerun") from None
        except OSError as exc:
            raise self._file_error(exc, "read") from None
        try:
            record = json.loads(blob)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise self.error(f"the {self.what} {self.path} is not a record loopline wrote "
                             f"({len(blob)} bytes, not a JSON object); if no loopline job "
                             "uses it now, delete it and rerun")
        return record, (st.st_ino, st.st_mtime_ns, st.st_size)

    def _swap(self, stamp: Stamp | None, new: dict[str, Any] | None) -> bool:
        """Put ``new`` in place of the version ``stamp`` (None: of no file); False when the
        file is no longer that version."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._file_error(exc, "write") from None
        if stamp is None:
            return new is None or self._create(new)
        claim = self.path.with_name(f"{self.path.name}.claim-{stamp[0]}-{stamp[1]}")
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise self._file_error(exc, "write") from None
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(this_process()))
            if self._stamp() != stamp:
                return False
            if new is None:
                self.path.unlink()
            else:
                os.replace(self._temporary(new), self.path)
            return True
        finally:
            claim.unlink(missing_ok=True)

    def _stamp(self) -> Stamp | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _create(self, record: dict[str, Any]) -> bool:
        tmp = self._temporary(record)
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise self._file_error(exc, "write") from None
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def _temporary(self, record: dict[str, Any]) -> Path:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as fh:
                fh.write(json.dumps(record, indent=2) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):  # nothing to remove on a read-only disk
                tmp.unlink()
            raise self._file_error(exc, "write") from None
        return tmp

    def _file_error(self, exc: OSError, verb: str) -> PipelineError:
        return self.error(file_problem(exc, f"{verb} the {self.what} {self.path}"))


def file_problem(exc: OSError, doing: str) -> str:
    """One line for a file system error ``exc`` while ``doing`` (e.g. "write the lock X"):
    what the system said and what to do about it."""
    where = Path(exc.filename2 or exc.filename or ".").absolute()
    if exc.errno == errno.EISDIR:
        fix = f"{where} is a directory where a file belongs: move it away"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        fix = f"give this user read and write access to {where.parent} and the files in it"
    elif exc.errno == errno.EROFS:
        fix = ("the results directory must be on a writable file system "
               "(experiment.results_dir)")
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space on the disk of {where.parent}"
    else:
        fix = f"check {where}"
    return f"cannot {doing}: {exc.strerror or exc}; {fix}, then rerun"


__all__ = ["ALIVE", "GONE", "UNKNOWN", "HolderFile", "file_problem", "pid_alive", "process_start",
           "process_state", "this_process"]
