"""`trajectories`: how sampled validation tokens' loop states move, loop by loop, past the
training loop count (the opt-in rule ``eval_trajectories`` calls the same
:func:`pipeline_lib.workflow.stages.trajectories.trajectories_stage`, tracking included)."""

from __future__ import annotations

import argparse
import json

from ._common import CONFIG, DATA, OWN_CONFIG, SNAPSHOT, Command, arg, out, snapshot_setup, tracking

COMMAND = Command(
    "trajectories", "latent trajectories of sampled validation tokens (opt-in stage)", (
        SNAPSHOT, DATA,
        out("--out", required=True,
            help="output directory (trajectories.json and trajectories.png)"),
        arg("--tokens", type=int, default=None, help="validation tokens sampled (default 256)"),
        arg("--max-loops", type=int, default=None,
            help="loops run, past the training count to see extrapolation (default 2 × "
                 "model.loops)"),
        CONFIG, tracking("the stage joins")),
    description="Run a seeded sample of --data's validation tokens through --snapshot's loops "
                "up to --max-loops; write trajectories.json (per-loop relative step, cosine of "
                "successive states, KL to the final readout; each token's path classed "
                "converging, orbiting or drifting; a 2-D PCA of the paths) and "
                "trajectories.png into --out, logged as the child run trajectories/step_… of "
                "the run's MLflow parent run. " + OWN_CONFIG)


def run(args: argparse.Namespace) -> int:
    # torch: loads on run, `--help` stays fast
    from ..evaluate.trajectories import DEFAULT_TOKENS, check_trajectory_args
    from ..workflow.stages.trajectories import trajectories_stage  # torch: likewise

    tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    check_trajectory_args(tokens, args.max_loops)  # before the snapshot's config is read
    cfg, run_dir = snapshot_setup(args)
    result = trajectories_stage(cfg, run_dir, args.snapshot, args.data, args.out,
                                tokens=tokens, max_loops=args.max_loops)
    print(json.dumps({key: result[key] for key in ("step", "tokens", "max_loops",
                                                    "training_loops", "classes")}))
    return 0
