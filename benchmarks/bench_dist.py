"""Data-parallel benchmark: 2 processes (torchrun, FSDP2, gloo) vs 1 on this CPU (last line: JSON).

- ``tokens_per_s_1`` / ``tokens_per_s_2`` and ``speedup_2_vs_1``: tokens per second of the
  trainer's step loop (``loop_time_s`` of the segment record, validation excluded), both
  resuming the same 1-process warm-up snapshot for the same steps and the same global
  batch (1 process: 2 micro-batches per step; 2 processes: 1 each). Each process runs one
  torch thread, so on a 2-core machine 2 processes can at best double the throughput; the
  gloo all-gathers/reduce-scatters of FSDP2 and the machine's other load eat into that.
- ``save_s_unsharded`` / ``save_s_sharded`` (best of ``--repeats``): one snapshot written
  by one process (``write_snapshot``: safetensors) vs by two (``write_sharded_snapshot``:
  each rank its DCP shards, rank 0 hashes, writes the manifest and renames), state-dict
  collection included. ``save_ratio_sharded_vs_unsharded`` = sharded / unsharded time.

Usage: ``python benchmarks/bench_dist.py [--steps N] [--repeats R] [--quick]``. The script
re-runs itself under torchrun with ``--save-worker`` for the sharded save timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from pipeline_lib.checkpoint import state_io  # noqa: E402
from pipeline_lib.data.pack import pack_corpus  # noqa: E402
from pipeline_lib.spec.config import Config, DataConfig, SourceConfig
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.config_write import config_yaml  # noqa: E402
from pipeline_lib.train.launch import run_training_job  # noqa: E402
from pipeline_lib.train.segment_start import segment_start  # noqa: E402
from pipeline_lib.train.trainer import Trainer  # noqa: E402

DATA = DataConfig(sources=[SourceConfig(type="stdlib", max_docs=40),
                           SourceConfig(type="reasoning", num_docs=600)], seq_len=128)


def bench_config(nproc: int, *overrides: str) -> Config:
    cfg = load_config(None, ["tracking.enabled=false", "experiment.device=cpu",
                             "train.total_steps=100000", "train.eval_interval=0",
                             "train.diagnostics_interval=0", "train.sample_tokens=0",
                             "train.global_batch_rows=16", "train.micro_batch_rows=8",
                             f"train.nproc={nproc}", *overrides])
    return dataclasses.replace(cfg, data=DATA)


def segment_tokens_per_s(cfg: Config, pack: Path, start: Path, start_step: int, steps: int,
                         out: Path) -> dict:
    """Run ``steps`` steps from ``start``; tokens/s of the step loop (rank 0's record)."""
    wall = time.perf_counter()
    run_training_job(cfg, pack, start, start_step + steps, out, out.parent)
    wall = time.perf_counter() - wall
    seg = json.loads((out / "trainer_state.json").read_text())["segments"][-1]
    tokens = steps * cfg.train.global_batch_rows * cfg.data.seq_len
    return {"tokens_per_s": tokens / seg["loop_time_s"], "loop_s": seg["loop_time_s"],
            "job_wall_s": wall}


def save_times(trainer: Trainer, out_root: Path, repeats: int) -> list[float]:
    """Seconds per snapshot write of ``trainer``'s state (sharded when it has a group)."""
    import torch.distributed as dist

    t = trainer
    t.rng.capture()
    times = []
    for i in range(repeats):
        out = out_root / f"save_{i}"
        if t.group is not None:
            dist.barrier()
        started = time.perf_counter()
        state_io.save(out, t.parts(), ranks=t.ranks)
        times.append(time.perf_counter() - started)
    return times


def restored_trainer(cfg: Config, pack: Path, snapshot: Path, world: int, rank: int) -> Trainer:
    trainer = Trainer.build(cfg, pack, world_size=world, rank=rank)
    trainer.restore(segment_start(snapshot.parent, snapshot, cfg.train.total_steps))
    return trainer


def save_worker(args: argparse.Namespace) -> None:
    """Under torchrun: time sharded snapshot writes; rank 0 writes the times as JSON."""
    from pipeline_lib.spec.config_load import load_config as load
    from pipeline_lib.train.distributed import destroy_process_group, init_process_group

    torch.set_num_threads(1)
    cfg = dataclasses.replace(load(args.config, []), data=DATA)
    ctx = init_process_group("cpu")
    try:
        trainer = restored_trainer(cfg, args.data, args.snapshot, ctx.world_size, ctx.rank)
        times = save_times(trainer, args.out, args.repeats)
        if ctx.rank == 0:
            (args.out / "times.json").write_text(json.dumps(times))
    finally:
        destroy_process_group()


def sharded_save_times(cfg: Config, pack: Path, snapshot: Path, work: Path,
                       repeats: int) -> list[float]:
    config = work / "save_config.yaml"
    config.write_text(config_yaml(cfg))
    out = work / "sharded_saves"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", __file__, "--save-worker", "--config", str(config), "--data", str(pack),
           "--snapshot", str(snapshot), "--out", str(out), "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"sharded save worker failed:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads((out / "times.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="measured steps per segment")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny run (smoke test)")
    parser.add_argument("--save-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save_worker:
        return save_worker(args)
    torch.set_num_threads(1)
    steps, repeats = (3, 1) if args.quick else (args.steps, args.repeats)
    model = ["model.d_model=256", "model.n_heads=4"]
    results: dict = {"steps": steps, "repeats": repeats, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench_dist_") as tmp:
        work = Path(tmp)
        pack = work / "data"
        pack_corpus(DATA, pack)
        one, two = bench_config(1, *model), bench_config(2, *model)
        warm = work / "warm" / "step_0000002"
        run_training_job(one, pack, None, 2, warm, warm.parent)  # warm-up + shared start
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for r in range(repeats):  # alternate the order: the machine's load drifts
            for n, cfg in ((1, one), (2, two)) if r % 2 == 0 else ((2, two), (1, one)):
                out = work / f"p{n}_{r}" / f"step_{2 + steps:07d}"
                runs[n].append(segment_tokens_per_s(cfg, pack, warm, 2, steps, out))
        for n in (1, 2):
            results[f"tokens_per_s_{n}"] = statistics.median(x["tokens_per_s"] for x in runs[n])
            results[f"job_wall_s_{n}"] = statistics.median(x["job_wall_s"] for x in runs[n])
        results["speedup_2_vs_1"] = results["tokens_per_s_2"] / results["tokens_per_s_1"]
        print(f"throughput: 1 process {results['tokens_per_s_1']:.0f} tok/s, 2 processes "
              f"{results['tokens_per_s_2']:.0f} tok/s (x{results['speedup_2_vs_1']:.2f})",
              flush=True)

        saves = max(repeats, 3)
        snapshot = work / f"p2_0/step_{2 + steps:07d}"  # a sharded one: both sides restore it
        trainer = restored_trainer(one, pack, snapshot, 1, 0)
        unsharded = save_times(trainer, work / "unsharded_saves", saves)
        sharded = sharded_save_times(one, pack, snapshot, work, saves)
        state_mb = sum(p.stat().st_size for p in (work / "unsharded_saves" / "save_0").iterdir())
        results["state_MB"] = state_mb / 1e6
        results["save_s_unsharded"] = min(unsharded)
        results["save_s_sharded"] = min(sharded)
        results["save_ratio_sharded_vs_unsharded"] = min(sharded) / min(unsharded)
        results["save_s_all"] = {"unsharded": [round(t, 3) for t in unsharded],
                                 "sharded": [round(t, 3) for t in sharded]}
        print(f"save ({state_mb / 1e6:.1f} MB): unsharded {min(unsharded):.3f} s, sharded "
              f"{min(sharded):.3f} s", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
