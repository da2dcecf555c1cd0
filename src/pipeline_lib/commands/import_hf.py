"""`import-hf`: a pretrained Hugging Face model (Llama, Mistral, Qwen2, Qwen3, OLMo-2: an HF
directory; Llama or Mistral: a GGUF file) as a loopline snapshot that training warm-starts
from (the rule ``import_init`` calls the same
:func:`pipeline_lib.workflow.stages.interop.import_stage` for ``model.init_from``, tracking
included: the child run ``import``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ..errors import ConfigError
from ..pretrained.hf_layout import parse_range
from ..pretrained.init import resolve_init_from
from ..spec.config_load import load_config
from ..spec.layout import run_dir_of
from ..workflow.stages.interop import import_stage
from ._common import Command, arg, out, tracking

COMMAND = Command(
    "import-hf", "import a Hugging Face Llama/Mistral/Qwen2/Qwen3/OLMo-2 checkpoint or a GGUF "
                 "file", (
        arg("--source", type=Path, required=True,
            help="Hugging Face model directory or .gguf file"),
        out("--out", required=True, help="snapshot directory (new)"),
        arg("--prelude", default=None, metavar="A:B", help="prelude layers"),
        arg("--core", default=None, metavar="C:D", help="looped core layers"),
        arg("--coda", default=None, metavar="E:F", help="coda layers"),
        arg("--adapter", choices=["add", "linear"], default="add",
            help="input injection: add (state + λ·e) or linear (W[state; e])"),
        arg("--loops", type=int, default=1,
            help="training loop count written to the snapshot's config (default 1)"),
        arg("--config", type=Path, action="append", default=None,
            help="config file whose other settings the snapshot's config takes (may be "
                 "partial; merged over config/config.yaml); repeat to merge several in order, "
                 "as the other commands do"),
        arg("overrides", nargs="*", help="key=value config overrides"),
        tracking("the import joins", "the directory holding --out")),
    description="Write a verified loopline snapshot (weights, config.yaml with the model "
                "section derived from the source, tokenizer.json, import.json, MANIFEST) from "
                "a Hugging Face model directory (safetensors, sharded or not) or a GGUF file. "
                "Layer ranges (half-open START:END) pick the source layers of the prelude, the "
                "looped core and the coda; none = every layer as the core (with one loop: the "
                "original model). --out appears complete or not at all. Logged as the child "
                "run import of the run's MLflow parent run.")


def run(args: argparse.Namespace) -> int:
    if args.loops < 1:
        raise ConfigError(f"--loops {args.loops} must be at least 1")
    cfg = load_config(args.config, args.overrides)
    source = str(Path(args.source).expanduser().resolve())
    ranges = {part: list(parse_range(value, f"--{part}")) if value else []
              for part, value in (("prelude", args.prelude), ("core", args.core),
                                  ("coda", args.coda))}
    init = dataclasses.replace(cfg.model.init_from, source=source, adapter=args.adapter,
                               **ranges)
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, loops=args.loops, init_from=init),
        data=dataclasses.replace(cfg.data, tokenizer=dataclasses.replace(
            cfg.data.tokenizer, type="file", path=source)),
        tracking=dataclasses.replace(cfg.tracking,
                                     enabled=cfg.tracking.enabled and not args.no_track))
    # completed as a run's plan completes it (resolve_run's init_from step), not by resolve_run:
    # a bare import trains nothing (no token budget, exit-gate or distillation-teacher check)
    cfg, planned = resolve_init_from(cfg)
    run_dir = args.run_dir if args.run_dir is not None else run_dir_of(args.out)
    record = import_stage(cfg, planned, run_dir, args.out)
    print(json.dumps({"out": str(args.out), **record}))
    return 0
