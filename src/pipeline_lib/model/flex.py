"""FlexAttention over packed rows: the document block mask, shapes that do not recompile, and
the once-per-process choice between FlexAttention and SDPA.

- :func:`document_block_mask` builds the BlockMask on the device of ``doc_ids`` at block
  granularity ([B, n, n] booleans, n = L/128) from the first and last document id of each
  128-token block. Doc ids never decrease along a row (piece index; padding one past the
  last), so a key block before a query block shares a document with it iff its last id equals
  the query block's first id, and is full iff both blocks lie in that one document.
  ``create_block_mask`` would materialise [B, L, L] through int64 gathers (4 GiB at B 8,
  L 8192); it is used only for rows whose ids decrease (then it is needed for correctness).
- Shapes: rows are padded to a multiple of 128 tokens, at least 256 (padding is its own
  document, its outputs dropped), and the length dimensions are marked dynamic; the batch
  dimension is dynamic on CUDA too, static elsewhere (torch 2.13's CPU code generation fails
  on a dynamic batch inside the mask). The probe below compiles the first two graphs
  (the first compile specialises every size, the second generalises the lengths), so later
  calls of any length reuse them; a new batch size on the CPU, a batch of one, a new dtype,
  head width or grad mode compiles once more.
- The choice: the first flex call of a process runs a probe at that call's device, dtype,
  query and key/value heads, head width and batch size (forward, and backward when the call
  needs gradients: FlexAttention has no CPU backward) against SDPA. A failure makes the
  process use SDPA from then on: one warning, and :func:`attention_tags` reports it for the
  stage's MLflow run (``loopline.attention_fallback``). Nothing switches kernels after that: a later flex
  failure is a DeviceError naming the fix (``model.attention: sdpa``). Under
  ``train.compile`` FlexAttention is traced into the model's graph instead (no probe: that
  compile owns shapes and failures).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import DeviceError

log = logging.getLogger(__name__)

FLEX_BLOCK = 128  # tokens per FlexAttention block (its default sparse block size)
MIN_BLOCKS = 2  # a one-block mask would compile a graph of its own
PROBE_LENGTHS = (2 * FLEX_BLOCK, 3 * FLEX_BLOCK)  # two lengths: the second graph is dynamic
# flex vs SDPA in the probe, relative to the reference's largest value (gradients of a
# random objective reach ~10, where one bf16 step is ~0.06); 3e-2 for 16-bit dtypes
_TOLERANCE = {torch.float32: 1e-4}
# Graphs of the compiled kernel one process may hold: one per grad mode, dtype, head width and
# batch kind (a stage's training and validation, the device check's workloads). Past dynamo's
# default of 8, torch runs flex uncompiled (the whole score matrix, silently slow and no
# longer the kernel the probe passed), as a first run on an H200 showed.
FLEX_GRAPHS = 64
FIX = "set model.attention: sdpa"


@dataclass
class _Decision:
    kernel: str | None = None  # None until a flex call or a failure decides: "flex" | "sdpa"
    reason: str = ""  # why SDPA although flex was asked for
    backward_ok: bool = False  # the probe ran a backward pass too
    compiled: Any = None  # torch.compile(flex_attention)


_decision = _Decision()


def reset_flex_decision() -> None:
    """Forget this process's decision (tests: a process makes it once)."""
    global _decision
    _decision = _Decision()


def decided_kernel() -> str | None:
    """``flex`` or ``sdpa`` once decided in this process, else None."""
    return _decision.kernel


def attention_tags() -> dict[str, str]:
    """MLflow tags of the decision (none while flex was never asked for)."""
    if _decision.kernel is None:
        return {}
    tags = {"loopline.attention_kernel": _decision.kernel}
    if _decision.reason:
        tags["loopline.attention_fallback"] = _decision.reason[:500]
    return tags


def flex_unavailable(reason: str) -> None:
    """Decide SDPA for the process (a warning, once); DeviceError if flex was chosen already."""
    if _decision.kernel == "flex":
        raise DeviceError(f"FlexAttention failed after this process chose it ({reason}); {FIX}")
    if _decision.kernel is None:
        log.warning("FlexAttention unavailable (%s): this process uses SDPA with a dense mask",
                    reason)
        _decision.kernel, _decision.reason = "sdpa", reason


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


# --------------------------------------------------------------------------- the mask


def padded_length(length: int) -> int:
    """Tokens per row FlexAttention sees: a multiple of FLEX_BLOCK, at least MIN_BLOCKS."""
    return max(MIN_BLOCKS, math.ceil(length / FLEX_BLOCK)) * FLEX_BLOCK


