"""A segment's MLflow child run records the kernels it ran: FlexAttention asked for on the CPU
falls back to SDPA for training (no CPU backward), and the run says so in its tags."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_helpers import make_pack, snap, tiny_config

from pipeline_lib.model.flex import reset_flex_decision
from pipeline_lib.spec.data_id import data_id
from pipeline_lib.workflow.stages.train import train_stage

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_decision() -> Iterator[None]:
    reset_flex_decision()
    yield
    reset_flex_decision()


def test_the_attention_fallback_is_an_mlflow_tag_of_the_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_decision) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny_config("tracking.enabled=true", f"tracking.uri={uri}", "model.attention=flex")
    pack = make_pack(tmp_path / "data" / data_id(cfg.data))
    out, _ = train_stage(cfg, pack, None, 2, snap(tmp_path / "run", 2))
    run_id = json.loads((out / "trainer_state.json").read_text())["tracking_run_id"]
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert tags["loopline.attention_kernel"] == "sdpa"
    assert tags["loopline.attention_fallback"].startswith("probe on cpu/float32: ")
    assert "does not support backward on CPU" in tags["loopline.attention_fallback"]
    assert "loopline.moe_grouped_mm_fallback" not in tags


def test_the_trainer_alone_tracks_nothing_the_train_stage_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracking is the train stage's (one door): the same tracked config trained by the
    trainer alone opens no store, through the stage it opens one ``train`` run."""
    from pipeline_lib.train.job import train_segment

    db = tmp_path / "mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny_config("tracking.enabled=true", f"tracking.uri=sqlite:///{db}")
    pack = make_pack(tmp_path / "data" / data_id(cfg.data))
    alone = train_segment(cfg, pack, None, 2, snap(tmp_path / "alone", 2))
    assert json.loads((alone / "trainer_state.json").read_text())["tracking_run_id"] is None
    assert not db.exists()
    staged, rank = train_stage(cfg, pack, None, 2, snap(tmp_path / "staged", 2))
    assert rank == 0 and db.exists()
    assert json.loads((staged / "trainer_state.json").read_text())["tracking_run_id"]
