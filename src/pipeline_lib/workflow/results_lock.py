"""One workflow at a time on a results directory: the lock the main Snakemake process holds.

Snakemake's own lock (``.snakemake/locks``) lives in the working directory. Two working
directories whose configs name the same ``experiment.results_dir`` share nothing: both
would train the same segment, and one's failure handling would delete the other's outputs.
So the main Snakemake process takes ``{results}/.workflow_lock.json``
(:attr:`~pipeline_lib.spec.layout.ResultsLayout.workflow_lock`, a
:class:`~pipeline_lib.holders.HolderFile`) in the Snakefile's ``onstart``, before any job
starts and before the run specs are written, and lets it go in ``onsuccess``/``onerror``
(and, as a last resort, when the process exits). The file lists the Snakemake processes
holding it, each with its host, pid, start time and working directory:

* **another working directory's** workflow holding it: refused in one line naming that
  workflow's host, pid and working directory, and the way out if it is gone;
* **the same working directory's** workflow holding it: this call joins it. Snakemake's own
  lock already decides what two calls of one working directory may do: two calls whose
  outputs do not overlap run side by side, as before; overlapping ones are refused by
  Snakemake (``LockException``) before ``onstart``;
* a holder that is gone (a Snakemake killed with ``kill -9``, a pid now used by another
  process) is dropped: its lock is taken over, atomically (two takers never both win).

Only the main process takes it: a cluster job's Snakemake runs without hooks
(``--no-hooks``: no ``onstart``), and :func:`hold_results_dir` also skips
``workflow.remote_exec``. A dry run (``-n``), ``--unlock``, ``--cleanup-metadata``, a call
with nothing to do, or one with ``--no-hooks`` never runs ``onstart`` and takes nothing.
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..holders import GONE, UNKNOWN, HolderFile, process_state, this_process

log = logging.getLogger(__name__)

WHAT = "workflow lock"


def _lock(plan: Any) -> HolderFile:
    return HolderFile(plan.layout.workflow_lock.absolute(), WHAT, ConfigError)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("host", "pid", "started"))


def _refusal(results: Path, path: Path, other: dict[str, Any], state: str) -> ConfigError:
    gone = (f"; if that Snakemake is gone (its host is down), delete {path} and rerun"
            if state == UNKNOWN else "")
    return ConfigError(
        f"results directory {results} is in use by another workflow: Snakemake process "
        f"{other.get('pid')} on host {other.get('host')} in working directory "
        f"{other.get('workdir')} (since {other.get('since')}; lock {path}). Two workflows on "
        "one results directory would train the same segments and delete each other's "
        "outputs: wait for it to finish, or run this one from that working directory, or "
        f"give it another experiment.results_dir{gone}")


def _joined(record: dict[str, Any] | None, me: dict[str, Any], results: Path,
            path: Path) -> dict[str, Any]:
    """The record with ``me`` among its holders: the gone ones dropped, another working
    directory's live (or unknowable) one refused."""
    holders = []
    for holder in (record or {}).get("holders") or []:
        state = process_state(holder)
        if _same(holder, me) or state == GONE:
            if not _same(holder, me):
                log.warning("taking over %s from a workflow that is gone: %s", path, holder)
            continue
        if holder.get("workdir") != me["workdir"]:
            raise _refusal(results, path, holder, state)
        holders.append(holder)
    return {"holders": [*holders, me]}


def _without(record: dict[str, Any] | None, me: dict[str, Any]) -> dict[str, Any] | None:
    """The record without ``me`` (None: nobody left)."""
    if record is None:
        return None
    holders = [h for h in record.get("holders") or [] if not _same(h, me)]
    return {**record, "holders": holders} if holders else None


_held: dict[str, Any] = {}  # the lock this process holds: {"plan": …, "me": …}


def hold_results_dir(workflow: Any, plan: Any) -> None:
    """Take (or join) the results directory's workflow lock for this Snakemake process;
    :class:`ConfigError` (one line) when another working directory's workflow holds it."""
    if getattr(workflow, "remote_exec", False):
        return
    me = {**this_process(), "workdir": str(Path.cwd().resolve())}
    lock = _lock(plan)
    lock.change(lambda record: _joined(record, me, lock.path.parent, lock.path))
    if not _held:
        atexit.register(release_results_dir)
    _held.update(plan=plan, me=me)


def release_results_dir() -> None:
    """Let this process's hold of the lock go (nothing when it holds none); a file problem
    is a warning: the entry of a process that has ended is dropped by the next call."""
    if not _held:
        return
    held, me = _lock(_held["plan"]), _held["me"]
    try:
        held.change(lambda record: _without(record, me))
    except ConfigError as exc:
        log.warning("could not release the results directory: %s", exc)
    _held.clear()


__all__ = ["hold_results_dir", "release_results_dir"]
