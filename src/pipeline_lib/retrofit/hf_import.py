"""Import a Hugging Face checkpoint (Llama, Mistral, Qwen2, Qwen3, OLMo-2) as a loopline
snapshot (``import-hf``).

``import_checkpoint(source, out, cfg, choice)`` reads the pretrained weights (safetensors of
an HF directory, sharded or not, or a GGUF file dequantized to fp32 by the ``gguf``
package), maps them by the table in :mod:`~pipeline_lib.pretrained.hf_layout` onto a
:class:`LoopedLM` whose model section comes from the source
(:func:`~pipeline_lib.pretrained.init.init_model_config`), and writes a verified snapshot::

    model.safetensors  config.yaml  tokenizer.json  import.json  MANIFEST.json
    (+ empty optimizer and RNG records: training warm-starts from the weights only)

The chosen layers become prelude, core and coda (``choice``); the input-injection adapter
(``add``: state + λ·e; ``linear``: W[state; e] with W = [I | λI]) and any per-loop step
embedding are new and start from the seeded init. With every layer in order and one loop,
additive injection with λ = 1 and a zero initial state, the snapshot IS the source model
(the exactness tests compare logits against transformers); with ``model.recurrence: gated``
it is at every loop count, since its extra loops start as no-ops.

Everything is checked before anything is written: the source by the one validated reader
(:func:`~pipeline_lib.pretrained.pretrained_source.read_source`: config keys, every tensor
header and size, the shapes the config implies), run by the planner (a planned import then
compares the source's fingerprint with the run spec's ``init`` record instead); the snapshot
is built in a hidden sibling and renamed (:func:`~pipeline_lib.checkpoint.snapshot.write_snapshot`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..errors import DataError, UsageError
from ..output_paths import check_creatable
from ..pretrained.hf_layout import (
    GGUF_PERMUTED,
    TOP_TENSORS,
    LayerChoice,
    block_tensor_names,
    gguf_block_prefix,
    hf_block_prefix,
    init_choice,
    is_gguf,
)
from ..pretrained.init import init_model_config, original_config
from ..pretrained.pretrained_source import PretrainedSource, read_source, weight_files
from ..pretrained.source_config import hf_arch, read_config_json
from ..spec.config import Config
from ..spec.config_write import config_yaml
from ..spec.init_source import fingerprint_id, source_fingerprint
from ..spec.memory import inference_memory
from ..spec.names import CONFIG_JSON, TOKENIZER_FILE
from ..spec.size import param_count

log = logging.getLogger(__name__)

IMPORT_RECORD = "import.json"


# --------------------------------------------------------------------------- reading tensors


class _HFTensors:
    """Tensors of an HF directory by name: each weights file (:func:`weight_files`) opened
    once, its own header naming its tensors (read once, not once per name)."""

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open  # lazy: torch, see below

        self.opened = {name: (file, handle) for file in weight_files(directory)
                       for handle in [safe_open(str(file), "pt")] for name in handle.keys()}

    def get(self, name: str) -> Any:
        from safetensors import SafetensorError  # lazy: torch, see below

        file, handle = self.opened[name]
        try:
            return handle.get_tensor(name).float()
        except (SafetensorError, OSError) as exc:  # changed since it was checked
            raise DataError(f"{file}: tensor {name} cannot be read ({exc}); the file changed "
                            "or is damaged, download the model again") from None


class _GGUFTensors:
    """Tensors of a GGUF file by name, dequantized to fp32 (llama.cpp's q/k row order undone;
    :func:`read_source` checked that each lies inside the file and its type dequantizes)."""

    def __init__(self, source: PretrainedSource) -> None:
        import gguf  # lazy: only GGUF sources need it

        self.arch, self.gguf = source.arch, gguf
        self.tensors = {t.name: t for t in gguf.GGUFReader(str(source.path)).tensors}

    def get(self, name: str) -> Any:
        import torch  # lazy: the CLI imports us; `--help` stays torch-free

        tensor = self.tensors[name]
        array = self.gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        out = torch.from_numpy(array.astype("float32", copy=False).copy())
        heads = GGUF_PERMUTED.get(name.split(".", 2)[-1])
        if heads is not None:
            out = unpermute_rows(out, self.arch.heads if heads == "heads" else self.arch.kv_heads)
        return out


def unpermute_rows(weight: Any, heads: int) -> Any:
    """Undo llama.cpp's permutation of q/k rows: per head, its converter interleaves the two
    halves (rows r and r + hd/2 become rows 2r and 2r + 1) so that adjacent-pair RoPE rotates
    what HF's rotate_half rotates; this puts them back."""
    rows = weight.shape[0]
    return (weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
            .transpose(1, 2).reshape(weight.shape))


