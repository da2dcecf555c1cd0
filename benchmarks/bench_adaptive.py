"""Adaptive-exit benchmark: the adaptive sweep's cost against the fixed evaluation, and the
whole sweep of every criterion as one pass against one pass per criterion.

The adaptive sweep runs loops 1..H once per batch and reads out after every loop (the exit
criterion needs each loop's next-token distribution) for the tokens that have not exited
yet; the fixed evaluation at the maximum H runs the same H loops and reads out once. Every
pass is timed with its per-document accumulation, none with its bootstrap, on the same
validation batches of a freshly packed reasoning corpus, default model shape and
``eval.h_eff`` (H = its maximum), alternated over several rounds by
:func:`pipeline_lib.diagnostics.timing.alternated` (best of each; ratios of process CPU
time at OMP_NUM_THREADS threads, default 1, with the wall-time ratio beside them).

Three models, all timed:

- ``trained``: the default model after ``--train-steps`` AdamW steps of deep supervision on
  the corpus (seconds), with the default ``eval.adaptive.thresholds`` (KL criterion): the
  typical cost, where tokens exit as their predictions settle. The headline.
- ``worst``: weights drawn with init_std 0.2 (predictions keep moving) and thresholds
  (0, 1e-30): no token ever exits early (asserted), so every readout covers every token.
  The upper bound for any threshold list.
- ``criteria``: the default model with the learned exit gate after ``--train-steps`` steps
  of the expected-exit objective (``config/experiments/exit_gate.yaml``), all six criteria
  with their default thresholds: the whole sweep (fixed H_eff losses and every criterion)
  as ONE pass per batch against the fixed sweep plus one pass per criterion (what
  ``eval_heff`` ran before), with each round's ratio (the spread says how noisy the
  machine was). Both give the same numbers bit for bit (asserted).

Also reported: the first two against the fixed sweep over all of ``eval.h_eff``.

Usage: ``python benchmarks/bench_adaptive.py [--repeats N] [--tokens N] [--train-steps N]``.
Last line: JSON with ``adaptive_time_ratio`` (trained, default thresholds / fixed at max H;
target ≤ 1.2), ``worst_case_ratio`` and ``criteria_one_pass_ratio`` (one pass / a pass per
criterion, best CPU times; ``criteria.round_ratios`` per round).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # the sweeps' progress bars would swamp the output

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from pipeline_lib.data.loader import DataCursor, PackedData  # noqa: E402
from pipeline_lib.data.pack import pack_corpus  # noqa: E402
from pipeline_lib.diagnostics.timing import alternated  # noqa: E402
from pipeline_lib.evaluate.exit.results import adaptive_section  # noqa: E402
from pipeline_lib.evaluate.exit.spec import ExitSpec  # noqa: E402
from pipeline_lib.evaluate.heff import sweep_losses  # noqa: E402
from pipeline_lib.evaluate.sweep_pass import sweep_pass  # noqa: E402
from pipeline_lib.model.looped import LoopedLM  # noqa: E402
from pipeline_lib.spec.config import DataConfig, EvalConfig, SourceConfig
from pipeline_lib.spec.config_load import load_config  # noqa: E402
from pipeline_lib.spec.rules import EXIT_CRITERIA  # noqa: E402

WORST_THRESHOLDS = (0.0, 1e-30)


def train_briefly(model: LoopedLM, data: PackedData, steps: int, rows: int,
                  exit_entropy_weight: float | None = None) -> float:
    """``steps`` AdamW steps over loops 1..model.loops: the mean loss (deep supervision), or
    with ``exit_entropy_weight`` the expected-exit objective (trains the exit gate);
    returns the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cursor, loss = DataCursor(), torch.tensor(0.0)
    readouts = list(range(1, model.cfg.loops + 1))
    model.train()
    for _ in range(steps):
        (batch,), cursor = data.batches_for_step(cursor, rows, rows)
        if exit_entropy_weight is None:
            losses = model.losses(batch, readouts)
            loss = sum(losses.values()) / len(losses)
        else:
            loss = model(batch, readouts, exit_entropy_weight=exit_entropy_weight).objective
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def exit_cases(cfg, data: PackedData, h_effs: list[int], args) -> dict:
    """The trained and worst-case KL sweeps against the fixed evaluation."""
    max_h = h_effs[-1]
    batches = list(data.val_batches(data.val_rows, cfg.eval.batch_rows))
    torch.manual_seed(0)
    trained = LoopedLM(cfg.model)
    train_loss = train_briefly(trained, data, args.train_steps, cfg.train.micro_batch_rows)
    torch.manual_seed(0)
    moving = LoopedLM(dataclasses.replace(cfg.model, init_std=0.2))
    default = ExitSpec(tuple(cfg.eval.adaptive.thresholds), "kl", max_h).resolved(h_effs)
    worst = ExitSpec(WORST_THRESHOLDS, "kl", max_h).resolved(h_effs)
    result: dict = {"train_loss": round(train_loss, 3)}
    for case, (model, spec) in {"trained": (trained.eval(), default),
                                "worst": (moving.eval(), worst)}.items():
        timed = alternated({
            "fixed_max_h": lambda m=model: sweep_losses(m, batches, [max_h], args.tokens),
            "adaptive": lambda m=model, s=spec: sweep_pass(m, batches, [], [s],
                                                           args.tokens).adaptive[0],
            "fixed_sweep": lambda m=model: sweep_losses(m, batches, h_effs, args.tokens),
        }, args.repeats)
        # CPU time: what each run itself cost, much less disturbed than wall time by other
        # work on a shared machine
        best, wall, out = timed.best("cpu"), timed.best(), timed.last
        points = adaptive_section(out["adaptive"])["points"]
        assert points[0]["loss"] == out["fixed_max_h"][0][max_h], \
            "threshold 0 must equal the fixed loss at max H"
        result[case] = {
            "vs_fixed_max_h": round(best["adaptive"] / best["fixed_max_h"], 3),
            "vs_fixed_sweep": round(best["adaptive"] / best["fixed_sweep"], 3),
            "vs_fixed_max_h_wall": round(wall["adaptive"] / wall["fixed_max_h"], 3),
            "cpu_seconds": {k: round(v, 3) for k, v in best.items()},
            "thresholds": list(spec.thresholds),
            "mean_loops": [round(p["mean_loops"], 2) for p in points],
        }
        print(f"{case}: adaptive sweep {best['adaptive']:.3f} s vs fixed at H={max_h} "
              f"{best['fixed_max_h']:.3f} s (CPU), mean loops {result[case]['mean_loops']}")
    assert result["worst"]["mean_loops"][1] == max_h, "the worst case must never exit early"
    return result


