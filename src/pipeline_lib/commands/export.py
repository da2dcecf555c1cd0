"""`export`: a snapshot in the Hugging Face format, loadable by transformers and lm-eval's
``hf`` model without loopline (the rule ``export`` calls the same
:func:`pipeline_lib.workflow.stages.interop.export_stage` on each run's final snapshot,
tracking included: the child run ``export`` and an MLflow logged model of the ``train`` run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..spec.layout import run_dir_of
from ..workflow.stages.interop import export_stage
from ._common import add_config_args, add_output, add_tracking_args, config_from_args


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "export", help="write a snapshot in the Hugging Face format (transformers, lm-eval hf)",
        description="Write model.safetensors, config.json (auto_map), generation_config.json, "
                    "the tokenizer files and a self-contained modeling_loopline.py (with its "
                    "loopline_layers.py and loopline_adaptive.py) to --out, so "
                    "AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True) loads it "
                    "with no loopline installed (loop count: config num_loops, or the num_loops "
                    "argument of forward and generate; a model with the learned exit gate "
                    "honours exit_threshold there, or config exit_threshold). The snapshot is "
                    "verified first; --out appears complete or not at all. Logged as the child "
                    "run export of the run's MLflow parent run, and as a logged model of the "
                    "run's train run. Without --config the snapshot's own config.yaml is used.")
    parser.add_argument("--snapshot", type=Path, required=True,
                        help="snapshot directory (unsharded or sharded)")
    add_output(parser, "--out", required=True,
               help="export directory (new, or a previous export to replace)")
    parser.add_argument("--use-ema", action="store_true",
                        help="export the EMA weights (train.ema_decay > 0) instead of the model's")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="tokenizer.json to use instead of the snapshot's own")
    parser.add_argument("--data", type=Path, default=None,
                        help="the packed data directory the snapshot was trained on, recorded "
                             "as the logged model's dataset (optional)")
    add_config_args(parser)
    add_tracking_args(parser, "run directory whose MLflow parent run the export joins "
                              "(default: the run the snapshot belongs to)")
    return parser


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args, snapshot=args.snapshot)
    run_dir = args.run_dir if args.run_dir is not None else run_dir_of(args.snapshot)
    info = export_stage(cfg, args.run or run_dir.name, run_dir, args.snapshot, args.out,
                        args.data, use_ema=args.use_ema, tokenizer=args.tokenizer)
    print(json.dumps({"out": str(args.out), **info}))
    return 0
