"""Grouped-query attention in SDPA: kv heads passed as they are (``enable_gqa``) vs repeated
per group (``repeat_interleave``), side by side.

    python benchmarks/bench_gqa.py [--heads 8 --kv-heads 2 --head-dim 64 --rows 4 --seq-len 512]

- prefill: q [B, H, L, hd] over k, v [B, KV, L, hd] with the dense block-diagonal causal mask
  of two documents per row (the CPU path of ``document_attention``), forward + backward;
- decode: one query per row over a cache of L keys, additive mask (``KVCache.attend``),
  forward only.

``time_ratio`` = enable_gqa / repeated (below 1: enable_gqa is faster). ``forward_equal``:
the two outputs are bit-equal; ``grad_max_diff``: the largest difference of the k/v
gradients (the repeated form sums the group's gradients in another order). Median of
--repeats alternating runs, one thread by default, fp32 on the CPU. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pipeline_lib.diagnostics.timing import alternated


def _median_ratio(a: Callable[[], object], b: Callable[[], object], repeats: int
                  ) -> tuple[float, float, float]:
    """(median seconds of a, of b, their ratio), runs alternating after one warm-up each."""
    median = alternated({"a": a, "b": b}, repeats).median()
    return median["a"], median["b"], median["a"] / median["b"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    B, H, KV, L, hd = args.rows, args.heads, args.kv_heads, args.seq_len, args.head_dim
    group = H // KV
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, hd, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, KV, L, hd, generator=gen, requires_grad=True) for _ in range(2))
    doc = (torch.arange(L) >= L // 3).long().expand(B, L)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    mask = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]  # [B, 1, L, L]

    def grouped() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def repeated() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                              v.repeat_interleave(group, 1), attn_mask=mask)

    def train(fn: Callable[[], torch.Tensor]) -> Callable[[], object]:
        return lambda: torch.autograd.grad(fn().square().sum(), (q, k, v))

    equal = torch.equal(grouped(), repeated())
    ga, gb = train(grouped)(), train(repeated)()
    grad_diff = max(float((x - y).abs().max()) for x, y in zip(ga, gb, strict=True))
    t_gqa, t_rep, prefill = _median_ratio(train(grouped), train(repeated), args.repeats)

    q1 = torch.randn(B, H, 1, hd, generator=gen)
    keys, values = (torch.randn(B, KV, L, hd, generator=gen) for _ in range(2))
    bias = torch.zeros(B, 1, 1, L)
    with torch.inference_mode():
        d_gqa, d_rep, decode = _median_ratio(
            lambda: F.scaled_dot_product_attention(q1, keys, values, attn_mask=bias,
                                                   enable_gqa=True),
            lambda: F.scaled_dot_product_attention(q1, keys.repeat_interleave(group, 1),
                                                   values.repeat_interleave(group, 1),
                                                   attn_mask=bias),
            args.repeats * 20)
    result = {"torch": torch.__version__, "shape": {"rows": B, "heads": H, "kv_heads": KV,
                                                     "seq_len": L, "head_dim": hd},
              "threads": args.threads, "forward_equal": equal, "grad_max_diff": grad_diff,
              "prefill_train": {"enable_gqa_s": t_gqa, "repeated_s": t_rep, "time_ratio": prefill},
              "decode": {"enable_gqa_s": d_gqa, "repeated_s": d_rep, "time_ratio": decode}}
    print(f"prefill fwd+bwd: enable_gqa / repeated = {prefill:.2f}; decode: {decode:.2f}; "
          f"forward bit-equal: {equal}; k/v grad max diff {grad_diff:.1e}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