def pad_doc_ids(doc_ids: Tensor, length: int) -> Tensor:
    """[B, L] → [B, length]: the padding is one more document (ids stay non-decreasing)."""
    extra = length - doc_ids.shape[1]
    if extra == 0:
        return doc_ids
    return torch.cat([doc_ids, (doc_ids[:, -1:] + 1).expand(-1, extra)], dim=1)


def _document_causal(doc_ids: Tensor) -> Callable[..., Tensor]:
    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (doc_ids[b, q] == doc_ids[b, kv]) & (kv <= q)

    return mask_mod


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """[B, 1, n, n] bool → (blocks per row, their indices first), as FlexAttention wants."""
    dense = dense.to(torch.int32)
    indices = torch.argsort(dense, dim=-1, descending=True, stable=True)
    return dense.sum(dim=-1).to(torch.int32), indices.to(torch.int32)


def document_block_mask(doc_ids: Tensor) -> Any:
    """BlockMask of document-causal attention for ``doc_ids`` [B, L] (L a multiple of
    FLEX_BLOCK), built on ``doc_ids``' device."""
    # lazy: a torch without FlexAttention still runs SDPA (attention's probe decides)
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    B, L = doc_ids.shape
    assert L % FLEX_BLOCK == 0, "pad the row with pad_doc_ids first"
    _mark(doc_ids, doc_ids.device.type == "cuda", range(1, 2))  # the mask_mod reads it
    mask_mod = _document_causal(doc_ids)
    if bool((doc_ids[:, 1:] < doc_ids[:, :-1]).any()):  # not packed rows: the general path
        return create_block_mask(mask_mod, B, None, L, L, device=doc_ids.device)
    n = L // FLEX_BLOCK
    blocks = doc_ids.view(B, n, FLEX_BLOCK)
    first, last = blocks[..., 0], blocks[..., -1]  # [B, n]
    idx = torch.arange(n, device=doc_ids.device)
    before = idx[None, :] < idx[:, None]  # [n(q), n(kv)]: kv block strictly before q block
    shared = before & (last[:, None, :] == first[:, :, None])  # [B, n, n]
    single = first == last  # [B, n]: the block lies in one document
    full = shared & single[:, :, None] & single[:, None, :]
    partial = (shared | (idx[None, :] == idx[:, None])) & ~full
    kv_num, kv_idx = _ordered(partial[:, None])
    full_num, full_idx = _ordered(full[:, None])
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(L, L))


# --------------------------------------------------------------------------- the kernel


def _compiled() -> Any:
    if _decision.compiled is None:
        # lazy: a torch without FlexAttention still runs SDPA (attention's probe decides)
        from torch.nn.attention.flex_attention import flex_attention

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, FLEX_GRAPHS)
        _decision.compiled = torch.compile(flex_attention)
    return _decision.compiled


def _mark(tensor: Tensor, batch_dynamic: bool, dims: range) -> None:
    """Mark the length/block dims dynamic and the batch dim static or dynamic."""
    if torch.compiler.is_compiling():  # inside train.compile: its graph owns the shapes
        return
    import torch._dynamo as dynamo  # torch._dynamo (~1.2 s): only runs that mark shapes pay it

    if batch_dynamic:
        dynamo.maybe_mark_dynamic(tensor, 0)
    else:
        dynamo.mark_static(tensor, 0)
    for dim in dims:
        dynamo.maybe_mark_dynamic(tensor, dim)


