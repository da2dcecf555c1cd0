"""The static reading behind docs/configuration.md's key table, on a tiny checkout of its
own: what counts as reading a key, what does not, and the sections taken whole."""

from __future__ import annotations

from pathlib import Path

from pipeline_lib.config_readers import config_keys, find_readers

LIB = '''
from ..spec.config import Config, TrainConfig

def chain(cfg):
    return cfg.train.lr, cfg.data.tokenizer.vocab_size

def annotated(train: TrainConfig, other):
    return train.warmup_steps, other.beta1  # other: unknown, not a read

def assigned(cfg: Config):
    t, n = cfg.model, 4
    spike = cfg.train.spike
    return t.d_model, spike.hard_jump

def looped(cfg):
    for i, src in enumerate(cfg.data.sources):
        print(i, src.path)
    return [s.weight for s in cfg.data.sources]

def by_name(cfg, eval_cfg):
    for key in ("keep_last", "keep_every"):
        getattr(cfg.snapshots, key)
    return getattr(cfg.bench, "limit"), eval_cfg.max_tokens

def writes(cfg):
    cfg.train.eps = 1.0  # a write is not a read
    return to_dict(cfg.resources)

class Holder:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def use(self):
        return self.cfg.grad_clip
'''


def _checkout(root: Path) -> Path:
    (root / "src" / "pipeline_lib" / "pkg").mkdir(parents=True)
    (root / "src" / "pipeline_lib" / "pkg" / "mod.py").write_text(LIB)
    (root / "workflow" / "scripts").mkdir(parents=True)
    (root / "workflow" / "scripts" / "job.py").write_text(
        "print(snakemake.params.cfg.experiment.seed)\n")
    (root / "workflow" / "rules").mkdir()
    (root / "workflow" / "rules" / "x.smk").write_text(
        "use_ema=lambda wc: PLAN.runs[wc.run].config.eval.use_ema,\n")
    (root / "Snakefile").write_text('x = config["tracking"]["uri"]\n')
    return root


def test_reads_through_chains_names_loops_and_strings(tmp_path: Path) -> None:
    reads = find_readers(_checkout(tmp_path))
    found = {key for key, modules in reads.keys.items() if "pkg.mod" in modules}
    assert found == {"train.lr", "data.tokenizer.vocab_size", "train.warmup_steps",
                     "model.d_model", "train.spike.hard_jump", "data.sources[].path",
                     "data.sources[].weight", "snapshots.keep_last", "snapshots.keep_every",
                     "bench.limit", "eval.max_tokens", "train.grad_clip"}
    assert "train.beta1" not in reads.keys and "train.eps" not in reads.keys
    assert reads.whole == {"resources": {"pkg.mod"}}
    assert reads.keys["experiment.seed"] == {"workflow/scripts/job.py"}
    assert reads.keys["eval.use_ema"] == {"workflow/rules/x.smk"}
    assert reads.keys["tracking.uri"] == {"Snakefile"}


def test_keys_are_the_dataclasses_leaves() -> None:
    keys = config_keys()
    assert len(keys) == len(set(keys))
    assert {"runs", "train.spike.hard_jump", "data.sources[].path",
            "model.init_from.source"} <= set(keys)
    assert "train.spike" not in keys and "data.sources" not in keys
