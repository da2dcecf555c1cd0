"""Activation checkpointing (``train.activation_checkpointing``): memory and time vs none.

    python benchmarks/bench_checkpointing.py [--loops 16 --objective deep --repeats 5 ...]

One training pass (forward over ``--loops`` loops, the objective, backward) of the same
model and batch with ``none``, ``loop`` and ``block``, side by side: the modes alternate
within every repeat, one torch thread (``--threads``), fp32 on the CPU.

- Time: median wall time of --repeats passes per mode (after one warm-up each), in turns
  (:func:`pipeline_lib.diagnostics.timing.alternated`).
- Peak activation memory: one extra pass per mode under ``torch.profiler`` with
  ``profile_memory=True``; the running sum of every CPU allocation and free the profiler
  records, from the start of the pass, and its maximum. The parameter gradients already
  exist (``zero_grad(set_to_none=False)``), so the peak is what the pass itself holds at
  once: the tensors saved for backward, the recomputed ones, and temporaries. That is the
  quantity checkpointing trades for time, and unlike a saved-tensor hook it also sees what
  the recomputation in backward holds (the profiler's own bookkeeping is not counted).
- Exactness: the gradients of every mode are compared with those of ``none`` (bit for bit).

``memory_ratio`` and ``time_ratio`` are mode / none; the last line is JSON. The default
model: d_model 128, 4 heads, one prelude, core and coda block, byte-level vocabulary, 16
loops with deep supervision (a readout after every loop), 8 rows of 256 tokens.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from pipeline_lib.diagnostics.timing import alternated
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig

MODES = ("none", "loop", "block")


def _batch(rows: int, seq_len: int, vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, seq_len + 1), generator=gen)
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:].clone()}


def _pass(model: LoopedLM, batch: dict, readouts: list[int]) -> None:
    model.zero_grad(set_to_none=False)  # gradients stay allocated: not part of the peak
    losses = model.losses(batch, readouts)
    (torch.stack([losses[h] for h in readouts]).mean() + model.take_aux_loss()).backward()


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def _peak_bytes(model: LoopedLM, batch: dict, readouts: list[int]) -> int:
    """Peak of the running sum of CPU allocations during one pass (see the docstring)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _pass(model, batch, readouts)
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = sorted((n for n in _walk(tree) if n.tag == _EventType.Allocation),
                    key=lambda n: n.start_time_ns)
    running = peak = 0
    for node in events:
        running += node.extra_fields.alloc_size
        peak = max(peak, running)
    return peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=16)
    p.add_argument("--objective", choices=["deep", "last"], default="deep",
                   help="deep: mean of the readouts after every loop; last: the last one")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=260)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--core-layers", type=int, default=1)
    p.add_argument("--moe-experts", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.n_heads,
                      prelude_layers=1, core_layers=args.core_layers, coda_layers=1,
                      loops=args.loops, moe_experts=args.moe_experts,
                      moe_top_k=min(2, args.moe_experts) or 1)
    torch.manual_seed(0)
    model = LoopedLM(cfg)
    batch = _batch(args.rows, args.seq_len, args.vocab)
    readouts = list(range(1, args.loops + 1)) if args.objective == "deep" else [args.loops]
    grads, peaks = {}, {}
    for mode in MODES:  # warm-up, gradients, memory
        model.activation_checkpointing = mode
        _pass(model, batch, readouts)
        grads[mode] = [q.grad.clone() for q in model.parameters()]
        peaks[mode] = _peak_bytes(model, batch, readouts)

    def in_mode(mode: str):
        def run() -> None:
            model.activation_checkpointing = mode
            _pass(model, batch, readouts)
        return run

    med = alternated({m: in_mode(m) for m in MODES}, args.repeats, warmup=False).median()
    result: dict = {"bench": "checkpointing", **{k: v for k, v in vars(args).items()}}
    for mode in MODES:
        result[mode] = {
            "peak_mb": round(peaks[mode] / 2**20, 2), "step_s": round(med[mode], 4),
            "memory_ratio": round(peaks[mode] / peaks["none"], 4),
            "time_ratio": round(med[mode] / med["none"], 4),
            "grads_bit_identical": all(torch.equal(a, b) for a, b in
                                       zip(grads["none"], grads[mode], strict=True))}
    for mode in MODES[1:]:
        r = result[mode]
        print(f"{mode:>5}: peak activation memory {r['peak_mb']} MB vs "
              f"{result['none']['peak_mb']} MB = {r['memory_ratio']:.3f} (target <= 0.3), "
              f"step {r['step_s']:.3f} s vs {result['none']['step_s']:.3f} s = "
              f"{r['time_ratio']:.3f} (target <= 1.4), gradients bit-identical: "
              f"{r['grads_bit_identical']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
