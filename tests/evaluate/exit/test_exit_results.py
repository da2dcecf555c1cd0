"""Per-token adaptive exit: exactness at the ends, a direct reference, monotonicity, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.exit.criteria import adaptive_logits
from pipeline_lib.evaluate.exit.results import adaptive_section
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.exit.summary import adaptive_rows, summarize_adaptive
from pipeline_lib.evaluate.heff import run_heff, sweep_losses
from pipeline_lib.evaluate.sweep_pass import sweep_batch, sweep_pass
from pipeline_lib.spec.config_model import ModelConfig

VOCAB, SEQ, H = 40, 24, 6
HUGE = 1e9


@pytest.fixture(scope="module")
def model():
    from pipeline_lib.model.looped import LoopedLM

    # Large init: predictions keep moving from loop to loop, so exits spread over loops.
    torch.manual_seed(3)
    return LoopedLM(ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=2, loops=2,
                                init_std=0.3, tie_embeddings=False)).eval()


@pytest.fixture(scope="module")
def batches() -> list[dict[str, torch.Tensor]]:
    """Three batches of two documents per row; some targets ignored (row ends, padding)."""
    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (3, SEQ + 1), generator=gen)
        doc = (torch.arange(SEQ) >= SEQ // 2).long().expand(3, SEQ).clone()
        pos = torch.cat([torch.arange(SEQ // 2)] * 2).expand(3, SEQ).clone()
        targets = ids[:, 1:].clone()
        targets[:, SEQ // 2 - 1] = -100  # the last token of the first document
        targets[2, -4:] = -100  # padding
        out.append({"input_ids": ids[:, :-1], "targets": targets, "doc_ids": doc,
                    "position_ids": pos})
    return out


def spec(*thresholds: float, criterion: str = "kl", max_loops: int = H) -> ExitSpec:
    return ExitSpec(thresholds, criterion, max_loops).resolved([max_loops])


def adaptive_sweep(model, batches, spec: ExitSpec, max_tokens: int) -> dict:
    """The adaptive section of one criterion alone (a pass without fixed H_eff readouts)."""
    return adaptive_section(sweep_pass(model, batches, [], [spec], max_tokens).adaptive[0])


@torch.no_grad()
def reference(model, batches, threshold: float, criterion: str, max_loops: int
              ) -> tuple[float, float]:
    """(loss, mean loops) from a direct per-token computation over full logits."""
    total, loops, n = 0.0, 0, 0
    for batch in batches:
        ctx = model.embed(batch)
        state = model.init_state(ctx)
        logps = [torch.log_softmax(model.readout_logits(state, ctx), -1)]  # readout 0
        for t in range(1, max_loops + 1):
            state = model.forward_loops(ctx, t - 1, t, state)
            logps.append(torch.log_softmax(model.readout_logits(state, ctx), -1))
        valid = batch["targets"] != -100
        for b, i in valid.nonzero().tolist():
            exit_at = max_loops
            for t in range(1, max_loops):
                p = logps[t][b, i].exp()
                if criterion == "kl":
                    score = float((p * (logps[t][b, i] - logps[t - 1][b, i])).sum())
                else:
                    score = float(-(p * logps[t][b, i]).sum())
                if max(score, 0.0) < threshold:
                    exit_at = t
                    break
            total -= float(logps[exit_at][b, i, batch["targets"][b, i]])
            loops += exit_at
            n += 1
    return total / n, loops / n


# ------------------------------------------------------------------ the two ends


@pytest.mark.parametrize("criterion", ["kl", "entropy"])
def test_threshold_zero_is_exactly_the_fixed_max_h_loss(model, batches, criterion):
    fixed, tokens = sweep_losses(model, batches, [1, 2, 4, H], 10**6)
    section = adaptive_sweep(model, batches, spec(0.0, 0.05, criterion=criterion), 10**6)
    zero = section["points"][0]
    assert zero["threshold"] == 0.0
    assert zero["loss"] == fixed[H]  # exact, not approximate
    assert zero["mean_loops"] == H and zero["tokens"] == tokens == section["tokens"]
    assert zero["vs_fixed"] == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
    assert section["fixed_loss"] == fixed[H]


@pytest.mark.parametrize("criterion", ["kl", "entropy"])
def test_huge_threshold_exits_every_token_at_loop_one(model, batches, criterion):
    fixed, _ = sweep_losses(model, batches, [1, H], 10**6)
    point = adaptive_sweep(model, batches, spec(HUGE, criterion=criterion), 10**6)["points"][0]
    assert point["mean_loops"] == 1.0
    assert point["loss"] == pytest.approx(fixed[1], rel=1e-6)
    assert point["loss"] != pytest.approx(fixed[H], rel=1e-3)  # depth matters for this model


def test_max_loops_one_is_the_h_eff_one_loss(model, batches):
    fixed, _ = sweep_losses(model, batches, [1, 2], 10**6)
    section = adaptive_sweep(model, batches, spec(0.0, 0.1, max_loops=1), 10**6)
    assert [p["loss"] for p in section["points"]] == [fixed[1], fixed[1]]
    assert [p["mean_loops"] for p in section["points"]] == [1.0, 1.0]


# ------------------------------------------------------------------ against a direct computation


@pytest.mark.parametrize(("criterion", "thresholds"),
                         [("kl", (0.01, 0.1, 1.0)), ("entropy", (2.3, 2.7, 3.0))])
def test_matches_a_direct_per_token_computation(model, batches, criterion, thresholds):
    section = adaptive_sweep(model, batches, spec(*thresholds, criterion=criterion), 10**6)
    mean_loops = []
    for point, x in zip(section["points"], thresholds, strict=True):
        loss, loops = reference(model, batches, x, criterion, H)
        assert point["threshold"] == x
        assert point["mean_loops"] == pytest.approx(loops, abs=1e-12)
        assert point["loss"] == pytest.approx(loss, rel=1e-5)
        mean_loops.append(loops)
    # The thresholds were picked so that tokens exit at several different loops.
    assert len(set(mean_loops)) == 3 and 1.0 < min(mean_loops) and max(mean_loops) < H


@pytest.mark.parametrize("criterion", ["kl", "entropy"])
def test_mean_loops_fall_as_the_threshold_rises(model, batches, criterion):
    grid = (0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0, 3.5, 10.0)
    points = adaptive_sweep(model, batches, spec(*grid, criterion=criterion), 10**6)["points"]
    loops = [p["mean_loops"] for p in points]
    assert [p["threshold"] for p in points] == list(grid)
    assert all(b <= a for a, b in zip(loops, loops[1:], strict=False))
    assert loops[0] == H and loops[-1] == 1.0 and len(set(loops)) >= 4


def test_batch_columns_and_exit_loops(model, batches):
    losses, exits = sweep_batch(model, batches[2], [], [spec(0.0, 0.1, HUGE)]).exits[0]
    n = int((batches[2]["targets"] != -100).sum())
    assert losses.shape == (n, 4) and exits.shape == (n, 3)
    assert torch.equal(losses[:, 1], losses[:, 0])  # threshold 0: the fixed column
    assert (exits[:, 0] == H).all() and (exits[:, 2] == 1).all()
    assert ((exits[:, 1] >= 1) & (exits[:, 1] <= H)).all()


def test_reference_sweep_supplies_the_fixed_loss(model, batches):
    swept = sweep_pass(model, batches, [2, H], [spec(0.0, 0.1)], 10**6)
    docs = swept.fixed
    section = adaptive_section(swept.adaptive[0], reference=docs)
    assert section["points"][0]["loss"] == docs.means()[H] == section["fixed_loss"]
    assert section["documents"] == len(docs.tokens)
    assert section["points"][1]["stderr"] > 0


def test_token_budget_stops_where_the_fixed_sweep_stops(model, batches):
    _, tokens = sweep_losses(model, batches, [H], 50)
    section = adaptive_sweep(model, batches, spec(0.0), 50)
    assert section["tokens"] == tokens < sum(int((b["targets"] != -100).sum()) for b in batches)


# ------------------------------------------------------------------ logits for lm-eval


@pytest.mark.parametrize("criterion", ["kl", "entropy"])
def test_adaptive_logits_read_each_position_at_its_exit(model, batches, criterion):
    ids = batches[0]["input_ids"]
    threshold = 0.1 if criterion == "kl" else 3.0
    logits, exits = adaptive_logits(model, ids, ExitSpec((threshold,), criterion, H))
    by_loop = model.logits_by_loops(ids, list(range(1, H + 1)))
    assert logits.shape == (3, SEQ, VOCAB) and exits.shape == (3, SEQ)
    assert len(set(exits.flatten().tolist())) > 1
    for b in range(3):
        for i in range(SEQ):
            assert torch.equal(logits[b, i], by_loop[int(exits[b, i])][b, i])
    zero_logits, zero_exits = adaptive_logits(model, ids, ExitSpec((0.0,), criterion, H))
    assert (zero_exits == H).all() and torch.equal(zero_logits, by_loop[H])


# ------------------------------------------------------------------ settings and errors


@pytest.mark.parametrize(("bad", "pattern"), [
    (ExitSpec((0.0, -0.5)), r"eval\.adaptive\.thresholds \(kl\) = -0\.5 must be a finite "
                            r"number >= 0"),
    (ExitSpec((0.5, 1.5), "gate"), r"gate threshold is a cumulative exit probability in "
                                       r"\[0, 1\]"),
    (ExitSpec((1.5,), "argmax_stable"), r"argmax_stable takes a whole number"),
    (ExitSpec((float("nan"),)), r"eval\.adaptive\.thresholds"),
    (ExitSpec(()), r"eval\.adaptive\.thresholds"),
    (ExitSpec((0.1,), "margin"), r"eval\.adaptive\.criteria lists 'margin'"),
    (ExitSpec((0.1,), "kl", -2), r"eval\.adaptive\.max_loops = -2 must be >= 1"),
])
def test_bad_spec_is_one_line(bad, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        bad.resolved([4])
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ run_heff and the summary


def test_run_heff_writes_the_adaptive_section(tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    out = tmp_path / "sweep.json"
    result = run_heff(snap, data_dir, [1, 2, 4], out, max_tokens=600, batch_rows=4,
                      adaptive=ExitSpec((0.0, 1e-3, HUGE)))
    section = result["adaptive_by_criterion"]["kl"]
    assert json.loads(out.read_text())["adaptive_by_criterion"] == {"kl": section}
    assert "adaptive" not in result  # the one-criterion section of earlier versions is gone
    assert (section["criterion"], section["max_loops"]) == ("kl", 4)
    assert [p["threshold"] for p in section["points"]] == [0.0, 1e-3, HUGE]
    assert section["points"][0]["loss"] == result["losses"]["4"]
    assert section["points"][-1]["loss"] == pytest.approx(result["losses"]["1"], rel=1e-6)
    assert section["points"][-1]["mean_loops"] == 1.0
    assert section["tokens"] == result["tokens"]
    for fill in ("latest", "skip"):  # what a cached decoder spends (test_exit_replay.py)
        never, *_, every = (p["spent"][fill] for p in section["points"])
        assert (never["loss"], never["mean_loops"]) == (result["losses"]["4"], 4.0)
        assert every["mean_loops"] == 1.0
    # prelude, 4 loops of the core, coda: (keys, values) × d_model × fp32
    assert section["kv_bytes_per_token"] == (1 + 4 + 1) * 2 * 32 * 4
    assert "adaptive_by_criterion" not in run_heff(snap, data_dir, [1, 2],
                                                   tmp_path / "plain.json", max_tokens=300,
                                                   batch_rows=4)


def test_summary_table_and_plot(tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    with_section = tmp_path / "a.json"
    run_heff(snap, data_dir, [1, 2], with_section, max_tokens=300, batch_rows=4,
             adaptive=ExitSpec((0.0, 0.5), "entropy", 3))
    without = tmp_path / "b.json"
    doc = json.loads(with_section.read_text())
    doc.pop("adaptive_by_criterion")  # a sweep without adaptive exit
    doc["step"] = 3
    without.write_text(json.dumps(doc))
    rows = summarize_adaptive([without, with_section], tmp_path / "t.parquet",
                              tmp_path / "p.png", "demo")
    table = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert table == rows and len(rows) == 2
    assert [(r["step"], r["criterion"], r["max_loops"], r["threshold"]) for r in rows] == [
        (7, "entropy", 3, 0.0), (7, "entropy", 3, 0.5)]
    assert rows[0]["loss"] == rows[0]["fixed_loss"] and rows[0]["mean_loops"] == 3.0
    section = json.loads(with_section.read_text())["adaptive_by_criterion"]["entropy"]
    for row, point in zip(rows, section["points"], strict=True):
        for fill in ("latest", "skip"):
            spent = point["spent"][fill]
            assert (row[f"spent_{fill}_loops"], row[f"spent_{fill}_loss"],
                    row[f"spent_{fill}_stderr"]) == (spent["mean_loops"], spent["loss"],
                                                     spent["stderr"])
    old = {"step": 1, "adaptive_by_criterion": {"entropy": {**section, "points": [
        {k: v for k, v in p.items() if k != "spent"} for p in section["points"]]}}}
    assert adaptive_rows([old])[0]["spent_latest_loops"] is None  # written before the replay
    assert (tmp_path / "p.png").stat().st_size > 1000
    empty = summarize_adaptive([without], tmp_path / "e.parquet", tmp_path / "e.png")
    assert empty == [] and pq.read_table(tmp_path / "e.parquet").num_rows == 0
    assert (tmp_path / "e.png").is_file()


def test_summarize_cli_writes_the_adaptive_outputs(tiny_run, tmp_path: Path):
    import subprocess
    import sys

    data_dir, snap = tiny_run
    sweep = tmp_path / "s.json"
    run_heff(snap, data_dir, [1, 2], sweep, max_tokens=300, batch_rows=4,
             adaptive=ExitSpec((0.0, 0.01)))
    base = [sys.executable, "-m", "pipeline_lib", "summarize-heff", "--inputs", str(sweep),
            "--out-table", str(tmp_path / "h.parquet"), "--out-plot", str(tmp_path / "h.png"),
            "--no-track"]
    done = subprocess.run([*base, "--out-adaptive-table", str(tmp_path / "a.parquet"),
                           "--out-adaptive-plot", str(tmp_path / "a.png")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert pq.read_table(tmp_path / "a.parquet").column("threshold").to_pylist() == [0.0, 0.01]
    half = subprocess.run([*base, "--out-adaptive-table", str(tmp_path / "b.parquet")],
                          capture_output=True, text=True)
    assert half.returncode == 2 and "--out-adaptive-plot" in half.stderr
    assert half.stderr.strip().count("\n") == 0
