"""`trajectories`: how sampled validation tokens' loop states move, loop by loop, past the
training loop count (the opt-in rule ``eval_trajectories`` calls the same
:func:`pipeline_lib.workflow.stages.trajectories.trajectories_stage`, tracking included)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..spec.layout import run_dir_of
from ._common import add_config_args, add_output, add_tracking_args, config_from_args


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "trajectories", help="latent trajectories of sampled validation tokens (opt-in stage)",
        description="Run a seeded sample of --data's validation tokens through --snapshot's "
                    "loops up to --max-loops; write trajectories.json (per-loop relative step, "
                    "cosine of successive states, KL to the final readout; each token's path "
                    "classed converging, orbiting or drifting; a 2-D PCA of the paths) and "
                    "trajectories.png into --out, logged as the child run trajectories/step_… "
                    "of the run's MLflow parent run. Without --config the snapshot's own "
                    "config.yaml is used.")
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot directory")
    parser.add_argument("--data", type=Path, required=True, help="packed data directory")
    add_output(parser, "--out", required=True,
               help="output directory (trajectories.json and trajectories.png)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="validation tokens sampled (default 256)")
    parser.add_argument("--max-loops", type=int, default=None,
                        help="loops run, past the training count to see extrapolation "
                             "(default 2 × model.loops)")
    add_config_args(parser)
    add_tracking_args(parser, "run directory whose MLflow parent run the stage joins "
                              "(default: the run the snapshot belongs to)")
    return parser


def run(args: argparse.Namespace) -> int:
    # torch: loads on run, `--help` stays fast
    from ..evaluate.trajectories import DEFAULT_TOKENS, check_trajectory_args
    from ..workflow.stages.trajectories import trajectories_stage  # torch: likewise

    tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    check_trajectory_args(tokens, args.max_loops)  # before the snapshot's config is read
    cfg = config_from_args(args, snapshot=args.snapshot)
    run_dir = args.run_dir if args.run_dir is not None else run_dir_of(args.snapshot)
    result = trajectories_stage(cfg, run_dir, args.snapshot, args.data, args.out,
                                tokens=tokens, max_loops=args.max_loops)
    print(json.dumps({key: result[key] for key in ("step", "tokens", "max_loops",
                                                    "training_loops", "classes")}))
    return 0
