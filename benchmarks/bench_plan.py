"""Planning long runs: what planning 100, 1000 and 5000 segments costs, against Snakemake's floor.

For each segment count and two keep policies, one run (``runs: {solo: {}}``) of segments of
10 steps is planned in a fresh working directory (nothing built: every job is planned),
best of ``--repeats``, two ways:

- ``dag``: ``snakemake --dag`` — the job graph built (every input function, wildcard and
  rule check) and written out: what a real run does before its first job starts;
- ``dry run``: ``snakemake -n --quiet rules`` — the graph, then every job scheduled and
  printed as if it ran (Snakemake's per-job bookkeeping of a whole run).

Policies:

- ``final``: ``keep_last 1, keep_every 0``: one kept snapshot, every other one temporary
  (the longest temporary chains; anchors every 100 segments keep Snakemake's resolution of
  them short);
- ``sparse``: ``keep_every`` a quarter of the run: four kept snapshots.

Snakemake's own floor, measured alternately in the same invocation: a bare Snakefile of
as many one-line ``touch`` jobs in a chain, with a target every 100 jobs as the anchors
give (without them Snakemake's recursive resolution fails near 480 jobs), planned the same
two ways. Reported: wall and CPU seconds (the Snakemake process and its children), the
ratio of the CPU seconds to that floor's (``/ bare``) and to the 100-segment plan of the
same policy, and the job counts, checked against the plan. The CPU figure is the steadier
one on a shared machine.

Side by side with another revision (``--baseline REV``, by default the code before issue 28
resolved each run once): the same plans of the 5000-segment graph with that revision's
Snakefile and library (``git archive`` into a temporary directory), and a segment job's
start-up, measured both ways in alternation (:mod:`bench_job_start`).

Usage: ``python benchmarks/bench_plan.py [--segments 100 1000 5000] [--repeats N]
[--baseline REV | --no-baseline] [--runs R]``. Last line: JSON with every row.
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

from bench_job_start import BASELINE, checkout, job_start_rows

from pipeline_lib.spec.config import SnapshotsConfig
from pipeline_lib.spec.snapshots import anchor_steps, kept_steps, segment_ends

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


MODES = {"dag": ["--dag"], "dry run": ["-n", "--quiet", "rules"]}
BARE_SNAKEFILE = """
N = int(config["segments"])
TARGETS = sorted({*range(100, N + 1, 100), N})

rule all:
    input: [f"s/{i:07d}" for i in TARGETS]

rule segment:
    input: lambda wc: [] if int(wc.i) == 1 else [f"s/{int(wc.i) - 1:07d}"]
    output: "s/{i}"
    shell: "touch {output}"