def criteria_case(cfg, data: PackedData, h_effs: list[int], args) -> dict:
    """Every criterion and the fixed sweep as one pass vs the fixed sweep + one pass each."""
    batches = list(data.val_batches(data.val_rows, cfg.eval.batch_rows))
    torch.manual_seed(0)
    model = LoopedLM(dataclasses.replace(cfg.model, exit_gate=True))
    train_loss = train_briefly(model, data, args.train_steps, cfg.train.micro_batch_rows,
                               exit_entropy_weight=0.01)
    model.eval()
    every = [spec.resolved(h_effs) for spec in ExitSpec.from_config(
        dataclasses.replace(EvalConfig().adaptive, criteria=list(EXIT_CRITERIA)))]
    timed = alternated({
        "one_pass": lambda: sweep_pass(model, batches, h_effs, every, args.tokens),
        "per_criterion": lambda: [sweep_pass(model, batches, h_effs, (), args.tokens)] + [
            sweep_pass(model, batches, (), [spec], args.tokens) for spec in every],
    }, args.repeats)
    best, wall, out, rounds = timed.best("cpu"), timed.best(), timed.last, timed.rounds("cpu")
    one, apart = out["one_pass"], out["per_criterion"]
    assert (one.fixed.loss_sums == apart[0].fixed.loss_sums).all()
    for together, alone in zip(one.adaptive, (p.adaptive[0] for p in apart[1:]), strict=True):
        assert (together.documents.loss_sums == alone.documents.loss_sums).all()
        assert together.loops_used == alone.loops_used, together.spec.criterion
    ratios = sorted(r["one_pass"] / r["per_criterion"] for r in rounds)
    result = {
        "one_pass_vs_per_criterion": round(best["one_pass"] / best["per_criterion"], 3),
        "wall_ratio": round(wall["one_pass"] / wall["per_criterion"], 3),
        "round_ratios": [round(x, 3) for x in ratios],
        "cpu_seconds": {k: round(v, 3) for k, v in best.items()},
        "train_loss": round(train_loss, 3),
        "mean_loops": {a.spec.criterion: [round(p["mean_loops"], 2) for p in
                                          adaptive_section(a)["points"]] for a in one.adaptive},
    }
    print(f"criteria: one pass {best['one_pass']:.3f} s vs a pass per criterion "
          f"{best['per_criterion']:.3f} s (CPU, {len(every)} criteria + the fixed sweep); "
          f"ratio per round {result['round_ratios']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--cases", default="exit,criteria",
                        help="comma-separated: exit (trained + worst), criteria")
    args = parser.parse_args()
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    cfg = load_config()
    h_effs = sorted(cfg.eval.h_eff)
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        data_cfg = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=4000)],
                              seq_len=cfg.data.seq_len, epochs=1, val_fraction=0.2)
        meta = pack_corpus(data_cfg, Path(tmp) / "data")
        data = PackedData(Path(tmp) / "data")
        cfg.model = dataclasses.replace(cfg.model, vocab_size=meta["vocab_size"])
        result: dict = {"max_h": h_effs[-1], "h_eff": h_effs, "tokens": args.tokens,
                        "train_steps": args.train_steps, "threads": threads}
        if "exit" in cases:
            result.update(exit_cases(cfg, data, h_effs, args))
            result["adaptive_time_ratio"] = result["trained"]["vs_fixed_max_h"]
            result["worst_case_ratio"] = result["worst"]["vs_fixed_max_h"]
        if "criteria" in cases:
            result["criteria"] = criteria_case(cfg, data, h_effs, args)
            result["criteria_one_pass_ratio"] = result["criteria"]["one_pass_vs_per_criterion"]
    result["model"] = {k: getattr(cfg.model, k) for k in (
        "d_model", "prelude_layers", "core_layers", "coda_layers", "loops", "vocab_size")}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
