"""Whose training logs a run directory holds, for snapshots outside a run's layout.

A snapshot under ``{run}/snapshots/`` logs to ``{run}/train/``: the directory is the run's.
A *loose* snapshot (``train --out /x/a``) logs beside itself, to ``/x/train/``; two runs
whose ``--out`` lie in one folder would then share ``/x/train/metrics.jsonl``, and the
second, starting at step 0, would cut away the first's lines (what is meant for an earlier
attempt's tail). ``train/owners.json`` lists the loose snapshots whose segments logged
there (paths relative to the run directory); a segment of another run is refused before
anything is built, and a run's logs stay that run's.

A segment belongs to the logs' run when its ``--out`` is listed (a retry, a segment
rerun) or its ``--resume-from`` is (the run goes on). A directory without ``owners.json``
(logs written before it existed, or none yet) is taken as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from ..fsio import write_text_atomic
from ..spec.layout import SNAPSHOTS_DIR, RunLayout, snapshots_dir_of


def _name(path: Path, run_dir: Path) -> str:
    return os.path.relpath(Path(path).resolve(), Path(run_dir).resolve())


def _owners(layout: RunLayout) -> list[str]:
    try:
        doc = json.loads(layout.log_owners.read_text())
    except (OSError, ValueError):
        return []
    owners = doc.get("snapshots") if isinstance(doc, dict) else None
    return [str(o) for o in owners] if isinstance(owners, list) else []


def check_run_logs(run_dir: Path, out: Path, resume_from: Path | None) -> None:
    """Refuse (ConfigError) when ``run_dir``'s logs belong to another run than the segment
    writing the loose snapshot ``out``. A snapshot in a run's layout
    (``{run}/snapshots/…``) is the run's own: nothing to check."""
    if snapshots_dir_of(out).name == SNAPSHOTS_DIR:
        return
    layout = RunLayout.at(run_dir)
    owners = _owners(layout)
    mine = {_name(out, run_dir)} | ({_name(resume_from, run_dir)} if resume_from else set())
    if owners and not mine & set(owners):
        shown = ", ".join(owners[:3]) + (f" and {len(owners) - 3} more" if len(owners) > 3
                                         else "")
        raise ConfigError(f"run directory {run_dir} holds the training logs ({layout.metrics}) "
                          f"of another run (snapshot {shown}); this run's would replace them: "
                          f"pass --run-dir a directory of its own (e.g. {out}.run), or put "
                          "--out in a folder of its own")


def claim_run_logs(run_dir: Path, out: Path) -> None:
    """Record the loose snapshot ``out`` among the owners of ``run_dir``'s logs (when its
    segment starts logging there, after :func:`check_run_logs`)."""
    if snapshots_dir_of(out).name == SNAPSHOTS_DIR:
        return
    layout = RunLayout.at(run_dir)
    owners = _owners(layout)
    if _name(out, run_dir) not in owners:
        layout.train_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(layout.log_owners,
                          json.dumps({"snapshots": [*owners, _name(out, run_dir)]}, indent=1))


__all__ = ["check_run_logs", "claim_run_logs"]
