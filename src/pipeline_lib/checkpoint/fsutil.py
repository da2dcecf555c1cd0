"""Crash-safe directory publication: temporary siblings, fsync, atomic rename or swap.

A snapshot is built in a hidden sibling ``.{name}.tmp-{host}-{pid}-{token}`` and only then
renamed onto its final name, so a reader never sees a half-written directory under the final
name. Replacing an existing directory uses ``renameat2(RENAME_EXCHANGE)`` (one atomic swap,
Linux ≥ 3.15 on ext4/xfs/btrfs/tmpfs) and falls back to rename-aside-then-rename elsewhere.
Leftovers of killed writers are removed by :func:`clean_stale_siblings` on the next write.

Torch-free: the best-snapshot helper and verification use it without the tensor stack.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import secrets
import shutil
import socket
from pathlib import Path

from ..holders import pid_alive

log = logging.getLogger(__name__)

_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (new names, renames) to stable storage."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def tmp_sibling(target: Path) -> Path:
    """A fresh hidden sibling of ``target`` to build it in (same filesystem, so rename works)."""
    token = secrets.token_hex(4)
    return target.parent / f".{target.name}{_TMP_MARK}{_host()}-{os.getpid()}-{token}"


def _owner_alive(name: str, mark: str) -> bool:
    """True when the sibling belongs to another live process on this host."""
    rest = name.split(mark, 1)[1]
    parts = rest.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != _host():
        return False  # another host (shared filesystem) or unknown shape: treat as stale
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    return pid != os.getpid() and pid_alive(pid)


def clean_stale_siblings(target: Path) -> list[Path]:
    """Remove ``.{name}.tmp-*`` / ``.{name}.old-*`` left by writers of ``target`` that died.

    One writer per target is the contract (Snakemake runs one job per output); siblings owned
    by another live process on this host are left alone anyway. Returns what was removed.
    """
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    for mark in (_TMP_MARK, _OLD_MARK):
        prefix = f".{target.name}{mark}"
        for entry in target.parent.iterdir():
            if not entry.name.startswith(prefix) or _owner_alive(entry.name, mark):
                continue
            log.info("removing stale snapshot leftover %s", entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _rename_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False when the platform or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_dir(tmp: Path, target: Path) -> None:
    """Move the finished directory ``tmp`` onto ``target``, replacing an existing one.

    The caller decides whether an existing ``target`` may be replaced. A new name appears
    with one rename; an existing one is swapped atomically where the kernel allows it, so
    at every instant ``target`` is either the complete old or the complete new directory.
    """
    fsync_dir(tmp)
    if not os.path.lexists(target):
        os.rename(tmp, target)
        fsync_dir(target.parent)
        return
    if _rename_exchange(tmp, target):
        fsync_dir(target.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the old directory
        return
    # Fallback: between the two renames the old copy lives on as a hidden .old- sibling.
    old = target.parent / f".{target.name}{_OLD_MARK}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(target, old)
    os.rename(tmp, target)
    fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (no copy), or a copy where links are impossible."""
    try:
        os.link(src, dst)
    except OSError:  # filesystems without hard links, or a cross-device path
        shutil.copy2(src, dst)


def link_tree(src: Path, dst: Path, *, skip: tuple[str, ...] = ()) -> None:
    """Make the new directory ``dst`` hold every file under ``src`` (but the names in
    ``skip``) as hard links: a second name for the same files, no extra disk. OSError when
    a link cannot be made (no hard links on this file system); ``dst`` is then removed."""
    try:
        for root, _dirs, files in os.walk(src):
            here = Path(dst) / Path(root).relative_to(src)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                if name not in skip:
                    os.link(Path(root) / name, here / name)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        raise