"""


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


def plan_once(segments: int, policy: str, mode: str,
              root: Path = ROOT) -> tuple[float, float, str]:
    """Wall and CPU seconds of one planning call, and what it printed. ``policy`` "bare":
    Snakemake's floor (:data:`BARE_SNAKEFILE`); ``root``: the tree whose Snakefile and
    library plan (a baseline's checkout)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if policy == "bare":
            snakefile = work / "Snakefile"
            snakefile.write_text(BARE_SNAKEFILE)
            config = ["--config", f"segments={segments}"]
        else:
            snakefile = root / "Snakefile"
            config = ["--configfile", str(_config(work / "plan.yaml", segments, policy))]
        cmd = [str(SNAKEMAKE), "--snakefile", str(snakefile), "--directory", str(work),
               *config, "--cores", "1", *MODES[mode]]
        cpu, start = _children_cpu(), time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if result.returncode != 0:
        raise SystemExit(f"{mode} of {segments} segments ({policy}) failed:\n"
                         f"{(result.stdout + result.stderr)[-3000:]}")
    return wall, cpu, result.stdout


def _check_jobs(segments: int, policy: str, output: str) -> int:
    """The dry run planned what the plan says (kept, temporary and anchor segment jobs)."""
    jobs = _job_counts(output)
    steps = segments * STEPS_PER_SEGMENT
    ends = segment_ends(steps, STEPS_PER_SEGMENT)
    kept = kept_steps(ends, SnapshotsConfig(
        keep_last=1, keep_every=0 if policy == "final" else steps // 4))
    planned = (len(kept), segments - len(kept), len(anchor_steps(ends, kept)))
    got = (jobs.get("train_segment", 0), jobs.get("train_segment_temp", 0),
           jobs.get("segment_anchor", 0))
    assert got == planned, (segments, policy, got, planned)
    return got[2]


def measure(segments: list[int], repeats: int) -> list[dict]:
    """Every (policy, segment count, mode), the bare floor alternated with the policies."""
    best: dict[tuple[str, int, str], tuple[float, float]] = {}
    anchors: dict[tuple[str, int], int] = {}
    for _ in range(repeats):
        for n in segments:
            for mode in MODES:
                for policy in ("bare", *POLICIES):
                    wall, cpu, out = plan_once(n, policy, mode)
                    key = (policy, n, mode)
                    old = best.get(key, (float("inf"), float("inf")))
                    best[key] = (min(old[0], wall), min(old[1], cpu))
                    if mode == "dry run" and policy != "bare":
                        anchors[(policy, n)] = _check_jobs(n, policy, out)
    rows = []
    for policy in ("bare", *POLICIES):
        for mode in MODES:
            for n in segments:
                wall, cpu = best[(policy, n, mode)]
                rows.append({"policy": policy, "mode": mode, "segments": n,
                             "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                             "anchors": anchors.get((policy, n)),
                             "cpu_vs_bare": round(cpu / best[("bare", n, mode)][1], 2),
                             "cpu_vs_first": round(cpu / best[(policy, segments[0], mode)][1],
                                                   2)})
    return rows


def graph_rows(segments: int, repeats: int, baseline: Path) -> list[dict]:
    """The ``final`` policy's job graph (``--dag``) of ``segments`` segments, this tree and
    the baseline's alternately; best CPU seconds of each and their ratio."""
    best = {"this": float("inf"), "baseline": float("inf")}
    for _ in range(repeats):
        for side, root in (("this", ROOT), ("baseline", baseline)):
            best[side] = min(best[side], plan_once(segments, "final", "dag", root)[1])
    return [{"measure": "job graph (--dag)", "segments": segments,
             "cpu_s": round(best["this"], 2), "baseline_cpu_s": round(best["baseline"], 2),
             "ratio": round(best["this"] / best["baseline"], 2)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline", default=BASELINE,
                        help="git revision measured side by side (default: before issue 28)")
    parser.add_argument("--no-baseline", action="store_true", help="this tree only")
    parser.add_argument("--runs", type=int, default=8,
                        help="variants of the job start-up's experiment (today's path plans "
                             "every one of them in every job)")
    args = parser.parse_args()
    rows = measure(args.segments, args.repeats)
    ref = args.segments[0]
    print(f"{'policy':7} {'mode':8} {'segments':>8} {'anchors':>7} {'wall s':>7} {'cpu s':>6} "
          f"{'cpu / bare':>10} {f'cpu / {ref}':>9}")
    for r in rows:
        anchors = "" if r["anchors"] is None else r["anchors"]
        print(f"{r['policy']:7} {r['mode']:8} {r['segments']:8d} {anchors!s:>7} "
              f"{r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['cpu_vs_bare']:10.2f} "
              f"{r['cpu_vs_first']:9.2f}")
    side_by_side: list[dict] = []
    if not args.no_baseline:
        with checkout(args.baseline) as baseline:
            side_by_side = (graph_rows(max(args.segments), args.repeats, baseline)
                            + job_start_rows(ROOT, baseline, args.runs, args.repeats))
        print(f"\nside by side with {args.baseline} (ratio < 1: this tree is faster)")
        for r in side_by_side:
            print(f"{r['measure']:34} {r.get('segments', ''):>5} "
                  f"this {r['cpu_s'] if 'cpu_s' in r else r['wall_s']:7.2f} s  baseline "
                  f"{r['baseline_cpu_s'] if 'cpu_s' in r else r['baseline_wall_s']:7.2f} s  "
                  f"ratio {r['ratio']:.2f}")
    print(json.dumps({"benchmark": "plan", "steps_per_segment": STEPS_PER_SEGMENT,
                      "rows": rows, "baseline": None if args.no_baseline else args.baseline,
                      "side_by_side": side_by_side}))


if __name__ == "__main__":
    main()
