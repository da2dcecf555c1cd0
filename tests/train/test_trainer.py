"""train_segment in-process: exact resume across segments, metrics lines, config checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_helpers import RICH, events, make_pack, metrics, snap, tiny_config, weights

from pipeline_lib.checkpoint.best import read_best
from pipeline_lib.checkpoint.manifest import verify_snapshot
from pipeline_lib.errors import CheckpointError, ConfigError, TrainingError
from pipeline_lib.train.job import train_segment
from pipeline_lib.workflow.stages.train import train_stage


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


def run_segments(cfg, pack: Path, run: Path, ends: list[int]) -> Path:
    previous = None
    for end in ends:
        previous = train_segment(cfg, pack, previous, end, snap(run, end))
    assert previous is not None
    return previous


CURRICULA = ["train.loop_sampling.mode=uniform", "train.loop_sampling.min_loops=1",
             "train.loop_sampling.max_loops=5", "train.loop_sampling.ramp_steps=4",
             "train.objective=answer_deep_supervision"]


# Muon on the blocks' matrices (MoE experts per expert), AdamW on router, norms and λ; the
# tied embedding (and so the head) frozen
MUON = [*RICH, "train.optimizer=muon", "train.muon_lr=0.01", "train.freeze=[embeddings]"]


# the learned exit gate trained by the expected-exit objective, over sampled loop counts
GATE = ["model.exit_gate=true", "train.objective=expected_exit", "train.exit_entropy_weight=0.05",
        "train.loop_sampling.mode=uniform", "train.loop_sampling.max_loops=4",
        "train.bptt.mode=truncated"]


# a random initial state every forward pass (drawn from the checkpointed RNG streams) and
# gated loops, over sampled loop counts with progressive backprop (gradient loops drawn too)
NOISE = ["model.state_init=noise", "model.recurrence=gated", "train.loop_sampling.mode=uniform",
         "train.loop_sampling.max_loops=4", "train.bptt.mode=progressive", "train.bptt.k=2"]


@pytest.mark.parametrize("variant", ["plain", "rich", "curricula", "muon", "gate", "noise"])
def test_three_segments_bit_identical_to_one(pack: Path, tmp_path: Path, variant: str) -> None:
    cfg = tiny_config(*{"plain": [], "rich": RICH, "curricula": CURRICULA, "muon": MUON,
                        "gate": GATE, "noise": NOISE}[variant])
    one = run_segments(cfg, pack, tmp_path / "one", [6])
    three = run_segments(cfg, pack, tmp_path / "three", [2, 4, 6])
    assert (one / "model.safetensors").read_bytes() == (three / "model.safetensors").read_bytes()
    assert (one / "optimizer.safetensors").read_bytes() == \
        (three / "optimizer.safetensors").read_bytes()
    if variant == "muon":
        _check_muon_and_freeze(cfg, pack, one)
    if variant == "gate":  # the gate is saved and trained
        assert weights(one)["exit_gate.weight"].shape == (1, 32)
        assert not torch.equal(weights(one)["exit_gate.bias"], torch.zeros(1))
    if variant == "noise":
        _check_noise_and_gates(pack, tmp_path, one)
    if variant == "rich":
        assert (one / "ema.safetensors").read_bytes() == (three / "ema.safetensors").read_bytes()
        state = weights(one)
        biases = [k for k in state if k.endswith("balance_bias")]
        assert biases and any(state[k].abs().sum() > 0 for k in biases)  # biases did move
    m1, m3 = metrics(tmp_path / "one"), metrics(tmp_path / "three")
    assert [m["step"] for m in m1] == [m["step"] for m in m3] == [1, 2, 3, 4, 5, 6]
    assert [m["loss"] for m in m1] == [m["loss"] for m in m3]
    assert [m["grad_norm"] for m in m1] == [m["grad_norm"] for m in m3]
    assert [m["loops"] for m in m1] == [m["loops"] for m in m3]
    # validation at every eval.h_eff (steps 4, 6 in both) and the readouts of each step
    for key in ("val_loss", "val/loss_h1", "val/loss_h12", "loss_h1"):
        values = [m.get(key) for m in m1 if m["step"] in (4, 6)]
        assert None not in values and values == [m.get(key) for m in m3 if m["step"] in (4, 6)]
    assert [m["cursor"] for m in m1] == [[0, 8 * i] for i in range(6)]
    if variant == "curricula":  # uniform in [1, round(1 + 4·min(1, s/4))]
        assert all(m["loops"] <= min(5, int(1 + s + 0.5)) for s, m in enumerate(m1, 1))
        assert m1[0]["loops"] <= 2
    if variant == "noise":  # progressive: 1..min(k, loops) loops backpropagated, drawn
        assert [m["grad_loops"] for m in m1] == [m["grad_loops"] for m in m3]
        assert all(1 <= m["grad_loops"] <= min(2, m["loops"]) for m in m1)
    if variant == "rich":
        assert len({m["loops"] for m in m1}) > 1  # loop sampling drew different counts
        assert any(len(m["unroll_losses"]) > 1 for m in m1)
        assert all("moe_load/core.0/e0" in m for m in m1)
    # the snapshot's own metrics.jsonl holds exactly its segment's steps
    seg = [json.loads(x) for x in (three / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in seg] == [5, 6]
    state = json.loads((three / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["cursor"] == [0, 48]
    assert state["tokens_seen"] == 6 * 8 * 32
    assert [s["end_step"] for s in state["segments"]] == [2, 4, 6]


def _check_noise_and_gates(pack: Path, tmp_path: Path, out: Path) -> None:
    """The gates of loops 2 and 3 trained away from 0; the noise changed the losses (the
    same run from a zero state differs from step 1 on)."""
    assert (weights(out)["loop_gate"] != 0).all()
    zeros = tiny_config(*NOISE, "model.state_init=zeros")
    run_segments(zeros, pack, tmp_path / "zeros", [2])
    noisy = [m["loss"] for m in metrics(tmp_path / "one")[:2]]
    plain = [m["loss"] for m in metrics(tmp_path / "zeros")]
    assert all(a != b for a, b in zip(noisy, plain, strict=True))


def _check_muon_and_freeze(cfg, pack: Path, out: Path) -> None:
    """The frozen embedding is bit for bit its initial value, the rest moved; the hidden
    matrices carry a Muon momentum buffer, the others Adam moments."""
    from pipeline_lib.train.trainer import Trainer

    initial = Trainer.build(cfg, pack).model.state_dict()
    final = weights(out)
    assert torch.equal(final["tok_emb.weight"], initial["tok_emb.weight"])
    assert not torch.equal(final["core.0.attn.qkv.weight"], initial["core.0.attn.qkv.weight"])
    assert not torch.equal(final["core.0.ffn.w_up"], initial["core.0.ffn.w_up"])
    assert not torch.equal(final["norm.weight"], initial["norm.weight"])
    moments = weights(out, "optimizer.safetensors")
    kinds = {k.rsplit("/", 1)[-1] for k in moments}
    assert kinds == {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"}
    groups = json.loads((out / "optimizer.json").read_text())["param_groups"]
    assert [g["name"] for g in groups] == ["decay", "no_decay", "injection_scale", "muon"]


def test_metrics_lines_and_segment_end_evaluation(pack: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = run_segments(tiny_config(), pack, run, [3, 6])
    lines = metrics(run)
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "loops", "skipped", "cursor"):
        assert all(key in m for m in lines), key
    # validation at the segment ends (3, 6) and every eval_interval (4) steps
    assert [m["step"] for m in lines if "val_loss" in m] == [3, 4, 6]
    assert [m["step"] for m in lines if "diag/grad_norm/core.0" in m] == [3, 6]
    assert "diag/act_rms/core.0/last" in lines[2]
    # lr follows warmup (2 steps) then cosine to min_lr_ratio · lr at the last step
    peak = tiny_config().train.lr
    assert lines[0]["lr"] == pytest.approx(0.5 * peak)
    assert lines[-1]["lr"] == pytest.approx(0.1 * peak)
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["prompt"] for s in samples] == tiny_config().train.sample_prompts
    # self-contained: the pack's tokenizer travels in the snapshot, under the manifest
    assert "tokenizer.json" in verify_snapshot(out)["files"]
    assert (out / "tokenizer.json").read_bytes() == (pack / "tokenizer.json").read_bytes()
    assert all(len(s["completion_ids"]) <= 4 and s["step"] == 6 for s in samples)
    assert any((run / "tensorboard").iterdir())
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["val_loss"] == lines[-1]["val_loss"]
    assert state["best_val"]["val_loss"] == min(m["val_loss"] for m in lines if "val_loss" in m)


def test_validation_reads_out_every_h_eff_once_per_evaluation(pack: Path, tmp_path: Path) -> None:
    """train.val_h_eff from one pass at every evaluation (segment ends 2, 4, 6 and the
    eval_interval, 4), each value once across segments and a rerun of the last one, equal to a
    direct ``model.losses``; val_loss stays at model.loops (3). Deep supervision logs the loss
    after every loop of every step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipeline_lib.checkpoint.restore import load_model_state
    from pipeline_lib.data.loader import PackedData
    from pipeline_lib.train.trainer import Trainer

    cfg = tiny_config("train.val_h_eff=[5, 1, 2]")
    run = tmp_path / "run"
    run_segments(cfg, pack, run, [2, 4, 6])
    train_segment(cfg, pack, snap(run, 4), 6, snap(run, 6))  # rerun: its lines replace its own
    lines = metrics(run)
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]
    val_keys = {"val/loss_h1", "val/loss_h2", "val/loss_h5"}
    for m in lines:
        assert {k for k in m if k.startswith("val")} == ((val_keys | {"val_loss"})
                                                          if m["step"] in (2, 4, 6) else set())
        readouts = [k for k in m if k.startswith("loss_h")]
        assert readouts == ["loss_h1", "loss_h2", "loss_h3"]
        assert m["loss"] == pytest.approx(sum(m[k] for k in readouts) / 3, rel=1e-6)
    model = Trainer.build(cfg, pack).model.eval()
    model.load_state_dict(load_model_state(snap(run, 6)))
    whole = next(PackedData(pack).val_batches(cfg.train.eval_rows, cfg.train.eval_rows))
    with torch.no_grad():
        direct = {h: float(v) for h, v in model.losses(whole, [1, 2, 3, 5]).items()}
    last = lines[-1]
    assert last["val_loss"] == pytest.approx(direct[3], rel=1e-6)
    assert {h: last[f"val/loss_h{h}"] for h in (1, 2, 5)} == pytest.approx(
        {h: direct[h] for h in (1, 2, 5)}, rel=1e-6)
    tags = set()
    for events_file in (run / "tensorboard").iterdir():
        tags |= set(EventAccumulator(str(events_file)).Reload().Tags()["scalars"])
    assert val_keys | {"train/val_loss", "train/loss_h1", "train/loss"} <= tags
    assert not {"train/val/loss_h1", "val/loss_h3"} & tags


