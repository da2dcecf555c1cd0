"""Arguments shared by several stage commands."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (partial, merged over config/config.yaml; repeated, merged in order)
    and ``key=value`` overrides."""
    parser.add_argument("--config", type=Path, action="append", default=None,
                        help="YAML config (may be partial; merged over config/config.yaml); "
                             "repeat to merge several in order, as snakemake --configfile A B")
    parser.add_argument("--run", default=None,
                        help="apply the named variant from the config's runs: section")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. train.lr=1e-3 model.loops=8")


def add_tracking_args(parser: argparse.ArgumentParser, run_dir_help: str) -> None:
    """``--run-dir`` (whose MLflow parent run the stage's child run joins) and ``--no-track``."""
    add_output(parser, "--run-dir", default=None, help=run_dir_help)
    parser.add_argument("--no-track", action="store_true",
                        help="a plain local run: log nothing to MLflow (tracking.enabled=false)")


def config_from_args(args: argparse.Namespace, snapshot: Path | None = None):
    """The resolved :class:`~pipeline_lib.spec.config.Config` from the common arguments.

    With ``snapshot`` and no ``--config``, the snapshot's own resolved config.yaml is the
    base (complete already, so nothing is merged under it). ``--no-track`` (when the command
    has it) turns tracking off.
    """
    from ..spec.config import config_for_run, load_config

    if snapshot is not None and args.config is None:
        from ..checkpoint.compat import snapshot_config

        cfg = snapshot_config(snapshot, args.overrides,
                              fix="pass --config FILE or a complete snapshot directory")
    else:
        cfg = load_config(args.config, args.overrides)
    if args.run:
        cfg = config_for_run(cfg, args.run)
    if snapshot is None or args.config is not None:  # a snapshot's config is resolved already
        from ..export.hf_import import resolve_init_from

        cfg = resolve_init_from(cfg)
    if getattr(args, "no_track", False):
        cfg = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False))
    return cfg


def tracking_run_dir(args: argparse.Namespace, command: str) -> Path:
    """``--run-dir``; without it only a ``--no-track`` run may go on (nothing is logged)."""
    if args.run_dir is not None:
        return args.run_dir
    if args.no_track:
        return Path(".")  # tracking is off: the stage writes nothing there
    from ..errors import ConfigError

    raise ConfigError(f"{command} logs to the MLflow run of a run directory: pass --run-dir "
                      "results/<run>, or --no-track for a plain local run")


def add_output(parser: argparse.ArgumentParser, *flags: str, kind=None, **kwargs):
    """An output option (``kind``: an :class:`~pipeline_lib.output_paths.OutputKind` for a
    file, None for a directory). Declared outputs pass the output rule
    (:func:`check_command_paths`) before the command runs."""
    action = parser.add_argument(*flags, type=Path, **kwargs)
    declared = [*(parser.get_default("_outputs") or ()), (action.dest, flags[0], kind)]
    parser.set_defaults(_outputs=declared)
    return action


def check_command_paths(args: argparse.Namespace, labels: dict[str, str]) -> None:
    """:func:`pipeline_lib.output_paths.check_outputs` on the command's declared outputs,
    every other path argument counting as an input (``labels``: option string per dest)."""
    from ..output_paths import Output, check_outputs

    declared = getattr(args, "_outputs", None) or ()
    outputs = [Output(getattr(args, dest), flag, kind) for dest, flag, kind in declared
               if getattr(args, dest) is not None]
    mine = {dest for dest, _, _ in declared}
    inputs = []
    for dest, value in vars(args).items():
        if dest in mine or dest.startswith("_"):
            continue
        items = value if isinstance(value, list) else [value]
        if dest == "config":  # merging one file twice changes nothing: no refusal
            items = list(dict.fromkeys(items))
        inputs += [(labels.get(dest, dest), item) for item in items if isinstance(item, Path)]
    check_outputs(outputs, inputs)
