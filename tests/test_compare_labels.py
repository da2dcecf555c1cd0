"""Depth check on labelled tasks (compare.labels): the table, the paired comparisons on the
same documents, the targets in both directions, the figure, and the compare stage's files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_compare import depth_results

from pipeline_lib.compare import (
    LABELS_JSON,
    LABELS_PLOT,
    RunResults,
    compare_runs,
    labels_depth_check,
    run_dir_inputs,
    variant_kind,
)
from pipeline_lib.evaluate.heff import sweep_result
from pipeline_lib.evaluate.stats import document_bootstrap, paired_column_diffs, wilson_interval

TOKENS = 10  # labelled tokens of every document
DOCS = 20  # documents of every level
HS = (1, 2, 4, 8, 12)  # 12 = 3 × train_max_loops (4)


def _counts(accuracy: float, docs: int) -> list[int]:
    """Correct tokens per document: the first documents entirely right, one partly."""
    full, rest = divmod(round(accuracy * docs * TOKENS), TOKENS)
    return [TOKENS] * full + [rest] * (rest > 0) + [0] * (docs - full - (rest > 0))


def _cell(docs: list[dict], beyond: bool | None) -> dict:
    """A level's (or all levels') section, from its documents' correct counts."""
    tokens = sum(d["tokens"] for d in docs)
    acc = {h: sum(d["correct"][h] for d in docs) / tokens for h in docs[0]["correct"]}
    exact = {h: sum(d["correct"][h] == d["tokens"] for d in docs) for h in acc}
    best = min(acc, key=lambda h: (-acc[h], h))
    cell = {"documents": len(docs), "tokens": tokens,
            "accuracy": {str(h): a for h, a in acc.items()},
            "accuracy_ci": {str(h): list(wilson_interval(a * tokens, tokens))
                            for h, a in acc.items()},
            "exact_match": {str(h): k / len(docs) for h, k in exact.items()},
            "exact_match_ci": {str(h): list(wilson_interval(k, len(docs)))
                               for h, k in exact.items()},
            "best_h_eff": best, "best_accuracy": acc[best],
            "drop_after_best": acc[best] - min(a for h, a in acc.items() if h >= best)}
    return cell if beyond is None else {"beyond_training": beyond, **cell}


def labels_section(acc: dict[int, dict[int, float]], train_levels: tuple[int, ...] = (1, 2),
                   train_max_loops: int = 4, skip_first: dict[int, int] | None = None) -> dict:
    """A sweep's labels section: level → H_eff → accuracy, DOCS documents of TOKENS tokens
    per level (doc_index = 100·level + i), less the first ``skip_first[level]`` of a level."""
    skip = skip_first or {}
    hs = sorted({h for per_h in acc.values() for h in per_h})
    docs = [{"doc": 100 * lv + i, "level": lv, "tokens": TOKENS,
             "correct": {h: c[i - skip.get(lv, 0)] for h, c in counts.items()}}
            for lv, per_h in acc.items()
            for counts in [{h: _counts(a, DOCS - skip.get(lv, 0)) for h, a in per_h.items()}]
            for i in range(skip.get(lv, 0), DOCS)]
    return {"train_levels": list(train_levels), "train_max_loops": train_max_loops,
            "levels": {str(lv): _cell([d for d in docs if d["level"] == lv],
                                      lv > max(train_levels)) for lv in acc},
            "all": _cell(docs, None),
            "per_document": {"doc_index": [d["doc"] for d in docs],
                             "level": [d["level"] for d in docs],
                             "tokens": [d["tokens"] for d in docs],
                             "correct": {str(h): [d["correct"][h] for d in docs] for h in hs}}}


def _flat(values: dict[int, float]) -> dict[int, float]:
    return {h: values.get(h, values.get(0)) for h in HS}