def test_rerun_of_a_segment_replaces_its_lines(pack: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = tiny_config()
    first = run_segments(cfg, pack, run, [2, 4])
    before = (first / "model.safetensors").read_bytes()
    # rerun the second segment (as after a crash past its snapshot): lines 3-4 once
    train_segment(cfg, pack, snap(run, 2), 4, snap(run, 4))
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]
    assert (snap(run, 4) / "model.safetensors").read_bytes() == before


def test_nan_injection_is_skipped_and_logged(pack: Path, tmp_path: Path, inject_faults) -> None:
    inject_faults("nan_step=3")
    run = tmp_path / "run"
    out = train_segment(tiny_config(), pack, None, 5, snap(run, 5))
    lines = metrics(run)
    assert [m["skipped"] for m in lines] == [False, False, True, False, False]
    assert lines[2]["skip_reason"] == "non_finite_loss"
    assert lines[2]["loss"] != lines[2]["loss"]  # NaN, written as NaN
    skips = [e for e in events(run) if e["event"] == "skip"]
    assert [(e["step"], e["reason"]) for e in skips] == [(3, "non_finite_loss")]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["optimizer_steps"] == 4 and state["spike_guard"]["skipped_total"] == 1
    assert all(torch.isfinite(t).all() for t in weights(out).values())
    assert json.loads((out / "spike_events.jsonl").read_text().splitlines()[0])["step"] == 3


