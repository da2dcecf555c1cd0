"""One pass with readouts at several loop counts vs separate passes, side by side.

    python benchmarks/bench_readout.py [--loops 1 2 4 8 --coda-layers 1 --vocab 260 ...]

- one_pass: ``model.losses(batch, loops=[1, 2, 4, 8])`` (one forward, four readouts);
- separate: ``model.losses(batch, [h])`` for each h (four forwards: 1 + 2 + 4 + 8 loops);
- single:   ``model.losses(batch, [8])`` (one forward, one readout at the deepest count).

``time_ratio`` = one_pass / separate, ``overhead_vs_single`` = one_pass / single. Measured
for training (forward + backward of the summed losses, as deep supervision does) and for
evaluation (forward under no_grad, as the H_eff sweep does); the top-level numbers are the
training ones, ``eval`` holds the others. Median of --repeats alternating runs, one thread by
default, fp32 on the CPU. The model defaults to the project's default architecture
(d_model 128, 4 heads, 1 prelude / 1 core / 1 coda block) with a byte-level vocabulary.
A readout costs the coda blocks plus the (chunked) loss, so the overhead grows with
--coda-layers and --vocab and shrinks with --core-layers. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from pipeline_lib.diagnostics.timing import alternated
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig


def _batch(rows: int, seq_len: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows packed with random-length documents, like the data loader's batches."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq_len + 1), generator=gen)
    doc_ids = torch.zeros(rows, seq_len, dtype=torch.long)
    pos = torch.zeros(rows, seq_len, dtype=torch.long)
    targets = ids[:, 1:].clone()
    for r in range(rows):
        start, d = 0, 0
        while start < seq_len:
            n = int(torch.randint(8, seq_len // 2 + 1, (1,), generator=gen))
            end = min(start + n, seq_len)
            doc_ids[r, start:end] = d
            pos[r, start:end] = torch.arange(end - start)
            targets[r, end - 1] = -100  # no target across a document boundary
            start, d = end, d + 1
    return {"input_ids": ids[:, :-1], "targets": targets, "position_ids": pos, "doc_ids": doc_ids}


def _runner(model: LoopedLM, batch, loop_sets: list[list[int]], train: bool) -> Callable[[], None]:
    def run() -> None:
        for loops in loop_sets:
            if train:
                model.zero_grad(set_to_none=True)
                losses = model.losses(batch, loops)
                torch.stack(list(losses.values())).sum().backward()
            else:
                with torch.no_grad():
                    model.losses(batch, loops)

    return run


def _measure(model: LoopedLM, batch, loops: list[int], train: bool, repeats: int) -> dict:
    runners = {
        "one_pass": _runner(model, batch, [loops], train),
        "separate": _runner(model, batch, [[h] for h in loops], train),
        "single": _runner(model, batch, [[max(loops)]], train),
    }
    t = alternated(runners, repeats).median()
    return {
        "one_pass_s": round(t["one_pass"], 4), "separate_s": round(t["separate"], 4),
        "single_s": round(t["single"], 4),
        "time_ratio": round(t["one_pass"] / t["separate"], 4),
        "overhead_vs_single": round(t["one_pass"] / t["single"], 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--rows", type=int, default=8, help="batch rows")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row")
    p.add_argument("--vocab", type=int, default=260, help="vocabulary size")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--prelude-layers", type=int, default=1)
    p.add_argument("--core-layers", type=int, default=1)
    p.add_argument("--coda-layers", type=int, default=1)
    p.add_argument("--moe-experts", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=1024, help="chunked-loss rows per chunk")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.n_heads,
                      prelude_layers=args.prelude_layers, core_layers=args.core_layers,
                      coda_layers=args.coda_layers, loops=max(args.loops),
                      moe_experts=args.moe_experts, loss_chunk_size=args.chunk_size)
    model = LoopedLM(cfg)
    batch = _batch(args.rows, args.seq_len, args.vocab)
    with torch.no_grad():  # the one-pass losses are the separate ones, exactly
        together = model.losses(batch, args.loops)
        max_diff = max(abs(together[h].item() - model.losses(batch, [h])[h].item())
                       for h in args.loops)
    train = _measure(model, batch, args.loops, train=True, repeats=args.repeats)
    evaluation = _measure(model, batch, args.loops, train=False, repeats=args.repeats)
    result = {
        "bench": "readout", "loops": args.loops, "rows": args.rows, "seq_len": args.seq_len,
        "vocab": args.vocab, "d_model": args.d_model, "prelude_layers": args.prelude_layers,
        "core_layers": args.core_layers, "coda_layers": args.coda_layers,
        "moe_experts": args.moe_experts, "threads": args.threads,
        "max_loss_diff_one_pass_vs_separate": max_diff,
        **train, "eval": evaluation,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
