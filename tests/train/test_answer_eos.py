"""Answer objectives score the EOS after each answer, so a trained model stops by itself.

Before, the answer span ended before the EOS: an ``answer_*`` run never saw a stop target,
``generate`` ran on past the answer until ``--max-new-tokens`` and ``generate_until`` tasks
could not match. 150 steps of the tiny model (about 2 s) are enough to learn the stop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import make_pack, snap, tiny_config

from pipeline_lib.data.loader import DataCursor, PackedData
from pipeline_lib.data.reasoning import generate_problems
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.model.generate import STOP_EOS, greedy_generate
from pipeline_lib.train.job import train_segment

STEPS = 150
SHORT = ["train.objective=answer_last", f"train.total_steps={STEPS}",
         f"train.steps_per_segment={STEPS}", "train.eval_interval=0",
         "train.diagnostics_interval=0", "train.sample_tokens=0", "train.lr=0.01",
         "model.loops=1", "train.warmup_steps=5"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("answer_eos") / "data")


@pytest.fixture(scope="module")
def trained(pack: Path, tmp_path_factory: pytest.TempPathFactory):
    run = tmp_path_factory.mktemp("answer_eos_run")
    out = train_segment(tiny_config(*SHORT), pack, None, STEPS, snap(run, STEPS))
    loaded = load_for_eval(out, with_tokenizer=True, device=torch.device("cpu"))
    loaded.model.eval()
    return loaded


def test_training_batches_score_the_eos_after_every_answer(pack: Path) -> None:
    data = PackedData(pack)
    micro, _ = data.batches_for_step(DataCursor(), 16, 8)
    for batch in micro:
        eos = batch["targets"] == data.eos_id  # every document is a reasoning problem
        assert eos.sum() > 4 and batch["answer_mask"][eos].all()  # each one's EOS is scored
        after = batch["input_ids"][eos]  # ...as the token that follows the answer's digit
        assert ((after >= ord("0")) & (after <= ord("9"))).all()


def test_an_answer_objective_learns_to_stop_after_the_answer(pack: Path, trained) -> None:
    model, eos = trained.model, PackedData(pack).eos_id
    batch = next(PackedData(pack).val_batches(16, 16))
    ends = batch["answer_mask"] & (batch["targets"] == eos)
    with torch.no_grad():
        predicted = model.logits_at(batch, 1).argmax(-1)
    assert ends.sum() > 10 and (predicted[ends] == eos).float().mean() >= 0.9
    # fresh prompts: greedy decoding ends by itself after the one-digit answer
    tok = trained.tokenizer
    prompts = [tok.encode(p.prompt).ids for p in generate_problems("khop", 2, 8, seed=99)]
    results = greedy_generate(model, prompts, 8, h_eff=1, eos_id=eos, context_len=32)
    assert [reason for _, reason in results] == [STOP_EOS] * len(prompts)
    assert all(len(ids) == 1 and chr(ids[0]).isdigit() for ids, _ in results)
