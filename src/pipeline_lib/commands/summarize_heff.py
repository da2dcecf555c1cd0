"""`summarize-heff`: table and figure over the H_eff sweeps of every kept snapshot."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("summarize-heff", help="parquet table + plot of H_eff sweep results")
    parser.add_argument("--inputs", type=Path, nargs="+", required=True, help="sweep JSON files")
    parser.add_argument("--out-table", type=Path, required=True, help="output .parquet")
    parser.add_argument("--out-plot", type=Path, required=True, help="output .png")
    parser.add_argument("--title", default="", help="figure title")
    parser.add_argument("--out-adaptive-table", type=Path, default=None,
                        help="also the adaptive-exit table (.parquet; with --out-adaptive-plot)")
    parser.add_argument("--out-adaptive-plot", type=Path, default=None,
                        help="also the adaptive-exit figure (.png): loss vs loops used")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..evaluate.heff_summary import summarize_heff

    adaptive = (args.out_adaptive_table, args.out_adaptive_plot)
    if (adaptive[0] is None) != (adaptive[1] is None):
        raise ConfigError("--out-adaptive-table and --out-adaptive-plot go together; pass both")
    rows = summarize_heff(args.inputs, args.out_table, args.out_plot, args.title)
    print(f"{len(rows)} rows → {args.out_table}, {args.out_plot}")
    if adaptive[0] is not None:
        from ..evaluate.adaptive_summary import summarize_adaptive

        rows = summarize_adaptive(args.inputs, *adaptive, args.title)
        print(f"{len(rows)} rows → {adaptive[0]}, {adaptive[1]}")
    return 0