def test_spike_run_aborts_and_the_retry_rolls_back(pack: Path, tmp_path: Path,
                                                   inject_faults) -> None:
    # rows 32-47 are the data of steps 5 and 6 (8 rows per step): spikes there
    inject_faults("spike_rows=32:48,spike_nats=40")
    cfg = tiny_config("train.spike.abort_consecutive=2", "train.rollback_skip_steps=1",
                      "train.total_steps=9")
    run = tmp_path / "run"
    train_segment(cfg, pack, None, 3, snap(run, 3))
    with pytest.raises(TrainingError) as err:
        train_segment(cfg, pack, snap(run, 3), 9, snap(run, 9), attempt=1)
    assert "step_0000003" in str(err.value) and "step 6" in str(err.value)
    assert not snap(run, 9).exists()
    record = json.loads((run / "train" / "rollback.json").read_text())
    assert record["input_step"] == 3 and record["abort_step"] == 6
    assert record["window_cursor"] == [[0, 32], [0, 48]] and record["resume_cursor"] == [0, 56]
    out = train_segment(cfg, pack, snap(run, 3), 9, snap(run, 9), attempt=2)
    lines = metrics(run)
    assert [m["step"] for m in lines] == list(range(1, 10))
    assert [m["cursor"] for m in lines[3:]] == [[0, 24], [0, 56], [0, 64], [0, 72], [0, 80],
                                              [0, 88]]
    assert not any(m["skipped"] for m in lines)
    kinds = [e["event"] for e in events(run)]
    assert kinds == ["abort", "rollback"]  # the aborted attempt's skips were cut with its lines
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["rollbacks"][0]["resume_cursor"] == [0, 56]
    assert state["rollbacks"][0]["applied_attempt"] == 2
    assert not (run / "train" / "rollback.json").exists()