# The passing experiment: loop4 (1 block × 4 loops) reaches 0.97 at H_eff=8 on level 3
# (beyond training), is exact in the training range from H_eff=4 and drops 0.005 at most up
# to H_eff=12; flat (1 × 1) stays at or below 0.6 on level 3; deep4 (4 × 1) scored only the
# last 15 documents of level 3.
PASSING = {
    "loop4": labels_section({1: {1: 0.6, 2: 0.9, 4: 1.0, 8: 1.0, 12: 1.0},
                             2: {1: 0.5, 2: 0.8, 4: 1.0, 8: 0.995, 12: 0.995},
                             3: {1: 0.5, 2: 0.6, 4: 0.8, 8: 0.97, 12: 0.96}}),
    "flat": labels_section({1: _flat({0: 0.9}), 2: _flat({0: 0.7}),
                            3: {1: 0.6, 2: 0.55, 4: 0.5, 8: 0.45, 12: 0.4}}, train_max_loops=1),
    "deep4": labels_section({1: _flat({0: 1.0}), 2: _flat({0: 0.9}),
                             3: {1: 1.0, 2: 0.8, 4: 0.7, 8: 0.6, 12: 0.5}}, train_max_loops=1,
                            skip_first={3: 5}),
}
# The failing one: every target missed.
FAILING = {
    "loop4": labels_section({1: _flat({0: 1.0}),
                             2: {1: 0.5, 2: 0.8, 4: 0.98, 8: 0.97, 12: 0.96},
                             3: {1: 0.7, 2: 0.75, 4: 0.85, 8: 0.9, 12: 0.88}}),
    "flat": labels_section({1: _flat({0: 0.9}), 2: _flat({0: 0.7}),
                            3: {1: 0.6, 2: 0.8, 4: 0.5, 8: 0.45, 12: 0.4}}, train_max_loops=1),
}
SHAPES = {"loop4": (1, 4), "flat": (1, 1), "deep4": (4, 1)}  # core blocks, training loops


def _runs(sections: dict[str, dict]) -> list[RunResults]:
    return [RunResults(name, 20, {1: 2.0}, {}, [], core_layers=SHAPES[name][0],
                       train_loops=SHAPES[name][1], labels=section)
            for name, section in sections.items()]


def _by(records: list[dict], **keys) -> dict:
    (match,) = [r for r in records if all(r[k] == v for k, v in keys.items())]
    return match


def test_table_marks_levels_beyond_training_and_carries_the_sweeps_numbers():
    check = labels_depth_check(_runs(PASSING))
    assert check["runs"] == ["loop4", "flat", "deep4"]  # looped, 1 loop, deep
    assert check["kinds"] == {"loop4": "looped", "flat": "shallow", "deep4": "deep"}
    assert (check["hardest_level"], check["train_max_level"]) == (3, 2)
    assert check["train"]["loop4"] == {"levels": [1, 2], "max_loops": 4}
    row = _by(check["table"], variant="loop4", level=3, h_eff=8)
    assert row["accuracy"] == pytest.approx(0.97) and row["beyond_training"] is True
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(wilson_interval(194, 200))
    assert (row["documents"], row["tokens"], row["best_h_eff"]) == (20, 200, 8)
    assert row["exact_match"] == 19 / 20  # 19 documents whole, one with 4 of 10 right
    assert _by(check["table"], variant="loop4", level=2, h_eff=4)["beyond_training"] is False
    deep = _by(check["table"], variant="deep4", level=3, h_eff=1)
    assert (deep["documents"], deep["tokens"], deep["accuracy"]) == (15, 150, 1.0)
    whole = _by(check["table"], variant="flat", level=None, h_eff=1)
    assert whole["accuracy"] == pytest.approx((180 + 140 + 120) / 600)
    assert len(check["table"]) == 3 * 4 * len(HS)  # variants × (3 levels + all) × H_eff


