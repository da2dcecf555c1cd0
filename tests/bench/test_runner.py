"""run_benchmarks end to end through lm_eval.simple_evaluate (offline) on the tiny snapshot.

Per-level scores are recomputed here without lm-eval: multiple choice by comparing the
model's own continuation log-probabilities, generation by a plain greedy loop.
"""

from __future__ import annotations

import json

import pytest
from snapshot_helpers import direct_continuation_logprob, greedy_reference

from pipeline_lib.bench.runner import run_benchmarks, task_manager_for
from pipeline_lib.bench.tasks import GENERATION_STOPS
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import BenchConfig

pytestmark = pytest.mark.slow


def expected_level_scores(rows, model, tokenizer, h_eff, multiple_choice, max_gen_toks):
    enc = lambda s: tokenizer.encode(s).ids  # noqa: E731
    hits: dict[str, list[float]] = {}
    for row in rows:
        if multiple_choice:
            scores = [direct_continuation_logprob(model, enc(row["prompt"]), enc(c), h_eff)
                      for c in row["choices"]]
            hit = scores.index(max(scores)) == row["label"]
        else:
            eos = tokenizer.token_to_id("<|endoftext|>")
            text = tokenizer.decode(greedy_reference(model, enc(row["prompt"]), h_eff,
                                                     max_gen_toks, eos))
            cuts = [text.find(s) for s in GENERATION_STOPS if s in text]
            hit = (text[:min(cuts)] if cuts else text) == row["answer"]
        hits.setdefault(str(row["level"]), []).append(float(hit))
    return {level: sum(v) / len(v) for level, v in hits.items()}


def test_builtin_tasks_scored_per_task_level_and_h_eff(bench_report, small_bench, trained_model,
                                                       tokenizer):
    report, out_json, tasks_dir = bench_report
    assert json.loads(out_json.read_text()) == json.loads(json.dumps(report))
    assert report["step"] == 7 and report["h_eff"] == [1, 3]
    assert report["train_max_difficulty"] == 2 and report["train_loops"] == 2
    assert sorted(report["tasks"]) == sorted(small_bench.tasks)
    chance = {"loopline_khop": 0.25, "loopline_parity": 0.5, "loopline_addition": None}
    for name, info in report["tasks"].items():
        assert info["chance"] == chance[name] and info["n"] == 6
        rows = [json.loads(line) for line in (tasks_dir / f"{name}.jsonl").read_text().splitlines()]
        metric = info["metric"]
        for h in (1, 3):
            scores = info["h_eff"][str(h)]
            assert sorted(scores["levels"]) == ["1", "2", "3"]
            assert all(s["n"] == 2 for s in scores["levels"].values())
            levels = {lv: s[metric] for lv, s in scores["levels"].items()}
            assert levels == expected_level_scores(
                rows, trained_model, tokenizer, h, info["output_type"] == "multiple_choice",
                small_bench.max_gen_toks)
            assert scores["overall"][metric] == pytest.approx(sum(levels.values()) / 3)


def test_task_names_lm_eval_cannot_find_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown lm-eval task\(s\) \['loopline_khop'\]"):
        task_manager_for(["loopline_khop"], tmp_path)  # its files were never written there


def test_bad_h_eff_list_is_a_config_error(snapshot_dir, tmp_path):
    with pytest.raises(ConfigError, match="H_eff"):
        run_benchmarks(snapshot_dir, BenchConfig(), tmp_path, None, [0, 2])


def test_user_tasks_run_next_to_builtins_with_levels_from_level_field(
        snapshot_dir, trained_model, tokenizer, tmp_path, monkeypatch):
    from user_task_helpers import echo_rows, pointer_rows, write_user_tasks

    user = write_user_tasks(tmp_path / "my_tasks", level_field="depth")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the YAMLs' relative data_files still resolve
    bench = BenchConfig(tasks=["loopline_parity"], include_path=str(user), level_field="depth",
                        examples_per_level=2, max_difficulty=2, batch_size=4, max_gen_toks=6,
                        h_eff=[1, 3])
    report = run_benchmarks(snapshot_dir, bench, tmp_path / "tasks", None)
    assert list(report["tasks"]) == ["loopline_parity", "my_echo", "my_pointer"]
    assert report["bench"]["include_path"] == str(user)
    assert sorted(report["tasks"]["loopline_parity"]["h_eff"]["3"]["levels"]) == ["1", "2"]
    for name, rows, multiple_choice in (("my_pointer", pointer_rows(), True),
                                        ("my_echo", echo_rows(), False)):
        info = report["tasks"][name]
        assert not info["builtin"] and info["levelled"]
        assert info["metric"] == ("acc" if multiple_choice else "exact_match")
        rows = [{**r, "level": r["depth"]} for r in rows]
        for h in (1, 3):
            levels = info["h_eff"][str(h)]["levels"]
            assert {lv: s["n"] for lv, s in levels.items()} == {"1": 2, "2": 2}
            assert {lv: s[info["metric"]] for lv, s in levels.items()} == expected_level_scores(
                rows, trained_model, tokenizer, h, multiple_choice, 6)


def test_naming_one_user_task_runs_only_that_one(snapshot_dir, tmp_path):
    from user_task_helpers import write_user_tasks

    user = write_user_tasks(tmp_path / "my_tasks", level_field="level")
    bench = BenchConfig(tasks=["my_pointer"], include_path=str(user), h_eff=[2], batch_size=4)
    report = run_benchmarks(snapshot_dir, bench, tmp_path / "tasks", None)
    assert list(report["tasks"]) == ["my_pointer"]
    assert sorted(report["tasks"]["my_pointer"]["h_eff"]["2"]["levels"]) == ["1", "2"]
    with pytest.raises(ConfigError, match=r"bench\.tasks names unknown task\(s\) \['my_pointr'\]"):
        run_benchmarks(snapshot_dir, BenchConfig(tasks=["my_pointr"], include_path=str(user)),
                       tmp_path / "tasks", None)


def test_the_trained_difficulty_range_leaves_heldout_sources_out():
    from pipeline_lib.bench.runner import _train_max_difficulty
    from pipeline_lib.spec.config import Config, DataConfig, SourceConfig

    sources = [SourceConfig(type="reasoning", max_difficulty=3),
               SourceConfig(type="reasoning", min_difficulty=5, max_difficulty=8, heldout=True)]
    assert _train_max_difficulty(Config(data=DataConfig(sources=sources))) == 3
    assert _train_max_difficulty(Config(data=DataConfig(sources=sources[1:]))) is None
