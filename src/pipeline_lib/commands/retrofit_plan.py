"""`retrofit-plan`: measure prelude / core / coda choices of a pretrained model on held-out
rows before training (:mod:`pipeline_lib.retrofit.plan`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from ..spec.config_load import config_for_run, load_config
from ._common import CONFIG, Command, arg, out

COMMAND = Command(
    "retrofit-plan", "score a pretrained model's layer choices for a retrofit", (
        arg("--source", type=Path, default=None,
            help="Hugging Face model directory or .gguf file (default: the config's "
                 "model.init_from.source)"),
        arg("--data", type=Path, required=True,
            help="a pack made with the source's tokenizer (its validation rows)"),
        arg("--rows", type=int, default=16, help="validation rows (default 16)"),
        arg("--measure", type=int, default=6,
            help="candidates built and scored, best by pre-score (default 6)"),
        arg("--budget-blocks", type=int, default=None,
            help="block applications per token (default: the source's layer count, its "
                 "FLOPs)"),
        out("--out", required=True, help="plan directory (plan.json, .md, .png)"),
        CONFIG),
    description="Run the source whole on the validation rows of a pack (its own tokenizer), "
                "measure how much each span of layers changes the stream (angular distance, "
                "block influence), pre-score every prelude / core / coda choice at the block "
                "budget, build the best few (and the config's own model.init_from choice) and "
                "score them at step 0 at every eval.h_eff: loss, paired difference to the "
                "original (95%% interval), loop drift, state scale, FLOPs. Prints the ranked "
                "table and the best choice as config; writes plan.json, plan.md and plan.png "
                "to --out. Loops, recurrence, injection and state init are the config's "
                "(model.*).")


def run(args: argparse.Namespace) -> int:
    from ..evaluate.heff import parse_h_eff  # torch, matplotlib: loads on run, `--help` stays fast
    from ..retrofit.plan import plan, plan_inputs, write_plan  # torch: as above
    from ..retrofit.report import plan_markdown  # matplotlib: as above

    cfg = load_config(args.config, args.overrides)
    if args.run:
        cfg = config_for_run(cfg, args.run)
    source = args.source or cfg.model.init_from.source
    if not source:
        raise ConfigError("retrofit-plan needs a source: pass --source PATH or a config "
                          "with model.init_from.source")
    if args.measure < 1:
        raise ConfigError(f"--measure {args.measure} must be at least 1")
    inputs = plan_inputs(cfg, source, args.data, loops=cfg.model.loops,
                         h_effs=parse_h_eff(cfg.eval.h_eff, "eval.h_eff"), rows=args.rows,
                         budget=args.budget_blocks)
    result = plan(inputs, args.measure)
    write_plan(result, args.out)
    print(plan_markdown(result))
    return 0
