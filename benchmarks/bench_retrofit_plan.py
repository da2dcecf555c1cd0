"""Wall time of ``retrofit-plan`` for SmolLM2-135M on 16 validation rows (target ≤ 10 min on
the developers' 2-core machine), one fresh process, the same thread count as the machine.

    python benchmarks/bench_retrofit_plan.py [--rows 16] [--measure 6] [--threads 2]

Packs the retrofit experiment's corpus (config/experiments/retrofit_smollm2.yaml: Python's
stdlib with SmolLM2's own tokenizer) into a temporary directory unless ``--data`` names a
pack, then times the command as users run it (``python -m pipeline_lib retrofit-plan
--config … --run retro``, recurrence gated). Prints the seconds, the target and their ratio;
the last line is JSON. No side-by-side baseline: nothing did this before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "experiments" / "retrofit_smollm2.yaml"
TARGET_S = 600.0


def _cli(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "pipeline_lib", *args], check=True, env=env,
                   cwd=ROOT, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--measure", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--data", type=Path, default=None, help="an existing pack (else packed)")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "pack"
        if args.data is None:
            _cli("pack", "--config", str(CONFIG), "--out", str(data), env=env)
        t0 = time.perf_counter()
        _cli("retrofit-plan", "--config", str(CONFIG), "--run", "retro", "--data", str(data),
             "--rows", str(args.rows), "--measure", str(args.measure), "--out",
             str(Path(tmp) / "plan"), "model.recurrence=gated", env=env)
        seconds = time.perf_counter() - t0
        plan = json.loads((Path(tmp) / "plan" / "plan.json").read_text())
    print(f"retrofit-plan, SmolLM2-135M, {args.rows} rows, {len(plan['candidates'])} candidates "
          f"built, {args.threads} threads: {seconds:.0f} s (target {TARGET_S:.0f} s, ratio "
          f"{seconds / TARGET_S:.2f})")
    print(json.dumps({"seconds": round(seconds, 1), "target_s": TARGET_S,
                      "ratio": round(seconds / TARGET_S, 3), "rows": args.rows,
                      "candidates": len(plan["candidates"]), "threads": args.threads}))


if __name__ == "__main__":
    main()