def test_paired_differences_on_the_documents_both_scored():
    check = labels_depth_check(_runs(PASSING))
    recs = check["comparisons"]
    # (flat, deep4) × level 3 at the best H_eff and at train_max_loops, levels 1 and 2 at
    # their best H_eff, which is train_max_loops (4)
    assert [(r["level"], r["setting"]) for r in recs[::2]] == [
        (1, "best H_eff = train_max_loops"), (2, "best H_eff = train_max_loops"),
        (3, "best H_eff"), (3, "train_max_loops")]
    # level 3, loop4 at its best H_eff=8 (194 of 200: documents 0-18 whole, 19 with 4)
    # against flat at ITS best H_eff=1 (120 of 200: documents 0-11 whole)
    rec = _by(recs, level=3, setting="best H_eff", other="flat")
    assert (rec["h_eff"], rec["other_h_eff"], rec["against"]) == (8, 1, "1 block × 1 loop")
    assert (rec["documents"], rec["tokens"]) == (20, 200)
    assert (rec["accuracy"], rec["other_accuracy"]) == pytest.approx((0.97, 0.6))
    assert rec["diff"] == pytest.approx(0.37)
    assert rec["lo"] > 0 and rec["verdict"] == "better" and rec["beyond_training"] is True
    assert (rec["exact_match"], rec["other_exact_match"]) == (19 / 20, 12 / 20)
    assert rec["p_mcnemar"] == 2 / 2**7  # 7 documents whole only for loop4
    assert rec["exact_match_ci"] == pytest.approx(list(wilson_interval(19, 20)))
    # the same interval, recomputed: Σ correct / Σ tokens, documents resampled for both sides
    a = np.array(_counts(0.97, 20), float)
    b = np.array(_counts(0.6, 20), float)
    reps = document_bootstrap(np.stack([a, b], axis=1), np.full(20, 10.0))
    expected = paired_column_diffs(reps, np.array([0.97, 0.6]), base=1)[0]
    assert (rec["lo"], rec["hi"]) == pytest.approx((expected.lo, expected.hi))
    assert (rec["ci_low"], rec["ci_high"]) == pytest.approx(
        tuple(np.nanquantile(reps[:, 0], [0.025, 0.975])))

    # deep4 scored documents 305-319 only: the pairs are those 15. loop4 at H_eff=8 has
    # 144 of 150 there (14 whole, 4), deep4 at its best H_eff=1 all 150: one document
    # differs, absent from over 2.5% of the resamples
    rec = _by(recs, level=3, setting="best H_eff", other="deep4")
    assert (rec["documents"], rec["tokens"], rec["other_h_eff"]) == (15, 150, 1)
    assert rec["diff"] == pytest.approx((144 - 150) / 150)
    assert rec["lo"] < 0 == rec["hi"] and rec["verdict"] == "no significant difference"
    # at train_max_loops (H_eff=4: documents 0-15 whole) 110 of 150: four documents differ
    rec = _by(recs, level=3, setting="train_max_loops", other="deep4")
    assert rec["h_eff"] == 4 and rec["diff"] == pytest.approx((110 - 150) / 150)
    assert rec["hi"] < 0 and rec["verdict"] == "worse"
    # level 1 at the best H_eff (4: all right) against flat (0.9 at every H_eff, best 1)
    rec = _by(recs, level=1, other="flat")
    assert (rec["h_eff"], rec["other_h_eff"], rec["diff"]) == (4, 1, pytest.approx(0.1))


def test_targets_met():
    check = labels_depth_check(_runs(PASSING))
    targets = {(t["variant"], t["target"]): t for t in check["targets"]}
    assert {k: t["met"] for k, t in targets.items()} == {
        ("loop4", "beyond_best_accuracy"): True,
        ("loop4", "beyond_gain_over_train_max_loops"): True,
        ("loop4", "beyond_gain_over_h1"): True,
        ("loop4", "train_range_accuracy"): True,
        ("loop4", "train_range_no_drop"): True,
        ("flat", "shallow_ceiling"): True}
    observed = {k: (t["level"], t["observed"]) for k, t in targets.items()}
    assert observed == {("loop4", "beyond_best_accuracy"): (3, pytest.approx(0.97)),
                        ("loop4", "beyond_gain_over_train_max_loops"): (3, pytest.approx(0.17)),
                        ("loop4", "beyond_gain_over_h1"): (3, pytest.approx(0.47)),
                        ("loop4", "train_range_accuracy"): (1, 1.0),
                        ("loop4", "train_range_no_drop"): (2, pytest.approx(0.005)),
                        ("flat", "shallow_ceiling"): (3, pytest.approx(0.6))}
    assert "(H_eff 8, 12)" in targets[("loop4", "train_range_no_drop")]["text"]
    assert check["all_met"] is True and check["notes"] == []


