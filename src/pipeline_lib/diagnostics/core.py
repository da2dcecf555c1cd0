"""What every device check shares: the result row, the context (device, precision, work
directory, packs built once), the workload sizes per device, comparison helpers (timing:
:mod:`.timing`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data.pack import pack_corpus
from ..precision import Precision
from ..spec.config import Config, DataConfig, SourceConfig
from ..spec.config_load import load_config

TINY = ["model.d_model=64", "model.n_heads=4", "model.loops=2", "model.prelude_layers=1",
        "model.core_layers=1", "model.coda_layers=0", "model.moe_experts=4", "model.moe_top_k=2",
        "model.loss_chunk_size=256", "train.total_steps=4", "train.steps_per_segment=4",
        "train.global_batch_rows=8", "train.micro_batch_rows=4", "train.warmup_steps=1",
        "train.eval_interval=0", "train.eval_rows=4", "train.diagnostics_interval=0",
        "train.sample_tokens=8", "train.objective=deep_supervision", "train.spike.warmup_steps=4",
        "train.deterministic=true", "train.nproc=1", "train.nnodes=1", "tracking.enabled=false"]
DATA = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=300, max_difficulty=3, seed=1)],
                  seq_len=128, epochs=1, val_fraction=0.1, seed=3)
STEPS = 4  # optimizer steps of the tiny runs (train_steps, snapshot_resume, fsdp_segment)


@dataclass
class CheckResult:
    """One row of the report; ``skipped`` names the parts of a check that did not run, and why."""

    name: str
    status: str  # pass | fail | skip
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sizes:
    """Workload sizes: for an H100/H200-class GPU, for a CPU, or ``--quick`` (tests)."""

    ce_tokens: int  # cross_entropy: rows of hidden
    ce_dim: int
    ce_vocabs: tuple[int, ...]
    attn: tuple[int, int, int, int]  # flex vs SDPA timing: batch, heads, tokens, head width
    model: tuple[str, ...]  # overrides of the ~125M looped model (train_throughput …)
    seq_len: int
    rows: int  # global batch rows per step
    micro_rows: int
    steps: int
    pack_docs: int  # reasoning documents of the throughput pack (plus stdlib sources)
    stdlib_docs: int
    heff_tokens: int  # H_eff sweep on the device (and on the CPU for the ratio off the CPU)
    heff_cpu_tokens: int
    bench: tuple[int, int, tuple[int, ...], int]  # examples/level, max level, H_eff, gen tokens
    kv_batches: tuple[int, ...]
    kv_new_tokens: int
    repeats: int

    @classmethod
    def for_device(cls, device: torch.device, quick: bool) -> Sizes:
        if quick:
            return QUICK
        return GPU if device.type != "cpu" else CPU


_MODEL = ("model.n_heads=4", "model.prelude_layers=1", "model.core_layers=1",
          "model.coda_layers=1", "model.loops=4", "model.moe_experts=0")
# ~120M parameters (untied 50k vocabulary: 77M; 6 blocks of d 768: 42M), 12 block
# applications per token at 4 loops: about 0.75 GFLOP per trained token.
GPU = Sizes(ce_tokens=8192, ce_dim=768, ce_vocabs=(32768, 131072), attn=(4, 12, 2048, 64),
            model=("model.d_model=768", "model.n_heads=12", "model.prelude_layers=2",
                   "model.core_layers=2", "model.coda_layers=2", "model.loops=4",
                   "model.vocab_size=50304", "model.tie_embeddings=false", "model.moe_experts=0"),
            seq_len=1024, rows=32, micro_rows=16, steps=40, pack_docs=40000, stdlib_docs=300,
            heff_tokens=65536, heff_cpu_tokens=4096, bench=(8, 4, (1, 4), 16),
            kv_batches=(1, 16), kv_new_tokens=64, repeats=5)
CPU = Sizes(ce_tokens=2048, ce_dim=64, ce_vocabs=(8192,), attn=(2, 4, 512, 16),
            model=("model.d_model=128", *_MODEL), seq_len=256, rows=8, micro_rows=8, steps=8,
            pack_docs=3000, stdlib_docs=20, heff_tokens=4096, heff_cpu_tokens=0,
            bench=(2, 2, (1, 4), 8), kv_batches=(1, 8), kv_new_tokens=64, repeats=3)
QUICK = Sizes(ce_tokens=512, ce_dim=32, ce_vocabs=(2048,), attn=(2, 2, 256, 16),
              model=("model.d_model=64", *_MODEL), seq_len=128, rows=4, micro_rows=4, steps=3,
              pack_docs=600, stdlib_docs=0, heff_tokens=1024, heff_cpu_tokens=0,
              bench=(1, 1, (2,), 4), kv_batches=(2,), kv_new_tokens=16, repeats=1)


@dataclass
class Context:
    """What the checks share: the tiny config, the device and its precision, the work
    directory, the sizes, and packs and runs built on first use (``cache``)."""

    cfg: Config
    device: torch.device
    work: Path
    quick: bool = False
    sizes: Sizes = QUICK
    peak_tflops: float | None = None  # --peak-tflops: the device's bf16 peak, when not in the table
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def amp(self) -> Precision:
        return Precision.resolve(self.cfg.experiment.precision, self.device)

    @property
    def precision(self) -> str:
        """What ``experiment.precision`` resolved to here: ``bf16`` or ``fp32``."""
        return self.amp.name

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.amp.autocast()

    def dtype(self) -> torch.dtype:
        return self.amp.dtype

    def tolerance(self) -> float:
        return 1e-4 if self.dtype() == torch.float32 else 3e-2

    def pack(self, data: DataConfig = DATA, name: str = "data") -> Path:
        """``data`` packed into ``work/name`` (once per run of the checks)."""
        key = f"pack:{name}"
        if key not in self.cache:

            pack_corpus(data, self.work / name)
            self.cache[key] = self.work / name
        return self.cache[key]


def check_config(cfg: Config) -> Config:
    """The tiny configuration of the checks, on ``cfg``'s device, precision and attention."""
    keep = [f"experiment.device={cfg.experiment.device}", f"model.attention={cfg.model.attention}",
            f"experiment.precision={cfg.experiment.precision}",
            f"train.compile={str(cfg.train.compile).lower()}"]
    return dataclasses.replace(load_config(None, [*TINY, *keep]), data=DATA)


def max_diff(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Largest absolute difference over the pairs of tensors."""
    return max(float((a.detach().float() - b.detach().float()).abs().max()) for a, b in pairs)


def relative_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a − b| / max |b|`` (0 when both are 0)."""
    scale = float(b.detach().float().abs().max())
    return max_diff([(a, b)]) / scale if scale > 0 else max_diff([(a, b)])


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
