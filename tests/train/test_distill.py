"""``train.distill``: healing a retrofit by distillation from the pretrained source (a tiny
random Llama saved by transformers) or from a loopline snapshot. A student that is the
teacher trains exactly as without it (KL 0, same objective, same gradients); a retrofit's
KL falls; a resumed segment equals an uninterrupted one; a bad teacher is one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support.hf_import_helpers import save_tiny_llama
from trainer_helpers import make_pack, metrics, snap, tiny_config

from pipeline_lib.cli import main
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.errors import ConfigError
from pipeline_lib.pretrained.hf_layout import layer_choice
from pipeline_lib.pretrained.init import resolve_init_from
from pipeline_lib.retrofit.hf_import import import_checkpoint, source_teacher
from pipeline_lib.spec.config import DataConfig, SourceConfig, TokenizerConfig
from pipeline_lib.spec.signatures import train_signature
from pipeline_lib.train.job import train_segment

LAYERS = 6
RUN = ["train.total_steps=8", "train.warmup_steps=0", "train.lr=3e-3", "train.eval_interval=0",
       "train.diagnostics_interval=0", "train.sample_tokens=0", "train.spike.enabled=false",
       "train.objective=last", "train.steps_per_segment=4"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path, DataConfig]:
    root = tmp_path_factory.mktemp("distill")
    save_tiny_llama(root / "src", num_hidden_layers=LAYERS)
    data = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=120, seed=3)],
                      tokenizer=TokenizerConfig(type="file", path=str(root / "src")),
                      seq_len=32, epochs=2, val_fraction=0.1, seed=1)
    pack_corpus(data, root / "pack")
    return root / "src", root / "pack", data


def _config(source, *overrides: str):
    src, _, data = source
    cfg = tiny_config(*RUN, f"model.init_from.source={src}", *overrides)
    return resolve_init_from(replace(cfg, data=data))[0]


def _init(source, cfg, out: Path, core: list[int] | None = None) -> Path:
    """The imported snapshot the student warm-starts from (every layer, or ``core``)."""
    choice = None if core is None else layer_choice(LAYERS, None, core, None)
    import_checkpoint(source[0], out, cfg, choice)
    return out


def _train(source, cfg, run: Path, ends: list[int], init: Path, builds: list | None = None
           ) -> Path:
    """Segments ending at ``ends``; ``builds`` gets one entry per teacher built."""
    def build(config):
        if builds is not None:
            builds.append(config.train.distill.teacher)
        return source_teacher(config)

    previous = None
    for end in ends:
        previous = train_segment(cfg, source[1], previous, end, snap(run, end),
                                 warm_start=init if previous is None else None,
                                 build_source=build)
    return previous


def test_a_student_that_is_the_teacher_trains_exactly_as_without_it(source, tmp_path) -> None:
    # one step: the student is the teacher while the gradient is taken
    plain = _config(source, "model.loops=1", "train.total_steps=1")
    distilled = _config(source, "model.loops=1", "train.total_steps=1",
                        "train.distill.teacher=source", "train.distill.weight=0.7")
    init = _init(source, plain, tmp_path / "init")
    a = _train(source, plain, tmp_path / "plain", [1], init)
    b = _train(source, distilled, tmp_path / "distilled", [1], init)
    ma, mb = metrics(tmp_path / "plain"), metrics(tmp_path / "distilled")
    assert [m["distill_kl"] for m in mb] == [0.0]  # bit for bit the teacher
    assert "distill_kl" not in ma[0]
    assert [m["loss"] for m in ma] == [m["loss"] for m in mb]  # the objective is plain CE
    assert [m["grad_norm"] for m in ma] == [m["grad_norm"] for m in mb]
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "optimizer.safetensors").read_bytes() == \
        (b / "optimizer.safetensors").read_bytes()  # the same gradients, to the bit


def test_a_retrofit_distilled_from_its_source_gets_closer_to_it(source, tmp_path) -> None:
    cfg = _config(source, "model.loops=2", "model.init_from.core=[2,4]",
                  "train.distill.teacher=source", "train.distill.weight=10.0", "train.lr=1e-2",
                  "train.total_steps=12", "train.steps_per_segment=12")
    init = _init(source, cfg, tmp_path / "init", core=[2, 4])
    _train(source, cfg, tmp_path / "run", [12], init)
    kl = [m["distill_kl"] for m in metrics(tmp_path / "run")]
    assert kl[0] > 0.05  # the retrofit starts away from its source
    assert sum(kl[-3:]) / 3 < 0.7 * sum(kl[:3]) / 3, kl
    losses = [m["loss"] for m in metrics(tmp_path / "run")]
    assert all(x >= k for x, k in zip(losses, kl, strict=True))  # CE + weight·KL, both ≥ 0


def test_resume_with_distillation_is_bit_identical(source, tmp_path) -> None:
    cfg = _config(source, "model.loops=2", "model.init_from.core=[2,4]",
                  "train.distill.teacher=source", "train.distill.weight=1.5",
                  "train.objective=deep_supervision", "train.loop_sampling.mode=uniform",
                  "train.loop_sampling.max_loops=3", "train.bptt.mode=unrolled",
                  "train.bptt.k=2")
    init = _init(source, cfg, tmp_path / "init", core=[2, 4])
    builds_one, builds_two = [], []
    one = _train(source, cfg, tmp_path / "one", [4], init, builds_one)
    two = _train(source, cfg, tmp_path / "two", [2, 4], init, builds_two)
    assert builds_one == ["source"] and builds_two == ["source"] * 2  # once per segment job
    assert (one / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()
    assert (one / "optimizer.safetensors").read_bytes() == \
        (two / "optimizer.safetensors").read_bytes()
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["distill_kl"] for m in m1] == [m["distill_kl"] for m in m2]
    assert [m["loss"] for m in m1] == [m["loss"] for m in m2]
    assert any(len(m["unroll_losses"]) > 1 for m in m1)  # the unrolls share the teacher


def test_a_snapshot_teacher_and_the_train_signature(source, tmp_path) -> None:
    whole = _config(source, "model.loops=1")
    init = _init(source, whole, tmp_path / "init")
    off = _config(source, "model.loops=2", "model.init_from.core=[2,4]")
    assert train_signature(off, "d") == train_signature(
        _config(source, "model.loops=2", "model.init_from.core=[2,4]",
                "train.distill.weight=3.0"), "d")  # off: not in the signature
    cfg = _config(source, "model.loops=2", "model.init_from.core=[2,4]",
                  f"train.distill.teacher={init}", "train.total_steps=2")
    assert train_signature(cfg, "d") != train_signature(off, "d")
    _train(source, cfg, tmp_path / "run", [2], _init(source, cfg, tmp_path / "i2", [2, 4]))
    assert all(m["distill_kl"] > 0 for m in metrics(tmp_path / "run"))


def test_a_teacher_of_another_tokenizer_is_refused_in_one_line(source, tmp_path,
                                                               capsys) -> None:
    other = make_pack(tmp_path / "other_pack")  # byte-level, the trainer tests' pack
    byte_run = train_segment(tiny_config("train.total_steps=1"), other, None, 1,
                             snap(tmp_path / "byte", 1))
    cfg = _config(source, "model.loops=2", "model.init_from.core=[2,4]",
                  f"train.distill.teacher={byte_run}")
    with pytest.raises(ConfigError, match=r"train\.distill\.teacher"):
        train_segment(cfg, source[1], None, 1, snap(tmp_path / "bad", 1))
    assert not snap(tmp_path / "bad", 1).exists()


@pytest.mark.parametrize(("teacher", "extra", "says"), [
    ("source", [], "model.init_from.source is empty"),
    ("/nonexistent/teacher", [], "neither source nor a snapshot directory"),
    ("source", ["model.exit_gate=true", "train.objective=expected_exit"], "expected_exit"),
])
def test_bad_teacher_config_is_one_error_line(tmp_path, capsys, teacher, extra, says) -> None:
    rc = main(["train", "--data", str(tmp_path / "pack"), "--resume-from", "none",
               "--until-step", "1", "--out", str(tmp_path / "out"),
               f"train.distill.teacher={teacher}", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: train.distill.teacher")
    assert says in err[0]
    assert not (tmp_path / "out").exists()


def test_a_snapshot_teacher_of_another_vocabulary_is_refused_when_planning(source,
                                                                          tmp_path) -> None:
    from pipeline_lib.spec.config_write import to_dict
    from pipeline_lib.workflow.plan import WorkflowPlan

    teacher = _init(source, _config(source, "model.loops=1"), tmp_path / "init")  # 264 rows
    student = tiny_config(f"train.distill.teacher={teacher}")  # byte-level: 258 ids
    with pytest.raises(ConfigError, match=r"train\.distill\.teacher = .*264-token "
                                          r"vocabulary, this run 258;"):
        WorkflowPlan(to_dict(student))
    WorkflowPlan(to_dict(tiny_config(f"train.distill.teacher={teacher}",
                                     "model.vocab_size=264")))  # the same rows: planned
