"""``bench``: score one snapshot on the downstream tasks at every H_eff (the rule
``bench_downstream`` calls the same :func:`pipeline_lib.workflow.stages.bench_stage`, tracking
included)."""

from __future__ import annotations

import argparse
import dataclasses

from ..output_paths import BENCH_JSON
from ._common import CONFIG, OWN_CONFIG, SNAPSHOT, Command, arg, out, snapshot_setup, tracking

COMMAND = Command(
    "bench", "downstream benchmarks of a snapshot through lm-evaluation-harness", (
        SNAPSHOT, CONFIG,
        out("--out", kind=BENCH_JSON, required=True, help="result JSON to write"),
        out("--tasks-dir", default=None,
            help="where the built-in task files go (default: <out dir>/tasks)"),
        arg("--h-eff", default=None,
            help="comma-separated loop counts, overriding bench.h_eff (e.g. 1,4,8)"),
        arg("--include-path", default=None, metavar="DIR",
            help="folder of your own lm-eval task YAMLs, overriding bench.include_path (its "
                 "tasks run next to bench.tasks)"),
        tracking("the scores join")),
    description="Write the built-in loopline_* task files, then score every task in "
                "bench.tasks at every H_eff in bench.h_eff (or --h-eff) through "
                "lm_eval.simple_evaluate; per task, difficulty level and H_eff → --out JSON, "
                "logged as the child run bench/step_… of the run's MLflow parent run. "
                + OWN_CONFIG)


def run(args: argparse.Namespace) -> int:
    from ..evaluate.heff import parse_h_eff  # torch: loads on run, `--help` stays fast
    from ..workflow.stages.bench import bench_stage  # torch, lm-eval: likewise

    cfg, run_dir = snapshot_setup(args)
    bench = cfg.bench
    if args.include_path is not None:
        bench = dataclasses.replace(bench, include_path=args.include_path)
    if args.h_eff is not None:
        bench = dataclasses.replace(bench, h_eff=parse_h_eff(args.h_eff))
    cfg = dataclasses.replace(cfg, bench=bench)
    tasks_dir = args.tasks_dir or args.out.parent / "tasks"
    report = bench_stage(cfg, run_dir, args.snapshot, args.out, tasks_dir)
    h_effs = report["h_eff"]
    print(f"step {report['step']}: " + "  ".join(f"H_eff={h}" for h in h_effs))
    for task, info in report["tasks"].items():
        cells = []
        for h in h_effs:
            overall = info["h_eff"][str(h)]["overall"]
            metric = info["metric"] or next((m for m in overall if not m.endswith("_stderr")), None)
            cells.append(f"{overall.get(metric, float('nan')):.3f}" if metric else "-")
        print(f"  {task} ({info['metric'] or 'overall'}): " + "  ".join(cells))
        for label, scores in (info.get("adaptive") or {}).items():
            value = scores["overall"].get(info["metric"] or "")
            shown = f"{value:.3f}" if value is not None else "-"
            print(f"    {label}: {shown} at {scores['loops']['mean']:.2f} mean loops")
    print(f"wrote {args.out}")
    return 0
