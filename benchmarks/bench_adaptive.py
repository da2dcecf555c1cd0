"""Adaptive-exit benchmark: the sweep over every threshold vs the fixed evaluation at max H.

The adaptive sweep runs loops 1..H once per batch and reads out after every loop (the exit
criterion needs each loop's next-token distribution) for the tokens that have not exited
yet; the fixed evaluation at the maximum H runs the same H loops and reads out once. Both
passes are timed with their per-document accumulation, neither with its bootstrap, on the
same validation batches of a freshly packed reasoning corpus, default model shape and
``eval.h_eff`` (H = its maximum), alternated over several repeats (best of each; ratios of
process CPU time, one thread, with the wall-time ratio beside them).

Two models, both timed:

- ``trained``: the default model after ``--train-steps`` AdamW steps of deep supervision on
  the corpus (seconds), with the default ``eval.adaptive_thresholds`` (KL criterion): the
  typical cost, where tokens exit as their predictions settle. The headline.
- ``worst``: weights drawn with init_std 0.2 (predictions keep moving) and thresholds
  (0, 1e-30): no token ever exits early (asserted), so every readout covers every token.
  The upper bound for any threshold list.

Also reported: each against the fixed sweep over all of ``eval.h_eff``.

Usage: ``python benchmarks/bench_adaptive.py [--repeats N] [--tokens N] [--train-steps N]``.
Last line: JSON with ``adaptive_time_ratio`` (trained, default thresholds / fixed at max H;
target ≤ 1.2) and ``worst_case_ratio``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # the sweeps' progress bars would swamp the output

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from pipeline_lib.config import DataConfig, SourceConfig, load_config  # noqa: E402
from pipeline_lib.data.loader import DataCursor, PackedData  # noqa: E402
from pipeline_lib.data.pack import pack_corpus  # noqa: E402
from pipeline_lib.evaluate.adaptive import (  # noqa: E402
    AdaptiveSpec,
    adaptive_documents,
    adaptive_section,
)
from pipeline_lib.evaluate.heff import sweep_losses  # noqa: E402
from pipeline_lib.model.looped import LoopedLM  # noqa: E402

WORST_THRESHOLDS = (0.0, 1e-30)


def train_briefly(model: LoopedLM, data: PackedData, steps: int, rows: int) -> float:
    """``steps`` AdamW steps, mean loss over loops 1..model.loops; returns the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cursor, loss = DataCursor(), torch.tensor(0.0)
    model.train()
    for _ in range(steps):
        (batch,), cursor = data.batches_for_step(cursor, rows, rows)
        losses = model.losses(batch, list(range(1, model.cfg.loops + 1)))
        loss = sum(losses.values()) / len(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss)


def time_alternated(runs: dict, repeats: int) -> tuple[dict, dict, dict]:
    """Best process CPU time and best wall time of each run over ``repeats`` alternated
    rounds, and its last result. One thread: CPU time is what the run itself cost, much
    less disturbed than wall time by other work on a shared machine."""
    out = {name: fn() for name, fn in runs.items()}  # warm-up
    cpu = dict.fromkeys(runs, float("inf"))
    wall = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, fn in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            out[name] = fn()
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
            wall[name] = min(wall[name], time.perf_counter() - start)
    return cpu, wall, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--train-steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config()
    h_effs = sorted(cfg.eval.h_eff)
    max_h = h_effs[-1]
    with tempfile.TemporaryDirectory() as tmp:
        data_cfg = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=4000)],
                              seq_len=cfg.data.seq_len, epochs=1, val_fraction=0.2)
        meta = pack_corpus(data_cfg, Path(tmp) / "data")
        data = PackedData(Path(tmp) / "data")
        batches = list(data.val_batches(data.val_rows, cfg.eval.batch_rows))
        base_cfg = dataclasses.replace(cfg.model, vocab_size=meta["vocab_size"])
        torch.manual_seed(0)
        trained = LoopedLM(base_cfg)
        train_loss = train_briefly(trained, data, args.train_steps, cfg.train.micro_batch_rows)
    torch.manual_seed(0)
    moving = LoopedLM(dataclasses.replace(base_cfg, init_std=0.2))
    default = AdaptiveSpec(tuple(cfg.eval.adaptive_thresholds), "kl", max_h).resolved(h_effs)
    worst = AdaptiveSpec(WORST_THRESHOLDS, "kl", max_h).resolved(h_effs)
    cases = {"trained": (trained.eval(), default), "worst": (moving.eval(), worst)}
    result: dict = {"max_h": max_h, "h_eff": h_effs, "tokens": args.tokens,
                    "train_steps": args.train_steps, "train_loss": round(train_loss, 3)}
    for case, (model, spec) in cases.items():
        best, wall, out = time_alternated({
            "fixed_max_h": lambda m=model: sweep_losses(m, batches, [max_h], args.tokens),
            "adaptive": lambda m=model, s=spec: adaptive_documents(m, batches, s, args.tokens),
            "fixed_sweep": lambda m=model: sweep_losses(m, batches, h_effs, args.tokens),
        }, args.repeats)
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
    result["adaptive_time_ratio"] = result["trained"]["vs_fixed_max_h"]
    result["worst_case_ratio"] = result["worst"]["vs_fixed_max_h"]
    result["model"] = {k: getattr(base_cfg, k) for k in ("d_model", "prelude_layers",
                                                          "core_layers", "coda_layers",
                                                          "loops", "vocab_size")}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
