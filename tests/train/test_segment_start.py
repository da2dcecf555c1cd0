"""How a segment starts is one value, decided once from the job's inputs (SegmentStart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline_lib.data.loader import DataCursor
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.train import rollback
from pipeline_lib.train.segment_start import (
    SegmentStart,
    input_digest,
    same_segment,
    segment_signature,
)
from pipeline_lib.train.segment_start import segment_start as start_of


def _snapshot(path: Path, step: int, preemptions: list | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps(
        {"step": step, "preemptions": preemptions or []}))
    return path


SIG = "5ea1ed0c0ffee"  # the job's train signature


def segment_start(run: Path, input_snapshot: Path | None, until: int, *,
                  signature: str = SIG, **kwargs) -> SegmentStart:
    return start_of(run, input_snapshot, until, signature=signature, **kwargs)


def _record(run: Path, input_snapshot: Path | None, input_step: int,
            signature: str = SIG) -> None:
    cursor = DataCursor(0, 8)
    rollback.write_record(run, rollback.make_record(
        input_snapshot=input_snapshot, input_step=input_step, abort_step=input_step + 3,
        first_bad_step=input_step + 1, window_start=cursor, window_end=DataCursor(0, 32),
        resume_cursor=DataCursor(0, 48), skip_steps=2, attempt=1, signature=signature))


def test_scratch_resume_and_warm_start(tmp_path: Path) -> None:
    previous = _snapshot(tmp_path / "snapshots" / "step_0000003", 3)
    init = _snapshot(tmp_path / "init", 0)
    assert segment_start(tmp_path, None, 3).kind == "scratch"
    resume = segment_start(tmp_path, previous, 6)
    assert (resume.kind, resume.load, resume.input) == ("resume", previous, previous)
    warm = segment_start(tmp_path, None, 3, warm_start=init)
    assert (warm.kind, warm.load, warm.warm_start) == ("warm start", None, init)
    assert resume.point == RunLayout.at(tmp_path).resume_point(6)


def test_resume_and_warm_start_exclude_each_other(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "s", 3)
    with pytest.raises(ConfigError, match="--warm-start and --resume-from exclude each other"):
        segment_start(tmp_path, snap, 6, warm_start=snap)


def test_a_resume_point_of_this_job_wins_and_a_foreign_one_is_removed(tmp_path: Path) -> None:
    previous = _snapshot(tmp_path / "snapshots" / "step_0000003", 3)
    point = RunLayout.at(tmp_path).resume_point(9)
    stop = {"input": str(previous), "until_step": 9, "segment_start": 3, "attempt": 1,
            "signature": SIG}
    _snapshot(point, 5, [stop])
    _record(tmp_path, previous, 3)  # a resume point comes first even on a retry
    start = segment_start(tmp_path, previous, 9, attempt=2, warm_start=None)
    assert (start.kind, start.load, start.stopped) == ("resume point", point, stop)
    assert start.rollback is None
    other = segment_start(tmp_path, None, 9)  # another input: not this job's point
    assert other.kind == "scratch" and not point.exists()


def test_a_retry_from_the_recorded_input_rolls_back(tmp_path: Path) -> None:
    previous = _snapshot(tmp_path / "snapshots" / "step_0000003", 3)
    _record(tmp_path, previous, 3)
    assert segment_start(tmp_path, previous, 9, attempt=1).kind == "resume"  # first try
    start = segment_start(tmp_path, previous, 9, attempt=2)
    assert start.kind == "rollback" and start.load == previous
    assert start.rollback["applied_attempt"] == 2 and start.rollback["resume_cursor"] == [0, 48]
    other = _snapshot(tmp_path / "snapshots" / "step_0000006", 6)
    assert segment_start(tmp_path, other, 9, attempt=2).kind == "resume"  # another input


def test_a_warm_started_retry_rolls_back_too(tmp_path: Path) -> None:
    init = _snapshot(tmp_path / "init", 0)
    _record(tmp_path, None, 0)
    start = segment_start(tmp_path, None, 3, attempt=3, warm_start=init)
    assert start.kind == "rollback" and start.warm_start == init and start.load is None


def test_state_of_another_signature_is_never_continued(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A resume point and a rollback record left under another config (the same job after
    train.lr changed): the retry starts from its input, and says so once."""
    previous = _snapshot(tmp_path / "snapshots" / "step_0000003", 3)
    point = RunLayout.at(tmp_path).resume_point(9)
    stop = {"input": str(previous), "until_step": 9, "segment_start": 3, "attempt": 1,
            "signature": "01d5"}
    _snapshot(point, 5, [stop])
    _record(tmp_path, previous, 3, signature="01d5")
    start = segment_start(tmp_path, previous, 9, attempt=2)
    assert (start.kind, start.load, start.stopped, start.rollback) == ("resume", previous,
                                                                      None, None)
    assert not point.exists()  # removed: never continued, and the path is this job's own
    lines = [r.getMessage() for r in caplog.records if str(point) in r.getMessage()]
    assert lines == [f"resume point {point} was made under train signature 01d5, this job's "
                     f"is {SIG} (the config changed since it stopped): not continued, removed; "
                     f"the segment starts from {previous}"]
    _snapshot(point, 5, [{**stop, "signature": None}])  # stopped before points had one
    assert segment_start(tmp_path, previous, 9).kind == "resume" and not point.exists()


def test_a_record_is_this_jobs_by_input_files_end_step_and_signature(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    previous = _snapshot(tmp_path / "snapshots" / "step_0000003", 3)
    (previous / "MANIFEST.json").write_text('{"files": "first training"}')
    record = {"input": str(previous), "input_manifest": input_digest(previous),
              "until_step": 9, "signature": "s1"}
    assert same_segment(record, previous, 9, "s1")
    monkeypatch.chdir(tmp_path)  # a job may name its input relative to its directory
    assert same_segment(record, Path("snapshots/step_0000003"), 9, "s1")
    assert not same_segment(record, previous, 9, "s2")  # another train signature
    assert not same_segment(record, previous, 12, "s1")  # another end step
    assert not same_segment({**record, "input": None}, previous, 9, "s1")  # from scratch
    (previous / "MANIFEST.json").write_text('{"files": "rebuilt"}')  # the same path retrained
    assert not same_segment(record, previous, 9, "s1")


def test_the_jobs_signature_is_the_workflows(tmp_path: Path) -> None:
    """What a segment records is the rule's ``params.signature``, from the run spec the job
    reads and from the YAML a multi-process job's workers read."""
    from pipeline_lib.spec.config_load import load_config
    from pipeline_lib.spec.config_write import config_yaml
    from pipeline_lib.spec.run_spec import read_run_spec, write_run_spec
    from pipeline_lib.workflow.plan import plan_for_snakemake

    tiny = Path(__file__).resolve().parents[2] / "config" / "experiments" / "tiny.yaml"
    plan = plan_for_snakemake({}, [tiny])
    for name, run in plan.runs.items():
        write_run_spec(run.spec, tmp_path / name)
        cfg = read_run_spec(tmp_path / name, plan.spec_ref(name).digest).config
        pack = tmp_path / "data" / run.data_id
        pack.mkdir(parents=True, exist_ok=True)
        (pack / "metadata.json").write_text(json.dumps({"data_id": run.data_id}))
        (tmp_path / "w.yaml").write_text(config_yaml(cfg))
        assert segment_signature(cfg, pack) == plan.train_signature(name)
        assert segment_signature(load_config(tmp_path / "w.yaml", []), pack) == \
            plan.train_signature(name)
