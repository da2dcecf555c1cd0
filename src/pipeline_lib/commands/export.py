"""`export`: a snapshot in the Hugging Face format, loadable by transformers and lm-eval's
``hf`` model without loopline (the rule ``export`` calls the same
:func:`pipeline_lib.export.export_snapshot` on each run's final snapshot)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._common import add_output


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "export", help="write a snapshot in the Hugging Face format (transformers, lm-eval hf)",
        description="Write model.safetensors, config.json (auto_map), generation_config.json, "
                    "the tokenizer files and a self-contained modeling_loopline.py (with its "
                    "loopline_layers.py) to --out, so "
                    "AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True) loads it "
                    "with no loopline installed (loop count: config num_loops, or the num_loops "
                    "argument of forward and generate; a model with the learned exit gate "
                    "honours exit_threshold there, or config exit_threshold). The snapshot is "
                    "verified first; --out appears complete or not at all.")
    parser.add_argument("--snapshot", type=Path, required=True,
                        help="snapshot directory (unsharded or sharded)")
    add_output(parser, "--out", required=True,
               help="export directory (new, or a previous export to replace)")
    parser.add_argument("--use-ema", action="store_true",
                        help="export the EMA weights (train.ema_decay > 0) instead of the model's")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="tokenizer.json to use instead of the snapshot's own")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..export import export_snapshot

    info = export_snapshot(args.snapshot, args.out, use_ema=args.use_ema,
                           tokenizer=args.tokenizer)
    print(json.dumps({"out": str(args.out), **info}))
    return 0
