"""pass@k, maj@k and lm-eval's filters scored per document, level and interval (no model)."""

from __future__ import annotations

from itertools import combinations

import pytest

from pipeline_lib.bench.sampled import (
    filter_samples,
    majority,
    pass_at_k,
    sampled_answers,
    sampled_scores,
)
from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.stats import score_interval


@pytest.mark.parametrize(("n", "c"), [(5, 0), (5, 1), (5, 3), (5, 5), (8, 2)])
def test_pass_at_k_is_the_chance_that_k_of_n_answers_hold_a_right_one(n, c):
    right = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        draws = list(combinations(right, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, draws)) / len(draws), abs=1e-12)


def test_majority_breaks_ties_like_lm_evals_majority_vote():
    from lm_eval.filters.selection import MajorityVoteFilter

    for answers in (["7", "8", "8", "7"], ["1", "2", "3"], ["9", "5", "5"]):
        want = list(MajorityVoteFilter().apply([answers], [{}]))[0][0]
        assert majority(answers) == want


def test_the_samples_metric_scores_first_answer_pass_and_majority():
    got = sampled_answers(["12"], [["1", "12", "12", "3", "12"]], k=[1, 3, 5])
    assert got == {"exact_match": 0.0, "pass@1": pytest.approx(0.6), "pass@3": 1.0,
                   "maj@3": 1.0, "pass@5": 1.0, "maj@5": 1.0}
    assert sampled_answers(["1"], ["1"], k=1) == {"exact_match": 1.0, "pass@1": 1.0}
    with pytest.raises(ConfigError, match=r"loopline_samples: k=6 needs 1 <= k <= repeats \(5"):
        sampled_answers(["1"], [["1"] * 5], k=[6])


def test_a_filters_samples_count_its_answers():
    config = {"repeats": 8, "filter_list": [
        {"name": "first", "filter": [{"function": "take_first"}]},
        {"name": "maj@8", "filter": [{"function": "majority_vote"}, {"function": "take_first"}]},
        {"name": "maj@4", "filter": [{"function": "take_first_k", "k": 4},
                                     {"function": "majority_vote"}]}]}
    assert [filter_samples(config, n) for n in ("first", "maj@8", "maj@4")] == [1, 8, 4]


def _sample(doc_id, level, filt, **scores):
    return {"doc_id": doc_id, "doc": {"level": level}, "filter": filt, **scores}


def test_sampled_scores_per_level_with_wilson_and_bootstrap_intervals():
    samples = [_sample(0, 1, "none", exact_match=1.0, **{"pass@2": 1.0, "maj@2": 1.0}),
               _sample(1, 1, "none", exact_match=0.0, **{"pass@2": 0.5, "maj@2": 0.0}),
               _sample(2, 2, "none", exact_match=0.0, **{"pass@2": 0.0, "maj@2": 0.0}),
               _sample(3, 2, "none", exact_match=1.0, **{"pass@2": 0.9, "maj@2": 1.0})]
    got = sampled_scores(samples, {"repeats": 2}, "exact_match", "level")
    assert list(got) == ["maj@2", "pass@2"]
    maj, pas = got["maj@2"], got["pass@2"]
    assert (maj["value"], maj["n"], maj["samples"]) == (0.5, 4, 2)
    assert (maj["ci_low"], maj["ci_high"]) == score_interval([1.0, 0.0, 0.0, 1.0])  # Wilson
    assert pas["value"] == pytest.approx(0.6) and pas["per_sample"] == {
        "0": 1.0, "1": 0.5, "2": 0.0, "3": 0.9}
    assert (pas["ci_low"], pas["ci_high"]) == score_interval([1.0, 0.5, 0.0, 0.9])  # bootstrap
    assert pas["levels"]["1"]["pass@2"] == 0.75 and pas["levels"]["2"]["n"] == 2
    assert sampled_scores(samples, {}, "exact_match", None)["maj@2"].get("levels") is None


def test_other_filters_of_a_task_are_sampled_scores():
    config = {"repeats": 3, "filter_list": [
        {"name": "first", "filter": [{"function": "take_first"}]},
        {"name": "vote", "filter": [{"function": "majority_vote"}, {"function": "take_first"}]}]}
    samples = [_sample(d, 1, f, exact_match=v) for d, f, v in
               ((0, "first", 0.0), (1, "first", 1.0), (0, "vote", 1.0), (1, "vote", 1.0))]
    got = sampled_scores(samples, config, "exact_match", "level")
    assert list(got) == ["exact_match/vote"]
    assert got["exact_match/vote"]["value"] == 1.0 and got["exact_match/vote"]["samples"] == 3
    assert got["exact_match/vote"]["levels"] == {"1": {"exact_match/vote": 1.0, "n": 2, **dict(
        zip(("ci_low", "ci_high"), score_interval([1.0, 1.0]), strict=True))}}
    greedy = [_sample(0, 1, "none", exact_match=1.0)]
    assert sampled_scores(greedy, {}, "exact_match", "level") == {}
