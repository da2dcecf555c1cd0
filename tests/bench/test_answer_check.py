"""Greedy answers under one decoding setting (what ``bench_generate --snapshot`` scores) and
the threshold pick, on the model that learned ``0123456789<eos>``."""

from __future__ import annotations

import pytest
from snapshot_helpers import SEQ_LEN

from pipeline_lib.bench.answer_check import (
    AnswerRun,
    against,
    answer_accuracy,
    answer_examples,
    pick_threshold,
    snapshot_task,
)
from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.generation import CacheOptions, parse_depth
from pipeline_lib.evaluate.stats import wilson_interval
from pipeline_lib.spec.config import BenchConfig

# the pattern continues "0123" with "456789" then EOS; nothing continues "12" with "x"
EXAMPLES = [{"prompt": "0123", "answer": "456789"}, {"prompt": "56", "answer": "789"},
            {"prompt": "12", "answer": "x"}]


def _answers(model, tokenizer, depth: str, share: str = "per_loop") -> AnswerRun:
    return answer_accuracy(model, tokenizer, EXAMPLES, depth=parse_depth(depth, None, 2),
                           cache=CacheOptions(kv_share=share), context_len=SEQ_LEN,
                           max_gen_toks=8, batch_size=2)


def test_answers_are_scored_as_the_generative_task_and_count_compute(trained_model, tokenizer):
    fixed = _answers(trained_model, tokenizer, "2")
    assert fixed.correct == [1.0, 1.0, 0.0] and fixed.loops == 2.0
    never = _answers(trained_model, tokenizer, "adaptive:0:2")  # never exits: the same
    assert (never.correct, never.loops, never.kv_bytes) == (fixed.correct, 2.0, fixed.kv_bytes)
    early = _answers(trained_model, tokenizer, "adaptive:1e9:2")  # every token after loop 1
    assert early.loops == 1.0
    last = _answers(trained_model, tokenizer, "2", share="last")
    assert last.kv_bytes_core * 2 == fixed.kv_bytes_core and last.kv_bytes < fixed.kv_bytes
    cell = against(fixed, never)
    lo, hi = wilson_interval(2, 3)
    assert cell["accuracy"] == 2 / 3 and (cell["ci_low"], cell["ci_high"]) == (lo, hi)
    assert (cell["diff"], cell["diff_lo"], cell["diff_hi"]) == (0.0, 0.0, 0.0)
    assert cell["inside_reference_interval"] and cell["n"] == 3


def test_pick_threshold_takes_the_cheapest_inside_the_reference_interval():
    reference = AnswerRun([1.0] * 16 + [0.0] * 4, 4.0, 0, 0)  # 0.8 [0.58, 0.92]
    runs = {"0.001": AnswerRun([1.0] * 16 + [0.0] * 4, 3.5, 0, 0),
            "0.01": AnswerRun([1.0] * 13 + [0.0] * 7, 2.5, 0, 0),  # 0.65: inside
            "0.1": AnswerRun([1.0] * 8 + [0.0] * 12, 1.5, 0, 0)}  # 0.4: outside
    assert pick_threshold(runs, reference) == "0.01"
    assert pick_threshold({"0.1": runs["0.1"]}, reference) is None


def test_examples_come_from_the_bench_sets_and_bad_names_are_config_errors():
    bench = BenchConfig(min_difficulty=1, max_difficulty=2, seed=3)
    rows = answer_examples(bench, "loopline_addition", 2)
    assert [r["level"] for r in rows] == [1, 2, 1, 2] and all(r["answer"] for r in rows)
    with pytest.raises(ConfigError, match="--task 'addition' is not a built-in task"):
        answer_examples(bench, "addition", 2)
    with pytest.raises(ConfigError, match="--examples 0 must be at least 1"):
        answer_examples(bench, "loopline_addition", 0)


def test_the_default_task_is_the_snapshots_own_built_in_task():
    """The demo trains on khop problems and benchmarks loopline_khop: answering addition
    problems instead scored 0 at every setting, an uninformative accuracy comparison."""
    assert snapshot_task(BenchConfig()) == "loopline_khop"  # the default config's
    assert snapshot_task(BenchConfig(tasks=["hellaswag", "loopline_parity"])) == \
        "loopline_parity"
    with pytest.raises(ConfigError, match=r"bench.tasks \['hellaswag'\] name no built-in task; "
                                          r"pass --task"):
        snapshot_task(BenchConfig(tasks=["hellaswag"]))


def test_bench_generate_runs_on_a_snapshot_and_reports_the_target_ratios(snapshot_dir, capsys):
    """``benchmarks/bench_generate.py --snapshot`` at a tiny setting (its timings are not
    checked: tests never assert wall-clock times)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_generate.py"
    spec = importlib.util.spec_from_file_location("bench_generate", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(["--snapshot", str(snapshot_dir), "--task", "loopline_addition",
                        "--examples", "1", "--new-tokens", "3", "--batch", "1", "2",
                        "--repeats", "1", "--thresholds", "0", "1e9", "--kv-share", "last"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    result = json.loads(out[-1])
    answers, targets = result["answers"], result["targets"]
    assert answers["threshold=0"]["loops"] == 2.0  # never exits: MAX (the training loops)
    assert answers["threshold=1e9"]["loops_over_max"] == 0.5
    assert answers["picked"] == "1e9" and targets["adaptive"] == "1e9:2"  # both inside
    assert targets["kv_share=last"]["kv_bytes_core_ratio"] == 0.5  # 1/H at H = 2
    assert set(targets) >= {"batch 1", "batch 2"}
    assert targets["batch 2"]["loops_computed_over_max"] == 0.5
    # every row exits after its first loop: each decoding pass runs one loop of two, and a
    # fixed pass's 1 + 2 + 1 blocks (one prelude, one core, one coda block) become 1 + 1 + 1
    assert targets["batch 2"]["pass_loops_over_max"] == 0.5
    assert targets["batch 2"]["block_bound"] == 1.333
    assert "adaptive+kv_share=last" in result["rows"][1]["settings"]
