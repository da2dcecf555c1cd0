"""Export a snapshot to the Hugging Face format: a directory transformers loads as is.

``export_snapshot(snapshot, out)`` writes::

    config.json              LooplineConfig fields, auto_map → modeling_loopline.py
    generation_config.json   EOS/PAD ids, greedy, KV cache on
    model.safetensors        the LoopedLM state dict (EMA weights with use_ema), fp32
    modeling_loopline.py     the model for transformers (torch + transformers only)
    loopline_layers.py       its building blocks (imported by modeling_loopline.py)
    loopline_adaptive.py     its adaptive depth under the exit gate (imported by it too)
    tokenizer.json  tokenizer_config.json  special_tokens_map.json   (PreTrainedTokenizerFast)
    loopline_config.yaml     the resolved loopline config the snapshot was trained with

so ``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(out)`` load it without loopline installed. The snapshot is
verified against its manifest first (sharded snapshots are consolidated). The directory is
built in a hidden temporary sibling and renamed onto ``out`` at the end, so ``out`` is never
half-written; an existing ``out`` is replaced only when it is itself a loopline export.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ..checkpoint.fsutil import clean_stale_siblings, publish_dir, tmp_sibling
from ..errors import CheckpointError, UsageError
from ..output_paths import check_creatable
from ..spec.names import CONFIG_JSON, MODELING_FILE
from ..spec.size import (
    loop_gate_rows,
    resolved_ffn_hidden,
    resolved_head_dim,
    resolved_kv_heads,
    resolved_moe_hidden,
    step_embedding_rows,
)

log = logging.getLogger(__name__)

LAYERS_FILE = "loopline_layers.py"  # modeling_loopline.py's relative imports
ADAPTIVE_FILE = "loopline_adaptive.py"
MODELING_FILES = (MODELING_FILE, LAYERS_FILE, ADAPTIVE_FILE)
WEIGHTS_FILE = "model.safetensors"
LOOPLINE_CONFIG = "loopline_config.yaml"
EXPORT_FILES = (CONFIG_JSON, "generation_config.json", WEIGHTS_FILE, *MODELING_FILES,
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                LOOPLINE_CONFIG)
MODEL_TYPE = "loopline"


def hf_config(cfg: Any, eos: int, pad: int, provenance: dict[str, Any],
              bos: int | None = None) -> dict[str, Any]:
    """config.json of a model with loopline config ``cfg`` (``LooplineConfig`` fields);
    ``bos``: the token its training documents started with, if any."""

    m = cfg.model
    return {
        "architectures": ["LooplineForCausalLM"],
        "model_type": MODEL_TYPE,
        "auto_map": {"AutoConfig": "modeling_loopline.LooplineConfig",
                     "AutoModelForCausalLM": "modeling_loopline.LooplineForCausalLM"},
        "vocab_size": m.vocab_size, "hidden_size": m.d_model,
        "num_attention_heads": m.n_heads, "num_key_value_heads": resolved_kv_heads(m),
        "head_dim": resolved_head_dim(m), "qkv_bias": m.qkv_bias, "qk_norm": m.qk_norm,
        "norm_placement": m.norm_placement,
        "prelude_layers": m.prelude_layers,
        "core_layers": m.core_layers, "coda_layers": m.coda_layers, "num_loops": m.loops,
        "intermediate_size": resolved_ffn_hidden(m), "moe_experts": m.moe_experts,
        "moe_top_k": m.moe_top_k,
        "moe_intermediate_size": resolved_moe_hidden(m) if m.moe_experts else 0,
        "injection": m.injection, "injection_scale": m.injection_scale,
        "step_embedding_rows": step_embedding_rows(m), "state_init": m.state_init,
        "learned_positions": m.learned_positions,
        "loop_gate_rows": loop_gate_rows(m), "state_noise_std": m.init_std,
        # exit_threshold: the default of forward/generate, fixed depth until a user sets it
        "exit_gate": m.exit_gate, "exit_threshold": None,
        "tie_embeddings": m.tie_embeddings, "rope_theta": m.rope_theta,
        "rope_scaling_type": m.rope_scaling, "rope_scaling_factor": m.rope_scaling_factor,
        "rope_low_freq_factor": m.rope_low_freq_factor,
        "rope_high_freq_factor": m.rope_high_freq_factor,
        "rope_original_max_position": m.rope_original_max_position,
        "rms_norm_eps": m.norm_eps, "max_position_embeddings": cfg.data.seq_len,
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
        "tie_word_embeddings": False, "dtype": "float32",
        "loopline": provenance,
    }


def tokenizer_files(tok: Any, seq_len: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json for
    ``PreTrainedTokenizerFast``: ids equal loopline's (special tokens are never parsed out
    of text: ``split_special_tokens``), a BOS added only where training documents began with
    one (a pretrained tokenizer's, :func:`~pipeline_lib.data.tokenizer.bos_id`), no EOS
    added, byte-exact decoding."""
    from ..data.tokenizer import bos_id, eos_id, pad_id  # lazy: numpy and tokenizers

    bos = bos_id(tok)
    specials = {"eos_token": tok.id_to_token(eos_id(tok)),
                "pad_token": tok.id_to_token(pad_id(tok))}
    if bos is not None:
        specials["bos_token"] = tok.id_to_token(bos)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials,
              "model_max_length": seq_len, "split_special_tokens": True,
              "clean_up_tokenization_spaces": False, "add_bos_token": bos is not None,
              "add_eos_token": False, "padding_side": "right"}
    return {"tokenizer.json": tok.to_str(),
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
            "special_tokens_map.json": json.dumps(specials, indent=2) + "\n"}