def test_targets_missed():
    check = labels_depth_check(_runs(FAILING))
    targets = {(t["variant"], t["target"]): (t["met"], t["level"], t["observed"])
               for t in check["targets"]}
    assert targets == {
        ("loop4", "beyond_best_accuracy"): (False, 3, pytest.approx(0.9)),
        ("loop4", "beyond_gain_over_train_max_loops"): (False, 3, pytest.approx(0.05)),
        ("loop4", "beyond_gain_over_h1"): (False, 3, pytest.approx(0.2)),
        ("loop4", "train_range_accuracy"): (False, 2, pytest.approx(0.98)),
        ("loop4", "train_range_no_drop"): (False, 2, pytest.approx(0.02)),  # at H_eff=12
        ("flat", "shallow_ceiling"): (False, 3, pytest.approx(0.8))}  # at H_eff=2
    assert check["all_met"] is False
    assert check["notes"] == ["no labelled deep variant among the runs"]


def test_targets_that_cannot_be_checked_say_why():
    """Every level inside the training range, and no H_eff past train_max_loops."""
    section = labels_section({1: {1: 0.5, 4: 1.0}, 2: {1: 0.4, 4: 0.995}}, train_levels=(1, 2))
    section["levels"]["2"]["beyond_training"] = False
    check = labels_depth_check(_runs({"loop4": section}))
    met = {t["target"]: t["met"] for t in check["targets"]}
    assert met == {"beyond_best_accuracy": None, "beyond_gain_over_train_max_loops": None,
                   "beyond_gain_over_h1": None, "train_range_accuracy": True,
                   "train_range_no_drop": None}
    assert check["all_met"] is False and check["comparisons"] == []
    assert "loop4: the hardest level 2 lies inside its training range" in check["notes"][0]
    assert "loop4: no H_eff in (4, 12] was evaluated" in check["notes"][1]
    assert labels_depth_check(_runs({"flat": None})) is None  # nothing labelled


def test_sampled_loop_counts_make_a_variant_looped(tmp_path: Path):
    from pipeline_lib.compare.runs import _model_shape
    from pipeline_lib.spec.config import Config
    from pipeline_lib.spec.config_model import ModelConfig
    from pipeline_lib.spec.config_train import LoopSamplingConfig, TrainConfig
    from pipeline_lib.spec.config_write import save_config

    model = ModelConfig(vocab_size=64, d_model=32, n_heads=2, core_layers=1, loops=1)
    kinds = {}
    for mode in ("fixed", "uniform", "poisson_lognormal"):
        path = tmp_path / f"{mode}.yaml"
        save_config(Config(model=model, train=TrainConfig(
            loop_sampling=LoopSamplingConfig(mode=mode, max_loops=16))), path)
        shape = _model_shape(path)
        kinds[mode] = (shape.max_loops, variant_kind(RunResults(
            mode, 1, {}, {}, [], train_loops=shape.loops, core_layers=shape.core_layers,
            max_loops=shape.max_loops)))
    assert kinds == {"fixed": (1, "shallow"), "uniform": (16, "looped"),
                     "poisson_lognormal": (16, "looped")}


def write_labelled_sweeps(results: Path, sections: dict[str, dict], step: int = 20) -> None:
    """The final H_eff sweep of each run of ``results``, with a labels section."""
    for name, section in sections.items():
        path = results / name / "eval" / "heff" / f"step_{step:07d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**sweep_result(step, {1: 2.0}, 100), "labels": section}))


LABELLED = {"alpha": PASSING["loop4"], "beta": PASSING["flat"], "gamma": PASSING["deep4"]}


