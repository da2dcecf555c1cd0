"""A command's outputs written as a set: to hidden temporary siblings, published together.

The work writes every output through :meth:`OutputSet.file` (a sibling path with the same
extension, so writers that pick a format by extension still do) or :meth:`OutputSet.folder`
(a sibling directory whose files are moved into the target folder, next to what is already
there). Only when the whole body has succeeded are they renamed onto their targets, one
rename each (renames need no space); if anything fails, the siblings are removed, so a
failure leaves the previous outputs, or nothing. A write that fails for lack of space, a
read-only disk or a permission (:data:`STORAGE_ERRNOS`) becomes one
:class:`~pipeline_lib.errors.UsageError` line naming the output.

Standard library only (a leaf above :mod:`~pipeline_lib.errors` and :mod:`~pipeline_lib.fsio`).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UsageError
from .fsio import WRITE_ERRNOS

# Storage failures: a full disk, a quota, a file-size limit, a read-only mount, a permission.
STORAGE_ERRNOS = WRITE_ERRNOS | {errno.EACCES, errno.EPERM}


def storage_error(exc: OSError, path: Path | str | None = None) -> str:
    """The one line of a storage failure ``exc`` while writing ``path`` (default: the file
    ``exc`` names; of a copy or a rename, its destination, ``filename2``)."""
    where = path if path is not None else (exc.filename2 or exc.filename)
    target = f" {where}" if where else " an output (the system named no file)"
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        fix = "fix its permissions or pass another path"
    elif exc.errno == errno.EROFS:
        fix = "pass a path on a writable disk"
    else:
        fix = "free space there or pass a path on another disk"
    verb = "access" if path is None and exc.errno in (errno.EACCES, errno.EPERM) else "write"
    return f"cannot {verb}{target}: {reason}; {fix}"


class OutputSet:
    """The temporary siblings of one command's outputs (see the module docstring)."""

    def __init__(self) -> None:
        self._files: list[tuple[Path, Path]] = []  # (temporary sibling, target)
        self._folders: list[tuple[Path, Path]] = []
        self._made: list[Path] = []  # directories created for the targets, outermost first

    def _parent(self, target: Path) -> None:
        missing = [p for p in reversed(target.parents) if not p.exists()]
        target.parent.mkdir(parents=True, exist_ok=True)
        self._made += missing

    def file(self, target: Path) -> Path:
        """The path to write ``target`` at until the set is published."""
        target = Path(target)
        self._parent(target)
        tmp = target.with_name(f".{target.stem}.tmp-{os.getpid()}{target.suffix}")
        self._files.append((tmp, target))
        return tmp

    def folder(self, target: Path) -> Path:
        """A fresh directory whose files are moved into ``target`` when published."""
        target = Path(target)
        self._parent(target)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._folders.append((tmp, target))
        return tmp

    def publish(self) -> None:
        for tmp, target in self._folders:
            target.mkdir(parents=True, exist_ok=True)
            for entry in sorted(tmp.iterdir()):
                os.replace(entry, target / entry.name)
            tmp.rmdir()
        for tmp, target in self._files:
            os.replace(tmp, target)

    def discard(self) -> None:
        for tmp, _ in self._files:
            tmp.unlink(missing_ok=True)
        for tmp, _ in self._folders:
            shutil.rmtree(tmp, ignore_errors=True)
        for directory in reversed(self._made):
            try:
                directory.rmdir()
            except OSError:  # not empty (something else is there now) or already gone
                pass

    def failed_target(self, exc: OSError) -> Path | str | None:
        """The output a storage failure ``exc`` hit (all of them when the system named no
        file); None when ``exc`` came from something else (reading an input)."""
        names = [str(n) for n in (exc.filename2, exc.filename) if n]  # a copy's destination
        pairs = self._files + self._folders
        if names:
            for name in names:
                for tmp, target in pairs:
                    if name.startswith((str(tmp), str(target))):
                        return target
                if any(name == str(d) for d in self._made):
                    return name
            return None
        if exc.errno in STORAGE_ERRNOS:
            return ", ".join(str(target) for _, target in pairs) or None
        return None


@contextmanager
def output_set() -> Iterator[OutputSet]:
    """``with output_set() as outputs: write(outputs.file(a)); plot(outputs.file(b))``:
    both appear together at the end of the block, or neither (see the module docstring)."""
    outputs = OutputSet()
    try:
        yield outputs
        outputs.publish()
    except BaseException as exc:
        outputs.discard()
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            target = outputs.failed_target(exc)
            if target is not None:
                raise UsageError(f"{storage_error(exc, target)} (nothing was published)"
                                 ) from None
        raise
