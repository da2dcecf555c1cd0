"""A tracking store moved away under Snakemake (issue 21): the next stage is one line.

The stage commands refuse a missing store before their work (tests/reliability/
test_rel_outputs.py); under Snakemake every job first goes through the pipeline-job wrapper
(the parent run RUNNING) and the Snakefile's onerror handler (open parents FAILED). Neither
may touch the store before it is checked: MLflow would create a fresh, empty one where the
old was moved away.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.workflow_runs import snakemake


def _copy(tiny_pipeline: Path, to: Path) -> Path:
    """A copy of the finished pipeline whose tracking.json files name the copy's store."""
    work = Path(shutil.copytree(tiny_pipeline, to, symlinks=True))
    for info in (work / "results").glob("*/tracking.json"):
        info.write_text(info.read_text().replace(str(tiny_pipeline), str(work)))
    return work


def test_a_moved_store_fails_the_next_stage_in_one_line_and_makes_no_fresh_store(
        tiny_pipeline: Path, tmp_path: Path) -> None:
    work = _copy(tiny_pipeline, tmp_path / "work")
    db = work / "results" / "mlflow.db"
    db.rename(work / "moved.db")
    runs = sorted(p.parent.name for p in (work / "results").glob("*/tracking.json"))
    outboxes = {run: sorted((work / "results" / run).rglob("*outbox*")) for run in runs}

    result = snakemake(work, "--cores", "1", "--forcerun", "eval_heff")

    assert result.returncode != 0
    logs = [p for p in sorted((work / "logs" / "eval_heff").rglob("*.log"))
            if ".attempt" not in p.name]  # each job's log, not the copies kept per attempt
    failed = [p for p in logs if " ERROR " in p.read_text()]
    assert len(failed) == 1, result.stderr[-3000:]
    text = failed[0].read_text()
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1, text
    assert f"tracking store {db} is missing" in errors[0]
    assert "names parent run" in errors[0] and "track-init" in errors[0], errors[0]
    assert "Traceback" not in text and "Traceback" not in result.stderr
    assert f"ERROR pipeline_lib.script: tracking store {db} is missing" in result.stderr
    assert not db.exists()  # no fresh store where the old one was
    assert {run: sorted((work / "results" / run).rglob("*outbox*")) for run in runs} == outboxes
    for run in runs:  # every parent still named as it was: nothing recreated elsewhere
        info = json.loads((work / "results" / run / "tracking.json").read_text())
        original = json.loads((tiny_pipeline / "results" / run / "tracking.json").read_text())
        assert info["parent_run_id"] == original["parent_run_id"]
