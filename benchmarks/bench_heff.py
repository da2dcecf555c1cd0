"""H_eff sweep benchmark: one pass with readouts at [1, 2, 4, 8] vs the prototype's way.

The prototype evaluated each H_eff with a full pass of its own (1 + 2 + 4 + 8 = 15 loop
applications plus four readouts); the one-pass sweep runs 8 loops and reads out four times.
Both are timed here on the same validation batches of a freshly packed reasoning corpus,
with the default model shape, alternated over several repeats (best of each).

Usage: ``python benchmarks/bench_heff.py [--repeats N] [--tokens N]``.
Last line: JSON with ``sweep_time_ratio`` (target ≤ 0.7) and the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("TQDM_DISABLE", "1")  # the sweep's progress bars would swamp the output

from pipeline_lib.data.loader import PackedData
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.diagnostics.timing import alternated
from pipeline_lib.evaluate.heff import sweep_losses
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config import DataConfig, SourceConfig
from pipeline_lib.spec.config_load import load_config

H_EFFS = [1, 2, 4, 8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config()
    with tempfile.TemporaryDirectory() as tmp:
        data_cfg = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=4000)],
                              seq_len=cfg.data.seq_len, epochs=1, val_fraction=0.2)
        meta = pack_corpus(data_cfg, Path(tmp) / "data")
        data = PackedData(Path(tmp) / "data")
        model_cfg = cfg.model
        model_cfg.vocab_size = meta["vocab_size"]
        torch.manual_seed(0)
        model = LoopedLM(model_cfg).eval()
        batches = list(data.val_batches(data.val_rows, cfg.eval.batch_rows))

        def one_pass() -> dict[int, float]:
            return sweep_losses(model, batches, H_EFFS, args.tokens)[0]

        def per_h_eff() -> dict[int, float]:
            return {h: sweep_losses(model, batches, [h], args.tokens)[0][h] for h in H_EFFS}

        timed = alternated({"one_pass": one_pass, "per_h_eff": per_h_eff}, args.repeats)
        best, check, losses = timed.best(), timed.last["one_pass"], timed.last["per_h_eff"]
        assert all(abs(check[h] - losses[h]) <= 1e-6 * abs(losses[h]) for h in H_EFFS)
    result = {"sweep_time_ratio": round(best["one_pass"] / best["per_h_eff"], 3),
              "one_pass_s": round(best["one_pass"], 3), "per_h_eff_s": round(best["per_h_eff"], 3),
              "h_eff": H_EFFS, "tokens": args.tokens,
              "model": {k: getattr(model_cfg, k) for k in ("d_model", "prelude_layers",
                                                            "core_layers", "coda_layers")}}
    print(f"one pass {result['one_pass_s']} s vs one pass per H_eff {result['per_h_eff_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