def _padded(fn: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor, block_mask: Any,
            length: int) -> Tensor:
    """``fn`` (FlexAttention) on q [B, H, L, hd] and k, v [B, KV, L, hd] (KV divides H)
    padded to ``length`` → [B, H, L, hd]."""
    L = q.shape[2]
    if length != L:
        q, k, v = (F.pad(t, (0, 0, 0, length - L)) for t in (q, k, v))
    out = fn(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
    return out[:, :, :L] if length != L else out


def flex_in_graph(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, length: int) -> Tensor:
    """FlexAttention traced into an enclosing ``torch.compile`` (``train.compile``): that
    compile owns shapes and failures, so no probe and no marks here."""
    # lazy: a torch without FlexAttention still runs SDPA (attention's probe decides)
    from torch.nn.attention.flex_attention import flex_attention

    return _padded(flex_attention, q, k, v, block_mask, length)


def _marked_compiled(q: Tensor, k: Tensor, v: Tensor, *, block_mask: Any,
                     enable_gqa: bool) -> Tensor:
    """The compiled kernel, length (on CUDA also batch) dimensions of its inputs marked."""
    batch_dynamic = q.device.type == "cuda"
    for t in (q, k, v):
        _mark(t, batch_dynamic, range(2, 3))
    for t in (block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
              block_mask.full_kv_indices, block_mask.q_num_blocks, block_mask.q_indices,
              block_mask.full_q_num_blocks, block_mask.full_q_indices):
        if t is not None:
            _mark(t, batch_dynamic, range(2, t.dim()))
    return _compiled()(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def _call(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, length: int) -> Tensor:
    return _padded(_marked_compiled, q, k, v, block_mask, length)


def run_flex(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, length: int) -> Tensor:
    """FlexAttention after the process chose it; a failure is a DeviceError, not a switch."""
    try:
        return _call(q, k, v, block_mask, length)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise DeviceError(f"FlexAttention failed after this process chose it "
                          f"({_first_line(exc)}); {FIX}") from exc


# --------------------------------------------------------------------------- the decision


def _probe_once(like: Tensor, kv_heads: int, batch: int, length: int, backward: bool) -> None:
    """Flex vs SDPA on two documents per row; raises on a failure or a mismatch."""
    H, hd, device, dtype = like.shape[1], like.shape[3], like.device, like.dtype
    doc = torch.zeros(batch, length, dtype=torch.long)
    doc[:, length // 3:] = 1
    doc = doc.to(device)
    gen = torch.Generator().manual_seed(0)  # never the global stream: probing changes no run
    q, k, v = (torch.randn(batch, heads, length, hd, generator=gen).to(device, dtype)
               .requires_grad_(backward) for heads in (H, kv_heads, kv_heads))
    out = _call(q, k, v, document_block_mask(doc), length)
    dense = (doc[:, :, None] == doc[:, None, :]) & torch.ones(
        length, length, dtype=torch.bool, device=device).tril()  # attention.dense_document_mask
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense[:, None],
                                         enable_gqa=kv_heads != H)
    pairs = [(out, ref)]
    if backward:
        w = torch.randn(out.shape, generator=gen).to(device, dtype)
        pairs += zip(torch.autograd.grad((out * w).sum(), (q, k, v)),
                     torch.autograd.grad((ref * w).sum(), (q, k, v)), strict=True)
    tol = _TOLERANCE.get(dtype, 3e-2)
    diff = max(_relative_diff(a.detach().float(), b.detach().float()) for a, b in pairs)
    if not diff <= tol:
        raise RuntimeError(f"flex differs from SDPA by {diff:.2e} of the largest reference "
                           f"value (tolerance {tol:.0e})")


def _relative_diff(a: Tensor, b: Tensor) -> float:
    """``max |a − b|`` over ``max(max |b|, 1)``: absolute for small values, relative for the
    large gradients where a 16-bit dtype's steps are coarse."""
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1.0)


def _probe(like: Tensor, kv_heads: int, backward: bool) -> str | None:
    """None when FlexAttention works like SDPA at ``like``'s shape (queries) and ``kv_heads``
    key/value heads, else why not."""
    if like.device.type == "cuda":  # two batch sizes too: the second graph covers any ≥ 2
        shapes = list(zip((2, 3), PROBE_LENGTHS, strict=True))
    else:
        shapes = [(like.shape[0], length) for length in PROBE_LENGTHS]
    try:
        for batch, length in shapes:
            _probe_once(like, kv_heads, batch, length, backward)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        return _first_line(exc)
    return None


def use_flex(q: Tensor, kv_heads: int) -> bool:
    """Whether this attention call (queries ``q``, ``kv_heads`` key/value heads) runs
    FlexAttention; the first call decides for the process."""
    backward = torch.is_grad_enabled() and q.requires_grad
    if _decision.kernel is None:
        failure = _probe(q, kv_heads, backward)
        if failure is not None:
            flex_unavailable(f"probe on {q.device.type}/{str(q.dtype).removeprefix('torch.')}:"
                             f" {failure}")
            return False
        _decision.kernel, _decision.backward_ok = "flex", backward
        log.info("FlexAttention chosen on %s (probe passed%s)", q.device.type,
                 ", backward included" if backward else ", forward only")
    if _decision.kernel != "flex":
        return False
    if backward and not _decision.backward_ok:
        failure = _probe(q, kv_heads, True)
        if failure is not None:
            raise DeviceError("FlexAttention was chosen in this process without gradients and "
                              f"its backward fails here ({failure}); {FIX}")
        _decision.backward_ok = True
    return True
