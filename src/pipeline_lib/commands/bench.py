"""``bench``: score one snapshot on the downstream tasks at every H_eff (the rule
``bench_downstream`` calls the same :func:`pipeline_lib.bench.runner.run_benchmarks`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ._common import add_config_args


def _h_eff_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--h-eff {text!r} must be integers like 1,4,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--h-eff {text!r} needs values >= 1, e.g. 1,4,8")
    return values


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="downstream benchmarks of a snapshot through lm-evaluation-harness",
        description="Write the built-in loopline_* task files, then score every task in "
                    "bench.tasks at every H_eff in bench.h_eff (or --h-eff) through "
                    "lm_eval.simple_evaluate; per task, difficulty level and H_eff → --out JSON. "
                    "Without --config the snapshot's own config.yaml is used.")
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot directory")
    add_config_args(parser)
    parser.add_argument("--out", type=Path, required=True, help="result JSON to write")
    parser.add_argument("--tasks-dir", type=Path, default=None,
                        help="where the built-in task files go (default: <out dir>/tasks)")
    parser.add_argument("--h-eff", type=_h_eff_list, default=None,
                        help="comma-separated loop counts, overriding bench.h_eff (e.g. 1,4,8)")
    parser.add_argument("--include-path", default=None, metavar="DIR",
                        help="folder of your own lm-eval task YAMLs, overriding "
                             "bench.include_path (its tasks run next to bench.tasks)")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..bench.runner import run_benchmarks
    from ..config import config_for_run, load_config

    if args.config is None:  # the resolved config the snapshot was trained with
        from ..errors import CheckpointError

        snap_cfg = args.snapshot / "config.yaml"
        if not snap_cfg.is_file():
            raise CheckpointError(f"snapshot {args.snapshot} has no config.yaml; pass --config "
                                  "FILE or a complete snapshot directory")
        cfg = load_config(snap_cfg, args.overrides, base=None)
    else:
        cfg = load_config(args.config, args.overrides)
    if args.run:
        cfg = config_for_run(cfg, args.run)
    if args.include_path is not None:
        cfg = dataclasses.replace(cfg, bench=dataclasses.replace(
            cfg.bench, include_path=args.include_path))
    tasks_dir = args.tasks_dir or args.out.parent / "tasks"
    report = run_benchmarks(args.snapshot, cfg.bench, tasks_dir, args.out, args.h_eff,
                            device=cfg.experiment.device)
    h_effs = report["h_eff"]
    print(f"step {report['step']}: " + "  ".join(f"H_eff={h}" for h in h_effs))
    for task, info in report["tasks"].items():
        cells = []
        for h in h_effs:
            overall = info["h_eff"][str(h)]["overall"]
            metric = info["metric"] or next((m for m in overall if not m.endswith("_stderr")), None)
            cells.append(f"{overall.get(metric, float('nan')):.3f}" if metric else "-")
        print(f"  {task} ({info['metric'] or 'overall'}): " + "  ".join(cells))
    print(f"wrote {args.out}")
    return 0
