"""``retrofit-plan`` on a tiny random Llama (transformers' ``save_pretrained``) and a pack
made with its own tokenizer: the layer measures against transformers' hidden states, the
candidates at the block budget, a planned loss equal to the import + H_eff sweep of the
same choice, no-op loops equal to the original, and bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support.hf_import_helpers import save_tiny_llama

from pipeline_lib.cli import main
from pipeline_lib.data.loader import PackedData
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.evaluate.heff import run_heff
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.pretrained.hf_layout import layer_choice
from pipeline_lib.retrofit.hf_import import import_checkpoint
from pipeline_lib.retrofit.layer_similarity import measure
from pipeline_lib.spec.config import Config, DataConfig, SourceConfig, TokenizerConfig
from pipeline_lib.spec.names import IGNORE_INDEX

LAYERS = 6


@pytest.fixture(scope="module")
def setting(tmp_path_factory) -> tuple[Path, Path, torch.nn.Module]:
    root = tmp_path_factory.mktemp("retrofit_plan")
    hf = save_tiny_llama(root / "src", num_hidden_layers=LAYERS)
    data = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=120, seed=3)],
                      tokenizer=TokenizerConfig(type="file", path=str(root / "src")),
                      seq_len=32, epochs=1, val_fraction=0.25, seed=1)
    pack_corpus(data, root / "pack")
    return root / "src", root / "pack", hf


def _plan(setting, tmp: Path, *extra: str) -> dict:
    source, pack, _ = setting
    assert main(["retrofit-plan", "--source", str(source), "--data", str(pack), "--rows", "6",
                 "--out", str(tmp / "plan"), *extra]) == 0
    return json.loads((tmp / "plan" / "plan.json").read_text())


def test_layer_distances_are_transformers_hidden_states(setting, tmp_path) -> None:
    source, pack, hf = setting
    import_checkpoint(source, tmp_path / "snap", Config())  # every layer, one loop
    model = load_for_eval(tmp_path / "snap", with_tokenizer=False).model
    ids = next(PackedData(pack).val_batches(4, 4))["input_ids"]  # one document per row here
    targets = torch.where(ids > 0, ids, torch.full_like(ids, IGNORE_INDEX))  # a few unscored
    sim = measure(model, [{"input_ids": ids, "targets": targets}])
    ang = sim.angular
    assert ang.shape == (LAYERS + 1, LAYERS + 1)
    assert np.allclose(ang, ang.T) and np.all(np.diag(ang) == 0) and ang.min() >= 0
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states
    keep = (targets != IGNORE_INDEX).reshape(-1)
    flat = [s.reshape(-1, s.shape[-1])[keep] for s in states[:LAYERS]]  # [-1] is after norm
    for i, j in [(0, 1), (1, 4), (2, 5), (0, 5)]:
        cos = torch.nn.functional.cosine_similarity(flat[i], flat[j], dim=-1).clamp(-1, 1)
        expected = float((torch.arccos(cos) / np.pi).double().mean())
        assert ang[i, j] == pytest.approx(expected, abs=2e-5), (i, j)
    assert sim.block_influence()[0] == pytest.approx(1 - np.cos(np.pi * ang[0, 1]), abs=1e-9)
    assert sim.tokens == int(keep.sum())


def test_every_candidate_keeps_the_budget_and_the_table_is_ranked(setting, tmp_path) -> None:
    plan = _plan(setting, tmp_path, "--measure", "4", "model.loops=2", "eval.h_eff=[1,2]")
    cands = plan["candidates"]
    assert len(cands) == 4 and plan["candidates_considered"] > 4
    assert {c["block_applications"] for c in cands} == {LAYERS}  # the original's FLOPs
    assert {c["dropped_layers"] for c in cands} <= {1, 2}  # a core of k, (loops−1)·k dropped
    losses = [c["losses"]["2"] for c in cands]
    assert losses == sorted(losses)
    md = (tmp_path / "plan" / "plan.md").read_text()
    assert cands[0]["label"] in md and "init_from:" in md
    assert (tmp_path / "plan" / "plan.png").stat().st_size > 10_000


def test_the_planned_loss_is_the_import_and_sweep_of_that_choice(setting, tmp_path) -> None:
    plan = _plan(setting, tmp_path, "--measure", "2", "--rows", "1000", "model.loops=2",
                 "eval.h_eff=[1,2]")
    source, pack, _ = setting
    best = plan["candidates"][0]
    choice = layer_choice(LAYERS, *(best["init_from"][p] for p in ("prelude", "core", "coda")))
    import dataclasses

    cfg = Config()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, loops=2))
    import_checkpoint(source, tmp_path / "snap", cfg, choice)
    swept = run_heff(tmp_path / "snap", pack, [1, 2], tmp_path / "heff.json",
                     max_tokens=1 << 40, batch_rows=8)
    for h in ("1", "2"):
        assert best["losses"][h] == pytest.approx(swept["losses"][h], abs=1e-6)
    assert plan["tokens"] == swept["tokens"]


def test_gated_loops_with_every_layer_kept_equal_the_original(setting, tmp_path) -> None:
    # the config's own choice is always measured: every layer kept (0:2 / 2:4 ×2 / 4:6, 8
    # applications); gated extra loops are no-ops at step 0, so it is the original at every
    # H_eff, on the same documents
    plan = _plan(setting, tmp_path, "--measure", "1", "--budget-blocks", "8",
                 "model.loops=2", "model.recurrence=gated", "eval.h_eff=[1,2,3]",
                 "model.init_from.prelude=[0,2]", "model.init_from.core=[2,4]",
                 "model.init_from.coda=[4,6]")
    own = [c for c in plan["candidates"] if c["init_from"]["core"] == [2, 4]
           and c["init_from"]["prelude"] == [0, 2]]
    assert len(plan["candidates"]) == 2 and len(own) == 1, plan["candidates"]
    cand = own[0]
    assert cand["dropped_layers"] == 0 and cand["drift"] == 0.0
    for h, d in cand["vs_original"].items():
        assert abs(d["diff"]) < 1e-5, (h, d)
        assert cand["losses"][h] == pytest.approx(plan["original"]["loss"], abs=1e-5)


@pytest.mark.parametrize("extra, message", [
    (["--budget-blocks", "1"], "--budget-blocks 1"),
    (["model.loops=1"], "model.loops = 1"),
    (["--rows", "0"], "--rows 0"),
])
def test_bad_settings_are_one_line(setting, tmp_path, capsys, extra, message) -> None:
    source, pack, _ = setting
    code = main(["retrofit-plan", "--source", str(source), "--data", str(pack),
                 "--out", str(tmp_path / "plan"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "plan").exists()


def test_a_pack_with_another_vocabulary_is_refused(setting, tmp_path, capsys) -> None:
    source, _, _ = setting
    data = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=40)], seq_len=16,
                      tokenizer=TokenizerConfig(type="bpe", vocab_size=300), val_fraction=0.2)
    pack_corpus(data, tmp_path / "bpe")
    code = main(["retrofit-plan", "--source", str(source), "--data", str(tmp_path / "bpe"),
                 "--out", str(tmp_path / "plan")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "source's own tokenizer" in err
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("prelude, core, coda", [
    ("[0,2]", "[2,9]", "[]"),  # out of range
    ("[0,3]", "[2,4]", "[4,6]"),  # overlapping
    ("[]", "[4,2]", "[]"),  # reversed
    ("[0,2]", "[]", "[4,6]"),  # no core
])
def test_an_own_choice_that_the_import_refuses_is_refused_alike(setting, tmp_path, capsys,
                                                                prelude, core, coda) -> None:
    """The config's model.init_from choice passes the import's own check (issue 39, class 8:
    the plan measured and could recommend a choice import-hf then refused): the same one
    line as the planner's import gives, before any work, nothing written."""
    from pipeline_lib.errors import ConfigError
    from pipeline_lib.pretrained.init import resolve_init_from
    from pipeline_lib.spec.config_load import load_config

    source, pack, _ = setting
    overrides = [f"model.init_from.source={source}", f"model.init_from.prelude={prelude}",
                 f"model.init_from.core={core}", f"model.init_from.coda={coda}",
                 "model.loops=2", "eval.h_eff=[1,2]"]
    with pytest.raises(ConfigError) as refused:
        resolve_init_from(load_config(None, overrides))
    code = main(["retrofit-plan", "--data", str(pack), "--rows", "6", "--out",
                 str(tmp_path / "plan"), *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: {refused.value}"]
    assert "model.init_from." in err[0]
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("layers", [1, 2, 5, 12, 30])
def test_every_candidate_is_a_choice_the_import_accepts(layers: int) -> None:
    """Whatever the budget and loops, every candidate the plan could recommend passes
    import-hf's check (the one LayerChoice.check) and keeps the budget exactly."""
    from pipeline_lib.pretrained.retrofit_candidates import _core_sizes, enumerate_candidates

    angular = np.zeros((layers + 1, layers + 1))
    for loops in (2, 3, 4):
        for budget in range(1, 2 * layers + 1):
            if not _core_sizes(layers, loops, budget):
                continue
            for cand in enumerate_candidates(angular, loops, budget):
                parts = cand.choice.as_lists()
                assert layer_choice(layers, *(parts[p] for p in ("prelude", "core", "coda"))
                                    ) == cand.choice
                assert cand.applications(loops) == budget
