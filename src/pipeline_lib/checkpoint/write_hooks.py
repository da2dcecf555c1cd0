"""A seam in the snapshot writer: callbacks run once a file of a snapshot is on disk.

None are installed in production. The fault tests install one from outside
(``tests/support/faults.py``) that sleeps after a file, a window in which they SIGKILL the
writer in the middle of a snapshot, so the writer itself carries no test-only pause.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

FileHook = Callable[[Path], None]

_hooks: list[FileHook] = []


def file_written(path: Path) -> None:
    """Tell the installed hooks that ``path`` (in the temporary snapshot) is complete."""
    for hook in list(_hooks):
        hook(path)


def add_file_hook(hook: FileHook) -> Callable[[], None]:
    """Run ``hook(path)`` after every snapshot file from now on; returns its remover."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook)
