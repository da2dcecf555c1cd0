"""Diagnostics outside the pipeline: the timing harness the device check and ``benchmarks/``
share (:mod:`.timing`), and one command that checks the accelerator paths on the configured
device:
``python -m pipeline_lib device-check [--quick] [--out F] [key=value …]``
(``benchmarks/device_check.py`` runs the same). Run it once on a new GPU/NPU node.

Every check runs on ``experiment.device`` in ``experiment.precision`` on inputs it makes
itself, and reports pass, fail or skip (with the reason) and figures; parts of a check that
cannot run here are listed under ``skipped`` with their reasons:

- ``train_steps``: 4 optimizer steps of a tiny looped MoE model through the real segment job.
- ``snapshot_resume``: the same 4 steps as 2 + 2 segments against one segment
  (``train.deterministic``): bit-identical on the CPU; elsewhere the largest differences.
- ``fsdp_segment``: the 4 steps sharded with FSDP2 in a one-rank process group (gloo on the
  CPU, nccl on CUDA): a sharded snapshot, compared with the unsharded run.
- ``cross_entropy``: the Triton chunk kernel, torch's chunked loss and eager cross-entropy:
  equal values and gradients, ms and (CUDA) peak memory; Triton interpreted on the CPU.
- ``flex_attention``: compiled FlexAttention against SDPA with the document mask (a tiny
  model at four lengths: no recompiles; the kernel alone at a training shape: ms each).
- ``moe_grouped_mm``: grouped GEMM against the per-expert loop; an unaligned width falls back.
- ``train_throughput``: tokens/s of the ~125M-parameter looped model at 4 loops (d_model 768,
  rows of 1024 tokens on a GPU; a small model on the CPU) and model FLOP utilisation against
  the device's bf16 peak (:mod:`.peaks`).
- ``heff_sweep``: the eval_heff stage's sweep of that model's snapshot on the device, tokens/s,
  and off the CPU the ratio to the CPU's sweep of the same snapshot.
- ``lm_eval``: the built-in lm-eval tasks through the bench stage's function: examples/s.
- ``generation``: greedy samples through the trainer's path against a full-recompute reference.
- ``kv_cache``: KV-cached against uncached generation: exact in fp32, speed-up per batch.

Workloads are sized per device (:class:`~.core.Sizes`): a GPU run fits in 8 minutes on an
H100/H200 (a check that would start after ``--budget-s`` is skipped). Timings are wall-clock
medians on whatever else the machine runs: indicative. A check that raises is reported as
failed with its error line, and the others still run.
"""

# torch-free, so that building the CLI's parser imports no torch; :mod:`.runner` maps each
# name to its function, in this order
CHECKS = ("train_steps", "snapshot_resume", "fsdp_segment", "cross_entropy", "flex_attention",
          "moe_grouped_mm", "train_throughput", "heff_sweep", "lm_eval", "generation", "kv_cache")
BUDGET_S = 480.0  # the whole check fits in 8 minutes on an H100/H200-class GPU
