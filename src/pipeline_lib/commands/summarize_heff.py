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
    return parser


def run(args: argparse.Namespace) -> int:
    from ..evaluate.heff_summary import summarize_heff

    rows = summarize_heff(args.inputs, args.out_table, args.out_plot, args.title)
    print(f"{len(rows)} rows → {args.out_table}, {args.out_plot}")
    return 0
