"""Headline results on the parent run: one point per key, step and version; a new version at
the same steps; exactly once across retries, processes and outbox replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracking_helpers import client, free_port, make_config

from pipeline_lib.spec.config import Config
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.tracking import init_parent_run, start_stage, sync_outbox
from pipeline_lib.tracking import sink as sink_module
from pipeline_lib.tracking.headline import TAG_PREFIX

FIRST = {"heff/final_loss": {1: 2.0, 2: 1.5, 4: 1.25}, "heff/best_h_eff": {0: 4.0}}
SECOND = {"heff/final_loss": {1: 1.9, 2: 1.4, 4: 1.3}, "heff/best_h_eff": {0: 2.0}}


def _log(cfg: Config, run_dir: Path, values: dict, *, fresh_process: bool = False) -> int:
    if fresh_process:  # a new process: no sink, no cache of what was committed
        sink_module._SINKS.clear()
    with start_stage(cfg, run_dir, "eval_heff/step_0000030") as stage:
        return stage.log_headline("heff", values, {"step": 30})


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float, int]]:
    return sorted((m.step, m.value, m.timestamp) for m in client(uri).get_metric_history(run_id, key))


def test_a_version_is_logged_once_and_a_new_one_at_the_same_steps(
        cfg: Config, run_dir: Path, store_uri: str) -> None:
    parent = init_parent_run(cfg, "base", run_dir, "d0")["parent_run_id"]
    assert _log(cfg, run_dir, FIRST) == 4
    assert _log(cfg, run_dir, FIRST) == 0  # a rerun with the same numbers
    assert _log(cfg, run_dir, FIRST, fresh_process=True) == 0  # a retried job
    first = _history(store_uri, parent, "heff/final_loss")
    assert [(s, v) for s, v, _ in first] == [(1, 2.0), (2, 1.5), (4, 1.25)]
    assert len({t for _, _, t in first}) == 1  # one version, one timestamp

    assert _log(cfg, run_dir, SECOND, fresh_process=True) == 4  # the final snapshot changed
    both = _history(store_uri, parent, "heff/final_loss")
    assert [s for s, _, _ in both] == [1, 1, 2, 2, 4, 4]
    run = client(store_uri).get_run(parent)
    tag = json.loads(run.data.tags[TAG_PREFIX + "heff"])
    assert tag["step"] == 30 and tag["timestamp_ms"] > first[0][2]
    current = {s: v for s, v, t in both if t == tag["timestamp_ms"]}
    assert current == SECOND["heff/final_loss"]
    # the run list shows the newest version: latest = largest step, then newest timestamp
    assert run.data.metrics == {"heff/final_loss": 1.3, "heff/best_h_eff": 2.0}
    recorded = json.loads(RunLayout.at(run_dir).headline_versions.read_text())
    assert recorded["heff"]["timestamp_ms"] == tag["timestamp_ms"]


def test_offline_headline_is_replayed_exactly_once(cfg: Config, run_dir: Path, store_uri: str,
                                                   request: pytest.FixtureRequest) -> None:
    dead = make_config(f"http://127.0.0.1:{free_port()}", request.node.name)
    init_parent_run(dead, "base", run_dir, "d0")
    assert _log(dead, run_dir, FIRST) == 4
    assert _log(dead, run_dir, FIRST, fresh_process=True) == 4  # written again: store unknown
    report = sync_outbox(run_dir, store_uri)
    assert report.skipped == 0
    parent = client(store_uri).search_runs(
        [client(store_uri).get_experiment_by_name(cfg.experiment.name).experiment_id],
        filter_string="tags.`loopline.role` = 'parent'")[0].info.run_id
    assert [s for s, _, _ in _history(store_uri, parent, "heff/final_loss")] == [1, 2, 4]
    assert [s for s, _, _ in _history(store_uri, parent, "heff/best_h_eff")] == [0]
    assert sync_outbox(run_dir, store_uri).metrics == 0
    assert _log(cfg, run_dir, FIRST, fresh_process=True) == 0  # online again, same numbers
    assert [s for s, _, _ in _history(store_uri, parent, "heff/final_loss")] == [1, 2, 4]


def test_non_finite_values_are_left_out(cfg: Config, run_dir: Path, store_uri: str) -> None:
    parent = init_parent_run(cfg, "base", run_dir, "d0")["parent_run_id"]
    assert _log(cfg, run_dir, {"heff/final_loss": {1: float("nan"), 2: 1.0}}) == 1
    assert [s for s, _, _ in _history(store_uri, parent, "heff/final_loss")] == [2]
