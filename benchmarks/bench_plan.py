"""Planning long runs: what a Snakemake dry run of 100, 1000 and 5000 segments costs.

For each segment count and two keep policies, one run (``runs: {solo: {}}``) of segments of
10 steps is planned with ``snakemake -n --quiet rules`` in a fresh working directory
(nothing built: every job is planned), best of ``--repeats``:

- ``final``: ``keep_last 1, keep_every 0``: one kept snapshot, every other one temporary
  (the longest temporary chains; anchors every 100 segments keep Snakemake's resolution of
  them short);
- ``sparse``: ``keep_every`` a quarter of the run: four kept snapshots.

Reported: wall and CPU seconds (the Snakemake process and its children), the ratio of each
to the 100-segment plan of the same policy (measured in the same invocation), and the job
counts, checked against the plan. The CPU figure is the steadier one on a shared machine.

Usage: ``python benchmarks/bench_plan.py [--segments 100 1000 5000] [--repeats N]``.
Last line: JSON with every row.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline_lib.config import SnapshotsConfig
from pipeline_lib.workflow.snapshots_policy import anchor_steps, kept_steps, segment_ends

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
STEPS_PER_SEGMENT = 10
POLICIES = ("final", "sparse")


def _config(path: Path, segments: int, policy: str) -> Path:
    steps = segments * STEPS_PER_SEGMENT
    keep_every = 0 if policy == "final" else steps // 4
    path.write_text(f"train: {{total_steps: {steps}, steps_per_segment: {STEPS_PER_SEGMENT}}}\n"
                    f"snapshots: {{keep_last: 1, keep_every: {keep_every}}}\n"
                    "tracking: {enabled: false}\n"
                    "runs: {solo: {}}\n")
    return path


def _job_counts(output: str) -> dict[str, int]:
    lines = output.splitlines()
    jobs: dict[str, int] = {}
    if "Job stats:" in lines:
        for line in lines[lines.index("Job stats:") + 3:]:
            parts = line.split()
            if len(parts) != 2 or parts[0] == "total":
                break
            jobs[parts[0]] = int(parts[1])
    return jobs


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plan_once(segments: int, policy: str) -> tuple[float, float, dict[str, int]]:
    """Wall and CPU seconds of one dry run, and its job counts."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = _config(work / "plan.yaml", segments, policy)
        cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
               "--configfile", str(config), "--cores", "1", "-n", "--quiet", "rules"]
        cpu, start = _children_cpu(), time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if result.returncode != 0:
        raise SystemExit(f"dry run of {segments} segments ({policy}) failed:\n"
                         f"{(result.stdout + result.stderr)[-3000:]}")
    return wall, cpu, _job_counts(result.stdout)


def measure(segments: list[int], repeats: int) -> list[dict]:
    rows = []
    for policy in POLICIES:
        for n in segments:
            runs = [plan_once(n, policy) for _ in range(repeats)]
            wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
            jobs = runs[0][2]
            steps = n * STEPS_PER_SEGMENT
            ends = segment_ends(steps, STEPS_PER_SEGMENT)
            kept = kept_steps(ends, SnapshotsConfig(
                keep_last=1, keep_every=0 if policy == "final" else steps // 4))
            planned = (len(kept), n - len(kept), len(anchor_steps(ends, kept)))
            got = (jobs.get("train_segment", 0), jobs.get("train_segment_temp", 0),
                   jobs.get("segment_anchor", 0))
            assert got == planned, (n, policy, got, planned)
            rows.append({"policy": policy, "segments": n, "wall_s": round(wall, 2),
                         "cpu_s": round(cpu, 2), "jobs": sum(jobs.values()),
                         "anchors": got[2]})
        base = next(r for r in rows if r["policy"] == policy and r["segments"] == segments[0])
        for r in rows:
            if r["policy"] == policy:
                r["wall_ratio"] = round(r["wall_s"] / base["wall_s"], 2)
                r["cpu_ratio"] = round(r["cpu_s"] / base["cpu_s"], 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    rows = measure(args.segments, args.repeats)
    ref = args.segments[0]
    print(f"{'policy':8} {'segments':>8} {'jobs':>6} {'anchors':>7} {'wall s':>7} "
          f"{'cpu s':>6} {f'wall / {ref}':>10} {f'cpu / {ref}':>9}")
    for r in rows:
        print(f"{r['policy']:8} {r['segments']:8d} {r['jobs']:6d} {r['anchors']:7d} "
              f"{r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['wall_ratio']:10.2f} "
              f"{r['cpu_ratio']:9.2f}")
    print(json.dumps({"benchmark": "plan", "steps_per_segment": STEPS_PER_SEGMENT,
                      "rows": rows}))


if __name__ == "__main__":
    main()
