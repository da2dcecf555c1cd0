"""Per-attempt job logs: a retry must not erase why the first attempt failed.

Snakemake deletes a job's ``log:`` file before every attempt, a retry included. So each
execution of a script writes ``{stem}.attempt{N}{suffix}`` (N = 1, 2, …: the first free
number, claimed atomically), and the declared log is a hard link to it: Snakemake and
``--show-failed-logs`` read the current attempt under the declared name, and deleting that
name before the next attempt leaves the numbered file, with its content, in place.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import TextIO

log = logging.getLogger(__name__)


def attempt_path(log_path: Path, number: int) -> Path:
    """``logs/rule/x.log`` → ``logs/rule/x.attempt{number}.log``."""
    return log_path.with_name(f"{log_path.stem}.attempt{number}{log_path.suffix}")


def _claim(log_path: Path) -> tuple[int, int]:
    """(number, fd) of the first attempt file that did not exist yet (O_EXCL: atomic)."""
    number = 1
    while True:
        try:
            fd = os.open(attempt_path(log_path, number),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            return number, fd
        except FileExistsError:
            number += 1


def current_attempt(log_path: str | Path) -> int:
    """This job's attempt number: that of the newest numbered log (the one
    :func:`open_attempt_log` claimed). Kept on disk, it goes on counting through Snakemake's
    resubmissions and a SLURM requeue alike (Snakemake's own ``attempt`` restarts at 1 when
    SLURM requeues a job)."""
    log_path = Path(log_path)
    number = 1
    while attempt_path(log_path, number + 1).exists():
        number += 1
    return number


def open_attempt_log(log_path: str | Path) -> TextIO:
    """Open this attempt's log (line-buffered, append) under its numbered name and the
    declared ``log_path``; a header line says which attempt it is."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(log_path):
        if os.lstat(log_path).st_nlink == 1:  # a log written before attempts were numbered
            number, fd = _claim(log_path)
            os.close(fd)
            os.replace(log_path, attempt_path(log_path, number))
        else:
            log_path.unlink()
    number, fd = _claim(log_path)
    stream = os.fdopen(fd, "a", buffering=1)
    try:
        os.link(attempt_path(log_path, number), log_path)
    except OSError as exc:  # no hard links here: the declared log alone, as before
        stream.close()
        os.unlink(attempt_path(log_path, number))
        log.warning("cannot link %s to a per-attempt log (%s); a retry will replace it",
                    log_path, exc)
        stream = open(log_path, "a", buffering=1)  # noqa: SIM115 (the caller closes it)
    stream.write(f"=== attempt {number}: {time.strftime('%Y-%m-%d %H:%M:%S')}, pid "
                 f"{os.getpid()} on {socket.gethostname()}; every attempt is kept as "
                 f"{log_path.stem}.attempt<N>{log_path.suffix} ===\n")
    return stream
