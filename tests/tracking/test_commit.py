"""The exactly-once commit rule and MLflow-safe params, against a real SQLite store."""

from __future__ import annotations

import pytest
from tracking_helpers import client, steps_of

from pipeline_lib.errors import TrackingError
from pipeline_lib.tracking.commit import (
    MAX_PARAM_VAL_LENGTH,
    check_metric_key,
    clean_params,
    commit_points,
    latest_steps,
    log_params_once,
    select_new,
)
from pipeline_lib.tracking.store import ensure_store


def _run(uri: str) -> str:
    exp = ensure_store(uri, "commit")
    return client(uri).create_run(exp).info.run_id


def test_select_new_drops_committed_steps_per_key_and_keeps_last_duplicate() -> None:
    points = [("a", 1.0, 3, 0), ("a", 2.0, 4, 0), ("b", 5.0, 1, 0), ("a", 9.0, 4, 1),
              ("b", 6.0, 2, 0), ("c", 7.0, 0, 0)]
    assert select_new(points, {"a": 3, "b": 1}) == [
        ("c", 7.0, 0, 0), ("b", 6.0, 2, 0), ("a", 9.0, 4, 1)]


def test_commit_is_exactly_once_across_overlapping_retries(store_uri: str) -> None:
    run_id = _run(store_uri)
    c = client(store_uri)
    first = [("train/loss", 1.0 / s, s, 1000 + s) for s in range(1, 1501)]
    assert commit_points(c, run_id, first) == 1500  # two log_batch calls (1000 + 500)
    # a retry re-logs 1001..2000 with new timestamps: only 1501..2000 are new
    retry = [("train/loss", 1.0 / s, s, 5000 + s) for s in range(1001, 2001)]
    assert commit_points(c, run_id, retry) == 500
    assert commit_points(c, run_id, retry) == 0
    assert steps_of(store_uri, run_id, "train/loss") == list(range(1, 2001))
    assert latest_steps(c, run_id) == {"train/loss": 2000}
    # keys are independent: a new key at an old step is committed
    assert commit_points(c, run_id, [("heff/best_h", 4.0, 10, 0)]) == 1
    history = c.get_metric_history(run_id, "train/loss")
    assert {m.step: m.value for m in history}[1200] == pytest.approx(1 / 1200)


def test_params_are_logged_once_and_changes_are_tagged(store_uri: str) -> None:
    run_id = _run(store_uri)
    c = client(store_uri)
    assert log_params_once(c, run_id, {"a": 1, "b": [1, 2]}) == []
    assert log_params_once(c, run_id, {"a": 1, "b": [1, 2], "c": "x"}) == []
    assert log_params_once(c, run_id, {"a": 2, "b": [1, 2]}) == ["a"]
    run = c.get_run(run_id)
    assert run.data.params == {"a": "1", "b": "[1, 2]", "c": "x"}
    assert run.data.tags["loopline.params_changed"] == "a"


def test_long_values_are_truncated_to_mlflow_limits(store_uri: str) -> None:
    run_id = _run(store_uri)
    long = "x" * (MAX_PARAM_VAL_LENGTH + 50)
    assert len(clean_params({"k": long})["k"]) == MAX_PARAM_VAL_LENGTH
    log_params_once(client(store_uri), run_id, {"k": long, "n" * 300: 1})
    params = client(store_uri).get_run(run_id).data.params
    assert params["k"].endswith("...") and len(params["k"]) == MAX_PARAM_VAL_LENGTH
    assert "n" * 250 in params


@pytest.mark.parametrize("key", ["", "a//b", "/abs", "a/../b", "bad*name", "x" * 251,
                                 "train/loss\n"])  # $ of re.match passed a final newline
def test_bad_metric_names_are_refused_at_log_time(key: str) -> None:
    with pytest.raises(TrackingError, match="metric name"):
        check_metric_key(key)


def test_good_metric_names_pass() -> None:
    for key in ["train/loss", "heff/loss_h4", "bench/loopline_khop/acc_h8", "moe/load:e3"]:
        check_metric_key(key)