def test_resume_with_changed_model_config_lists_keys(pack: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 2, snap(run, 2))
    changed = tiny_config("model.d_model=64", "model.loops=2")
    with pytest.raises(CheckpointError, match=r"model\.d_model.*model\.loops"):
        train_segment(changed, pack, snap(run, 2), 4, snap(run, 4))


def test_warm_start_copies_weights_only(pack: Path, tmp_path: Path) -> None:
    from pipeline_lib.train.trainer import Trainer

    run = tmp_path / "run"
    source = train_segment(tiny_config(), pack, None, 4, snap(run, 4))
    changed = tiny_config("model.loops=5", "train.lr=0.001")
    with pytest.raises(CheckpointError, match=r"model\.loops"):
        train_segment(changed, pack, source, 6, snap(run, 6))
    trainer = Trainer.build(changed, pack)
    trainer.warm_start(source)
    weights = load_file(str(source / "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items()
               if k in weights)
    assert trainer.state.step == 0 and trainer.state.cursor.to_json() == [0, 0]
    out = train_segment(changed, pack, None, 2, tmp_path / "warm" / "snapshots" / "step_0000002",
                        warm_start=source)
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["warm_start"]["warm_start_from"] == str(source)
    with pytest.raises(ConfigError, match="exclude each other"):
        train_segment(changed, pack, out, 4, tmp_path / "x" / "step_0000004", warm_start=source)


def test_a_changed_freeze_list_is_a_warm_start_that_keeps_the_frozen_weights(
        pack: Path, tmp_path: Path) -> None:
    source = train_segment(tiny_config(), pack, None, 2, snap(tmp_path / "run", 2))
    frozen = tiny_config("train.freeze=[core,norm]", "train.optimizer=muon")
    with pytest.raises(CheckpointError, match=r"train\.freeze: snapshot \[\], now \['core', "):
        train_segment(frozen, pack, source, 4, snap(tmp_path / "run", 4))
    out = train_segment(frozen, pack, None, 2, snap(tmp_path / "warm", 2), warm_start=source)
    before, after = weights(source), weights(out)
    assert set(before) == set(after)
    for key in before:
        assert torch.equal(before[key], after[key]) == key.startswith(("core.", "norm.")), key


def test_corrupted_snapshot_is_refused_naming_the_file(pack: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = train_segment(tiny_config(), pack, None, 2, snap(run, 2))
    blob = bytearray((out / "optimizer.safetensors").read_bytes())
    blob[len(blob) // 2] ^= 0x01
    (out / "optimizer.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="optimizer.safetensors"):
        train_segment(tiny_config(), pack, out, 4, snap(run, 4))


def test_step_range_is_checked(pack: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="exceeds the run's 6 steps"):
        train_segment(tiny_config(), pack, None, 7, snap(run, 7))
    out = train_segment(tiny_config(), pack, None, 2, snap(run, 2))
    with pytest.raises(ConfigError, match="not past the resumed step 2"):
        train_segment(tiny_config(), pack, out, 2, snap(run, 3))


def test_answer_objective_on_a_pack_without_answers_fails_before_training(
        tmp_path: Path) -> None:
    from pipeline_lib.data.pack import pack_corpus
    from pipeline_lib.spec.config import DataConfig, SourceConfig

    (tmp_path / "t").mkdir()
    for i in range(20):
        (tmp_path / "t" / f"{i}.txt").write_text(f"plain text number {i} " * 3)
    no_answers = tmp_path / "plain"
    pack_corpus(DataConfig(sources=[SourceConfig(type="text", path=str(tmp_path / "t/*"))],
                           seq_len=32, val_fraction=0.1), no_answers)
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"train.objective = answer_last scores answer tokens "
                                          r"only, but the pack .* has no answer spans") as err:
        train_segment(tiny_config("train.objective=answer_last"), no_answers, None, 2,
                      snap(run, 2))
    assert "\n" not in str(err.value) and not run.exists()


def test_keep_best_tracks_temporary_and_kept_segments_in_one_place(pack: Path,
                                                                   tmp_path: Path) -> None:
    """Temporary snapshots (snapshots/transient/step_…) and kept ones (snapshots/step_…)
    compete for the same snapshots/best, which outlives the temporary step directories."""
    cfg = tiny_config("snapshots.keep_best=true", "train.lr=1.0")  # too high: loss goes up
    root = tmp_path / "snapshots"
    outs = [root / "transient" / "step_0000002", root / "transient" / "step_0000004",
            root / "step_0000006"]
    previous, losses = None, {}
    for out in outs:
        previous = train_segment(cfg, pack, previous, int(out.name[5:]), out)
        losses[out.name] = json.loads((out / "trainer_state.json").read_text())["val_loss"]
    best = read_best(root)
    winner = min(losses, key=losses.get)
    assert winner == "step_0000002"  # a temporary segment
    assert best == {"step": int(winner[5:]), "source": winner, "val_loss": losses[winner]}
    assert not (root / "transient" / "best").exists()
    shutil.rmtree(root / "transient")  # Snakemake deletes the temporary snapshots
    verify_snapshot(root / "best")  # hard links: the files outlive their step directory


@pytest.mark.slow
def test_mlflow_metrics_once_per_step_after_a_failed_attempt(
        pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject_faults) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny_config("tracking.enabled=true", f"tracking.uri={uri}",
                      "train.spike.abort_consecutive=2")
    run = tmp_path / "run"
    train_stage(cfg, pack, None, 3, snap(run, 3))  # the stage tracks; the trainer alone does not
    inject_faults("spike_rows=32:48")  # steps 5, 6: abort
    with pytest.raises(TrainingError):
        train_stage(cfg, pack, snap(run, 3), 6, snap(run, 6))
    out, _ = train_stage(cfg, pack, snap(run, 3), 6, snap(run, 6), attempt=2)
    state = json.loads((out / "trainer_state.json").read_text())
    first = json.loads((snap(run, 3) / "trainer_state.json").read_text())
    assert state["tracking_run_id"] == first["tracking_run_id"]  # one child run for all
    client = mlflow.MlflowClient(uri)
    history = client.get_metric_history(state["tracking_run_id"], "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]
    assert {m.step: m.value for m in history} == pytest.approx(
        {m["step"]: m["loss"] for m in metrics(run)})
    evaluated = [m for m in metrics(run) if "val_loss" in m]
    assert [m["step"] for m in evaluated] == [3, 4, 6]
    for h in cfg.eval.h_eff:  # every H_eff at every evaluation, once, under its own name
        history = client.get_metric_history(state["tracking_run_id"], f"val/loss_h{h}")
        assert sorted(m.step for m in history) == [3, 4, 6]
        assert {m.step: m.value for m in history} == pytest.approx(
            {m["step"]: m[f"val/loss_h{h}"] for m in evaluated})
    readouts = client.get_metric_history(state["tracking_run_id"], "train/loss_h3")
    assert sorted(m.step for m in readouts) == [1, 2, 3, 4, 5, 6]
    assert client.get_run(state["tracking_run_id"]).info.status == "FINISHED"
    logged = {a.path for a in client.list_artifacts(state["tracking_run_id"], "train")}
    assert {"train/config.yaml", "train/samples"} <= logged


def test_a_first_attempt_ignores_and_then_clears_a_stale_rollback_record(
        pack: Path, tmp_path: Path) -> None:
    from pipeline_lib.data.loader import DataCursor
    from pipeline_lib.train import rollback

    run = tmp_path / "run"
    rollback.write_record(run, rollback.make_record(
        input_snapshot=None, input_step=0, abort_step=3, first_bad_step=2,
        window_start=DataCursor(0, 8), window_end=DataCursor(0, 24),
        resume_cursor=DataCursor(0, 40), skip_steps=2, attempt=1, signature=""))
    train_segment(tiny_config(), pack, None, 3, snap(run, 3), attempt=1)
    assert [m["cursor"] for m in metrics(run)] == [[0, 0], [0, 8], [0, 16]]  # no jump
    assert not rollback.rollback_path(run).exists()


@pytest.mark.slow
def test_compiled_training_matches_eager(pack: Path, tmp_path: Path) -> None:
    """``train.compile`` (inductor on the CPU, ~40 s to compile) trains the same model: the
    same snapshot keys (no ``_orig_mod.`` prefix) and the same losses up to kernel fusion."""
    eager = run_segments(tiny_config(), pack, tmp_path / "eager", [2])
    compiled = run_segments(tiny_config("train.compile=true"), pack, tmp_path / "compiled", [2])
    w_eager, w_compiled = weights(eager), weights(compiled)
    assert list(w_compiled) == list(w_eager)
    for name, value in w_eager.items():
        torch.testing.assert_close(w_compiled[name], value, rtol=1e-4, atol=1e-5)
    losses = [[m["loss"] for m in metrics(tmp_path / run)] for run in ("eager", "compiled")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_the_trainer_takes_the_resolved_total_and_decides_no_budget(pack: Path) -> None:
    """train.total_steps is decided by resolve_run before training; the trainer uses it as
    given (a token budget left at 0 is refused, not recomputed from the pack)."""
    from dataclasses import replace

    from pipeline_lib.train.trainer import Trainer

    cfg = tiny_config()
    assert Trainer.build(cfg, pack).total_steps == cfg.train.total_steps == 6
    budget = replace(cfg, train=replace(cfg.train, total_steps=0))
    with pytest.raises(ConfigError, match="resolve_run"):
        Trainer.build(budget, pack)
