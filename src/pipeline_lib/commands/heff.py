"""`heff`: validation loss of one snapshot at several test-time loop counts, one pass."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("heff", help="H_eff sweep of one snapshot (validation loss per H_eff)")
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot directory")
    parser.add_argument("--data", type=Path, required=True, help="packed data directory")
    parser.add_argument("--h-eff", default=None,
                        help="loop counts, e.g. 1,2,4,8 (default: eval.h_eff of the config)")
    parser.add_argument("--out", type=Path, required=True, help="output JSON file")
    parser.add_argument("--config", type=Path, default=None,
                        help="config for eval.* settings (default: the snapshot's own)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides of eval.* settings, e.g. eval.max_tokens=8192")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..evaluate.adaptive import AdaptiveSpec
    from ..evaluate.heff import parse_h_eff, run_heff

    if args.config is not None:
        cfg = load_config(args.config, args.overrides)
    else:  # the snapshot's resolved config is complete: no default to merge under it
        cfg = load_config(args.snapshot / "config.yaml", args.overrides, base=None)
    h_effs = parse_h_eff(args.h_eff if args.h_eff else cfg.eval.h_eff)
    result = run_heff(args.snapshot, args.data, h_effs, args.out,
                      max_tokens=cfg.eval.max_tokens, batch_rows=cfg.eval.batch_rows,
                      use_ema=cfg.eval.use_ema, adaptive=AdaptiveSpec.from_eval_config(cfg.eval))
    print(json.dumps(result))
    return 0