# --------------------------------------------------------------------------- mapping


def mapped_state(source: PretrainedSource, choice: LayerChoice) -> dict[str, Any]:
    """loopline's tensors (names of :class:`LoopedLM`'s state dict) read from the source
    (every one present with its shape: :func:`read_source` checked)."""
    import torch  # lazy: the CLI imports us; `--help` stays torch-free

    reader = _GGUFTensors(source) if source.gguf else _HFTensors(source.path)
    out: dict[str, Any] = {}

    def read(names: tuple[str, ...]) -> Any:
        parts = [reader.get(n) for n in names]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    pick = 1 if source.gguf else 0
    for ours, names in TOP_TENSORS.items():
        if not (ours == "head.weight" and source.arch.tie_embeddings):
            out[ours] = read((names[pick],))
    table = block_tensor_names(source.arch.architecture, source.gguf)
    for part in ("prelude", "core", "coda"):
        for j, layer in enumerate(choice.layers(part)):
            prefix = gguf_block_prefix(layer) if source.gguf else hf_block_prefix(layer)
            for ours, names in table.items():
                out[f"{part}.{j}.{ours}"] = read(tuple(prefix + n for n in names))
    return out


def build_imported_model(cfg: Config, state: dict[str, Any]) -> Any:
    """A seeded :class:`LoopedLM` of ``cfg.model`` with ``state`` loaded over it (the adapter,
    step embedding and loop gates keep their init)."""
    import torch  # lazy: the CLI imports us; `--help` stays torch-free

    from ..model.looped import LoopedLM  # lazy: torch, as above

    torch.manual_seed(cfg.experiment.seed)
    model = LoopedLM(cfg.model)
    own = model.state_dict()
    shapes = [f"{k}: source {tuple(v.shape)}, model {tuple(own[k].shape)}"
              for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    unknown = sorted(set(state) - set(own))
    if shapes or unknown:
        raise DataError("imported tensors do not fit the model derived from the source ("
                        + "; ".join((shapes + unknown)[:4]) + "); the source's config.json "
                        "does not describe its weights")
    model.load_state_dict({**own, **state})
    return model


def check_source_memory(source: PretrainedSource, cfg: Config, what: str) -> None:
    """Before a tensor is read: the model ``cfg`` takes from ``source`` (its headers' sizes)
    must fit in this machine's memory (:func:`~pipeline_lib.memory_check.check_memory`),
    named under the source's file, not loopline's keys."""
    import torch  # lazy: the CLI imports us; `--help` stays torch-free

    from ..memory_check import check_memory  # lazy: torch, as above

    where, model = source.path if source.gguf else source.path / CONFIG_JSON, cfg.model
    subject = (f"the model of {where} ({source.arch.architecture}, {param_count(model) / 1e9:.3g} "
               f"B parameters: hidden size {model.d_model}, {model.vocab_size} ids)")
    estimate = dataclasses.replace(
        inference_memory(model, subject=subject),
        fix="import fewer of its layers (--prelude/--core/--coda, model.init_from's) or use a "
            "machine with more memory")
    check_memory(estimate, torch.device("cpu"), what)


def source_teacher(cfg: Config) -> Any:
    """The whole pretrained model of ``model.init_from.source`` (:func:`original_config`),
    read once: the teacher of ``train.distill.teacher = source``."""
    source = read_source(cfg.model.init_from.source)
    teacher = original_config(cfg, source)
    check_source_memory(source, teacher, "the distillation teacher (train.distill.teacher)")
    return build_imported_model(teacher,
                                mapped_state(source, LayerChoice.whole(source.arch.layers)))


# --------------------------------------------------------------------------- the command


def _check_out(out: Path, source: Path) -> None:
    """``out`` must be new or a snapshot this command wrote (its import.json)."""
    if out.resolve() == source.resolve() or source.resolve() in out.resolve().parents:
        raise UsageError(f"--out {out} lies inside the source {source}; pass another path")
    check_creatable(out, "--out")
    if os.path.lexists(out) and not (out / IMPORT_RECORD).is_file():
        raise UsageError(f"--out {out} exists and is not a snapshot written by import-hf; "
                         "pass a new path or remove it")


def _opened_source(path: Path, planned: dict[str, Any] | None, cfg: Config
                   ) -> tuple[PretrainedSource, dict[str, Any] | None]:
    """The source and its config.json (None: not read here): checked by :func:`read_source`,
    or ``planned`` (``cfg`` completed from it) unchanged since then (its fingerprint), no
    header checked again and config.json read once, for the model and the tokenizer."""
    if planned is not None and (found := fingerprint_id(path)) != planned["fingerprint"]:
        raise DataError(f"model source {path} changed after the run was planned (fingerprint "
                        f"{found}, the run spec's {planned['fingerprint']}); re-plan: run "
                        "snakemake (or import-hf) again, which checks it anew")
    if planned is None or is_gguf(path):
        return read_source(path), None
    config = read_config_json(path)  # a kept lm_head (read_source) is in cfg already
    arch = dataclasses.replace(hf_arch(path, config), tie_embeddings=cfg.model.tie_embeddings)
    return PretrainedSource(path, arch, {}), config


def import_checkpoint(source: str | Path, out: str | Path, cfg: Config,
                      choice: LayerChoice | None = None, *, adapter: str | None = None,
                      planned: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the loopline snapshot of ``source`` to ``out``; returns the import record.

    ``cfg``: the run's config (its model section is completed from the source by
    :func:`~pipeline_lib.pretrained.init.init_model_config`; its data section's tokenizer must
    be the source's or a file of the same vocabulary). ``choice``: by default the ranges of
    ``model.init_from`` (``planned``'s: ``RunSpec.init``, see :func:`_opened_source`), else
    every layer. Each file of the source is read once. Raises
    :class:`DataError` / :class:`UsageError` / :class:`~pipeline_lib.errors.ConfigError`
    before anything is written.
    """
    from ..checkpoint.snapshot import write_snapshot  # lazy: torch, as above
    from ..data.tokenizer_source import tokenizer_from_source  # lazy: tokenizers

    started = time.perf_counter()
    src, model_json = _opened_source(Path(source).expanduser(), planned, cfg)
    source, arch, out = src.path, src.arch, Path(out)
    if planned:
        choice = LayerChoice(**{part: tuple(r) for part, r in planned["layers"].items()})
    choice = choice or init_choice(cfg.model.init_from, arch.layers)
    _check_out(out, source)
    cfg = init_model_config(cfg, src, choice, adapter)
    check_source_memory(src, cfg, "importing it")
    tok_cfg = cfg.data.tokenizer
    own = tok_cfg.type == "file" and tok_cfg.path
    tok_path = Path(tok_cfg.path).expanduser() if own else source
    tok, info = tokenizer_from_source(
        tok_path, tok_cfg.add_bos if own else "auto",
        config_json=model_json if tok_path.resolve() == source.resolve() else None)
    if info.vocab_size > arch.vocab_size:
        raise DataError(f"the tokenizer of {source} has {info.vocab_size} ids, the model "
                        f"{arch.vocab_size} embedding rows; the tokenizer does not belong to "
                        "this model")
    state = mapped_state(src, choice)
    model = build_imported_model(cfg, state)
    record = {"source": source_fingerprint(source), "fingerprint": fingerprint_id(source),
              "architecture": arch.architecture, "source_layers": arch.layers,
              "layers": choice.as_lists(), "injection": cfg.model.injection,
              "parameters": sum(p.numel() for p in model.parameters()),
              "tokenizer": info.to_json()}
    write_snapshot(
        out, model_state=model.state_dict(), optimizer_state={"state": {}, "param_groups": []},
        trainer_state={"format": 1, "step": 0, "imported": record["fingerprint"]},
        rng_state={}, config_yaml=config_yaml(cfg),
        extra_files={TOKENIZER_FILE: tok.to_str(), IMPORT_RECORD: json.dumps(record, indent=2)})
    record["seconds"] = round(time.perf_counter() - started, 2)
    log.info("imported %s (%s, layers %s) → %s in %.1f s", source, arch.architecture,
             choice.as_lists(), out, record["seconds"])
    return record


__all__ = ["import_checkpoint", "source_teacher", "unpermute_rows"]