def export_state(model: Any) -> dict[str, Any]:
    """The weights as the exported model names them: the LoopedLM state dict, plus λ of
    additive injection when it is fixed (a config value loopline does not save)."""
    import torch  # lazy: the CLI imports us; `--help` stays torch-free

    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if model.cfg.injection == "add" and "injection_scale" not in state:
        state["injection_scale"] = torch.tensor(float(model.cfg.injection_scale))
    return state


def _check_out(out: Path, snapshot: Path) -> None:
    """``out`` may be new or a previous loopline export; nothing else is overwritten."""
    if out.resolve() == snapshot.resolve() or snapshot.resolve() in out.resolve().parents:
        raise UsageError(f"export directory {out} lies inside the snapshot {snapshot}; pass "
                         "--out outside it (a snapshot is never edited)")
    check_creatable(out, "export directory")
    if not out.exists() and not out.is_symlink():
        return
    config = out / CONFIG_JSON
    try:
        is_export = out.is_dir() and json.loads(config.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        is_export = False
    if not is_export:
        raise UsageError(f"export directory {out} exists and is not a loopline export (no "
                         f"{CONFIG_JSON} with model_type {MODEL_TYPE!r}); pass a new --out or "
                         "remove it")


def _save_weights(state: dict[str, Any], path: Path) -> None:
    """safetensors' ``save_file``, whose failure to write (a full disk) is an OSError like
    every other write here (it raises its own SafetensorError naming the os error)."""
    from safetensors import SafetensorError  # lazy: torch, as above
    from safetensors.torch import save_file  # lazy: torch, as above

    try:
        save_file(state, str(path), metadata={"format": "pt"})
    except SafetensorError as exc:
        code = re.search(r"I/O error: (.*) \(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(2)), code.group(1), str(path)) from None


def _write_export(tmp: Path, loaded: Any, provenance: dict[str, Any]) -> None:
    from ..data.tokenizer import bos_id, eos_id, pad_id  # lazy: numpy and tokenizers

    tok, cfg = loaded.tokenizer, loaded.config
    _save_weights(export_state(loaded.model), tmp / WEIGHTS_FILE)
    config = hf_config(cfg, eos_id(tok), pad_id(tok), provenance, bos=bos_id(tok))
    (tmp / CONFIG_JSON).write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": config["eos_token_id"],
                  "pad_token_id": config["pad_token_id"], "do_sample": False,
                  "use_cache": True}
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in MODELING_FILES:
        shutil.copyfile(Path(__file__).with_name(name), tmp / name)
    for name, text in tokenizer_files(tok, loaded.seq_len).items():
        (tmp / name).write_text(text)
    shutil.copyfile(loaded.path / "config.yaml", tmp / LOOPLINE_CONFIG)
    for name in EXPORT_FILES:
        with open(tmp / name, "rb") as fh:  # flushed before the rename publishes them
            os.fsync(fh.fileno())


def export_snapshot(snapshot: Path, out: Path, *, use_ema: bool = False,
                    tokenizer: str | Path | None = None) -> dict[str, Any]:
    """Write the Hugging Face export of ``snapshot`` to ``out``; returns its provenance.

    ``tokenizer`` overrides the snapshot's own tokenizer.json (for snapshots written before
    they carried one). Raises CheckpointError for a snapshot that fails its manifest or does
    not fit its config, UsageError for an ``out`` that is not a previous export.
    """
    from ..evaluate.loading import load_for_eval  # lazy: torch, as above

    snapshot, out = Path(snapshot), Path(out)
    _check_out(out, snapshot)
    loaded = load_for_eval(snapshot, use_ema=use_ema, tokenizer=tokenizer,
                           tokenizer_option="--tokenizer {}")
    provenance = {"snapshot": str(snapshot.resolve()), "step": loaded.step,
                  "weights": "ema" if use_ema else "model", "train_loops": loaded.config.model.loops,
                  "seq_len": loaded.seq_len}
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(out)
    tmp = tmp_sibling(out)
    tmp.mkdir()
    try:
        _write_export(tmp, loaded, provenance)
        publish_dir(tmp, out)
    except OSError as exc:
        raise CheckpointError(f"cannot write export {out}: {exc}; check free space and "
                              "permissions (nothing was published)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s (step %s, %d loops) → %s", snapshot, loaded.step,
             loaded.config.model.loops, out)
    return provenance
