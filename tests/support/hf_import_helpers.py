"""Tiny pretrained-model sources for the import tests: a random Llama (or Mistral, Qwen2,
Qwen3, OLMo-2) saved by transformers' ``save_pretrained`` (with a byte-level tokenizer) and
the same weights written as a GGUF file the way llama.cpp's converter writes them (q/k rows
permuted for its RoPE layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline_lib.data.tokenizer import byte_level_tokenizer
from pipeline_lib.spec.names import EOS_TOKEN, PAD_TOKEN

VOCAB = 264  # the byte-level tokenizer's 258 ids, padded like many pretrained embeddings


TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=256,
            bos_token_id=None, eos_token_id=256, pad_token_id=257)


# family → (config class, model class) in transformers
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM"),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "olmo2": ("Olmo2Config", "Olmo2ForCausalLM")}


def save_tiny_llama(directory: Path, seed: int = 0, *, mistral: bool = False,
                    family: str = "llama", max_shard_size: str | None = None, **overrides):
    """A random ``LlamaForCausalLM`` (or ``MistralForCausalLM``, or the model of another
    ``family`` of :data:`FAMILIES`, from the same tiny settings; weights ~ N(0, 0.1), biases
    too: logits far from uniform) and its tokenizer saved to ``directory`` (safetensors
    shards of at most ``max_shard_size``); returns the model (fp32, eval mode)."""
    import transformers
    from transformers import PreTrainedTokenizerFast

    config_class, model_class = FAMILIES["mistral" if mistral else family]
    config = getattr(transformers, config_class)(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory, **({"max_shard_size": max_shard_size}
                                        if max_shard_size else {}))
    tok = PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer(), eos_token=EOS_TOKEN,
                                  pad_token=PAD_TOKEN)
    tok.save_pretrained(directory)
    return model


def _permute_like_llama_cpp(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (written out independently
    of the importer's inverse)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_tiny_gguf(model, path: Path, *, f16: bool = False, q8_1: str = "",
                    extra: dict[str, np.ndarray] | None = None,
                    strings: dict[str, str] | None = None) -> Path:
    """``model`` (a transformers Llama) as a GGUF file: llama.cpp's names, permuted q/k rows,
    F32 (or F16) tensors and the tokenizer metadata of the byte-level tokenizer; the tensor
    named ``q8_1`` is stored as Q8_1 blocks (zeros), which the gguf package cannot dequantize;
    ``extra``: more tensors, by GGUF name; ``strings``: more string metadata."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    tok = byte_level_tokenizer()
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab] + [f"<unused{i}>" for i in range(cfg.vocab_size - len(vocab))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * (len(tokens) - 256))
    writer.add_token_merges([])
    writer.add_eos_token_id(256)
    writer.add_pad_token_id(257)
    writer.add_add_bos_token(False)
    for key, value in (strings or {}).items():
        writer.add_string(key, value)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    block = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            module = rest.removesuffix(".weight")
            gguf_name = f"blk.{layer}.{block[module]}.weight"
            if module == "self_attn.q_proj":
                array = _permute_like_llama_cpp(array, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                array = _permute_like_llama_cpp(array, cfg.num_key_value_heads)
        else:
            gguf_name = names[name]
        if f16 and array.ndim == 2:
            array = array.astype(np.float16)
        if gguf_name == q8_1:  # 32 values a block of 40 bytes
            raw = np.zeros((array.shape[0], array.shape[1] // 32 * 40), dtype=np.uint8)
            writer.add_tensor(gguf_name, raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
            continue
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