def test_compare_writes_the_labelled_files_only_for_labelled_runs(tmp_path: Path):
    results = tmp_path / "results"
    dirs = depth_results(results)  # alpha 1 × 4, beta 1 × 1, gamma 4 × 1
    write_labelled_sweeps(results, LABELLED)
    out = results / "compare"
    compare_runs({n: run_dir_inputs(d) for n, d in dirs.items()}, out)
    check = json.loads((out / LABELS_JSON).read_text())
    assert check["kinds"] == {"alpha": "looped", "beta": "shallow", "gamma": "deep"}
    assert check["all_met"] is True
    assert _by(check["comparisons"], level=3, setting="best H_eff",
               other="beta")["diff"] == pytest.approx(0.37)
    png = (out / LABELS_PLOT).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    md = (out / "summary.md").read_text()
    opening = md.split("\n## ")[1]  # the first section after the title and intro
    assert opening.startswith("Labelled task: accuracy by level and test-time loops (H_eff)")
    cells = ["{:.3f} [{:.2f}, {:.2f}]".format(k / 200, *wilson_interval(k, 200))
             for k in (100, 120, 160, 194, 192)]
    cells[3] = f"**{cells[3]}**"  # the best H_eff
    assert ("### Level 3 (beyond training, hardest)\n\n"
            "| variant | kind | documents | tokens | H_eff=1 | H_eff=2 | H_eff=4 | H_eff=8 | "
            "H_eff=12 |\n|---|---|---|---|---|---|---|---|---|\n"
            f"| alpha | looped | 20 | 200 | {' | '.join(cells)} |\n"
            "| beta | 1 block × 1 loop | 20 | 200 | **0.600 [") in opening
    assert "### Level 2 (top training level)\n" in opening
    assert f"![accuracy vs H_eff by level, every variant]({LABELS_PLOT})" in opening
    assert opening.count("\n### Level ") == 3
    assert "- **met** · alpha: best accuracy over H_eff on level 3 (beyond training) ≥ 0.95: " \
        "0.970 at H_eff=8" in opening

    for name in LABELLED:  # the same runs unlabelled: what compare wrote before labels existed
        (results / name / "eval" / "heff" / "step_0000020.json").unlink()
    compare_runs({n: run_dir_inputs(d) for n, d in dirs.items()}, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.md", "summary.parquet", "depth_check.json", "loss_vs_heff.png",
         "accuracy_vs_heff.png", "train_loss.png"])  # the stale labelled files are gone
    plain = (out / "summary.md").read_text()
    assert "Labelled" not in plain
    title, intro = plain.split("\n\n", 2)[:2]
    assert md.startswith(f"{title}\n\n{intro}\n\n## Labelled task")
    assert md.endswith(plain.split("\n\n", 2)[2])  # the rest follows unchanged


def test_a_labels_section_without_its_keys_is_named():
    from pipeline_lib.errors import DataError

    section = {k: v for k, v in PASSING["flat"].items() if k != "per_document"}
    with pytest.raises(DataError, match="run flat: the labels section of its final H_eff "
                                        "sweep lacks per_document; rerun"):
        labels_depth_check(_runs({"flat": section}))


def test_adaptive_exit_by_level_is_read_from_the_sweep_and_tabled(tmp_path: Path):
    """The looped variant's adaptive exit per level (the sweep's adaptive labels section):
    accuracy at the loop each token stopped and the mean of those loops, per threshold."""
    results = tmp_path / "results"
    dirs = depth_results(results)
    write_labelled_sweeps(results, LABELLED)
    sweep = results / "alpha" / "eval" / "heff" / "step_0000020.json"
    data = json.loads(sweep.read_text())
    point = {"accuracy_ci": [0.0, 1.0], "tokens": 200}
    data["adaptive_by_criterion"] = {"kl": {"criterion": "kl", "labels": {
        "0.0": {"levels": {"1": {**point, "accuracy": 1.0, "mean_loops": 12.0},
                           "3": {**point, "accuracy": 0.96, "mean_loops": 12.0}}, "all": {}},
        "0.01": {"levels": {"1": {**point, "accuracy": 0.99, "mean_loops": 2.5},
                            "3": {**point, "accuracy": 0.9, "mean_loops": 7.25}}, "all": {}}}}}
    sweep.write_text(json.dumps(data))
    out = results / "compare"
    compare_runs({n: run_dir_inputs(d) for n, d in dirs.items()}, out)
    check = json.loads((out / LABELS_JSON).read_text())
    assert list(check["adaptive"]) == ["alpha"]  # looped variants only
    assert check["adaptive"]["alpha"]["kl"]["0.01"]["levels"]["3"]["mean_loops"] == 7.25
    md = (out / "summary.md").read_text()
    assert ("| level | never exits | kl < 0.01 |\n|---|---|---|\n"
            "| 1 | 1.000 at 12.0 loops | 0.990 at 2.5 loops |\n"
            "| 3 (beyond) | 0.960 at 12.0 loops | 0.900 at 7.2 loops |") in md
