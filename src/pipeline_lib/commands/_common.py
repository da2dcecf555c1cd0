"""Arguments shared by several stage commands."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (partial, merged over config/config.yaml) and ``key=value`` overrides."""
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML config (may be partial; merged over config/config.yaml)")
    parser.add_argument("--run", default=None,
                        help="apply the named variant from the config's runs: section")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. train.lr=1e-3 model.loops=8")


def config_from_args(args: argparse.Namespace):
    """The resolved :class:`~pipeline_lib.config.Config` from the common arguments."""
    from ..config import config_for_run, load_config

    cfg = load_config(args.config, args.overrides)
    if args.run:
        cfg = config_for_run(cfg, args.run)
    return cfg
