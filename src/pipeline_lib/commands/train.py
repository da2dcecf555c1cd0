"""``train``: one training segment, from a snapshot (or scratch) to ``--until-step`` (the rule
``train_segment`` calls the same :func:`pipeline_lib.workflow.stages.train.train_stage`,
tracking included).

With ``train.nproc`` > 1 the command starts torchrun, which runs this command once per rank;
those workers (torchrun's environment is set) join the process group and train."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._common import CONFIG, NO_TRACK, Command, arg, config_from_args, out


def _resume(text: str) -> Path | None:
    return None if text.lower() == "none" else Path(text)


COMMAND = Command(
    "train", "train one segment: resume a snapshot, run to --until-step, snapshot", (
        CONFIG,
        arg("--data", type=Path, required=True,
            help="packed data directory (results/data/<data_id>)"),
        arg("--resume-from", type=_resume, required=True, metavar="SNAPSHOT_DIR|none",
            help="snapshot to resume, or 'none' to start from scratch"),
        arg("--until-step", type=int, required=True, metavar="N",
            help="train until this many optimizer steps are done"),
        out("--out", required=True,
            help="snapshot directory to write (e.g. results/<run>/snapshots/step_0000100)"),
        out("--run-dir", default=None,
            help="run directory for logs (default: the parent of the snapshots/ directory "
                 "holding --out)"),
        arg("--warm-start", type=Path, default=None, metavar="SNAPSHOT_DIR",
            help="with --resume-from none: start from this snapshot's weights only (fresh "
                 "optimizer, guard, RNG, data), e.g. after a model change"),
        arg("--attempt", type=int, default=1, metavar="K",
            help="1 for a first try; > 1 for a retry (applies a rollback record)"),
        NO_TRACK),
    description="Restore --resume-from (or start from scratch with 'none'), train the steps up "
                "to --until-step, and write the snapshot --out atomically. Run-level logs "
                "(train/metrics.jsonl, train/spike_events.jsonl, tensorboard/) go to --run-dir. "
                "With --attempt > 1 a rollback record left by a spike-guard abort from the same "
                "snapshot is applied.")


def run(args: argparse.Namespace) -> int:
    from ..workflow.stages.train import train_stage  # torch: loads on run, `--help` stays fast

    out, rank = train_stage(config_from_args(args), args.data, args.resume_from,
                            args.until_step, args.out, args.run_dir, args.attempt,
                            warm_start=args.warm_start)
    if rank != 0:
        return 0
    state = json.loads((out / "trainer_state.json").read_text())
    val = state.get("val_loss")
    print(f"step {state['step']}/{state['total_steps']}: val_loss {val}, tokens "
          f"{state['tokens_seen']}, skipped {state['spike_guard']['skipped_total']} steps: {out}")
    return 0
