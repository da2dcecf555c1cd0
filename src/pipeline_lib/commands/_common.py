"""Arguments shared by several stage commands."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..checkpoint.compat import snapshot_config
from ..errors import ConfigError
from ..output_paths import Output, check_outputs
from ..spec.config import Config
from ..spec.config_load import config_for_run, load_config
from ..spec.run_spec import RunSpec
from ..workflow.resolve import resolve_run, snapshot_run


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


def run_spec_from_args(args: argparse.Namespace, snapshot: Path | None = None) -> RunSpec:
    """The run's :class:`~pipeline_lib.spec.run_spec.RunSpec` from the common arguments,
    completed by the same :func:`~pipeline_lib.workflow.resolve.resolve_run` as the
    workflow's (``--run``: the variant; without it the base sections).

    With ``snapshot`` and no ``--config``, the snapshot's own config.yaml is the spec's
    config (completed already: nothing is merged under it or resolved again). ``--no-track``
    (when the command has it) turns tracking off.
    """
    if snapshot is not None and args.config is None:
        cfg = snapshot_config(snapshot, args.overrides,
                              fix="pass --config FILE or a complete snapshot directory")
        spec = snapshot_run(config_for_run(cfg, args.run) if args.run else cfg, args.run)
    else:
        spec = resolve_run(load_config(args.config, args.overrides), args.run or None)
    if getattr(args, "no_track", False):
        cfg = spec.config
        cfg = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False))
        spec = dataclasses.replace(spec, config=cfg)
    return spec


def config_from_args(args: argparse.Namespace, snapshot: Path | None = None) -> Config:
    """The completed config of :func:`run_spec_from_args`."""
    return run_spec_from_args(args, snapshot).config


def tracking_run_dir(args: argparse.Namespace, command: str) -> Path:
    """``--run-dir``; without it only a ``--no-track`` run may go on (nothing is logged)."""
    if args.run_dir is not None:
        return args.run_dir
    if args.no_track:
        return Path(".")  # tracking is off: the stage writes nothing there
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
