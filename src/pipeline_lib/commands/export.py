"""`export`: a snapshot in the Hugging Face format, loadable by transformers and lm-eval's
``hf`` model without loopline (the rule ``export`` calls the same
:func:`pipeline_lib.workflow.stages.interop.export_stage` on each run's final snapshot,
tracking included: the child run ``export`` and an MLflow logged model of the ``train`` run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..workflow.stages.interop import export_stage
from ._common import CONFIG, OWN_CONFIG, TOKENIZER, Command, arg, out, snapshot_setup, tracking

COMMAND = Command(
    "export", "write a snapshot in the Hugging Face format (transformers, lm-eval hf)", (
        arg("--snapshot", type=Path, required=True,
            help="snapshot directory (unsharded or sharded)"),
        out("--out", required=True,
            help="export directory (new, or a previous export to replace)"),
        arg("--use-ema", action="store_true",
            help="export the EMA weights (train.ema_decay > 0) instead of the model's"),
        TOKENIZER,
        arg("--data", type=Path, default=None,
            help="the packed data directory the snapshot was trained on, recorded as the "
                 "logged model's dataset (optional)"),
        CONFIG, tracking("the export joins")),
    description="Write model.safetensors, config.json (auto_map), generation_config.json, the "
                "tokenizer files and a self-contained modeling_loopline.py (with its "
                "loopline_layers.py and loopline_adaptive.py) to --out, so "
                "AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True) loads it "
                "with no loopline installed (loop count: config num_loops, or the num_loops "
                "argument of forward and generate; a model with the learned exit gate honours "
                "exit_threshold there, or config exit_threshold). The snapshot is verified "
                "first; --out appears complete or not at all. Logged as the child run export "
                "of the run's MLflow parent run, and as a logged model of the run's train run. "
                + OWN_CONFIG)


def run(args: argparse.Namespace) -> int:
    cfg, run_dir = snapshot_setup(args)
    info = export_stage(cfg, args.run or run_dir.name, run_dir, args.snapshot, args.out,
                        args.data, use_ema=args.use_ema, tokenizer=args.tokenizer)
    print(json.dumps({"out": str(args.out), **info}))
    return 0
