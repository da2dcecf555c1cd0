"""How a command is declared (:class:`Command`), the arguments several commands share, and
what they make of them."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.compat import snapshot_config
from ..errors import ConfigError
from ..output_paths import Output, OutputKind, check_outputs
from ..spec.config import Config
from ..spec.config_load import config_for_run, load_config
from ..spec.layout import run_dir_of
from ..spec.run_spec import RunSpec
from ..workflow.resolve import resolve_run, snapshot_run


@dataclass(frozen=True)
class Arg:
    """One argument of a command: ``add_argument(*flags, **options)``. An output (``kind``:
    an :class:`~pipeline_lib.output_paths.OutputKind` for a file, None for a directory) is
    a path that passes the output rule (:func:`check_command_paths`) before the command runs."""

    flags: tuple[str, ...]
    options: dict[str, Any]
    output: bool = False
    kind: OutputKind | None = None

    def add_to(self, parser: argparse.ArgumentParser, group: Any = None) -> None:
        action = (group or parser).add_argument(*self.flags, **self.options)
        if self.output:
            declared = [*(parser.get_default("_outputs") or ()),
                        (action.dest, self.flags[0], self.kind)]
            parser.set_defaults(_outputs=declared)


class OneOf(tuple):
    """Arguments of which a command line gives at most one (a mutually exclusive group)."""


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


def out(*flags: str, kind: OutputKind | None = None, **options: Any) -> Arg:
    """An output option (see :class:`Arg`)."""
    return Arg(flags, {"type": Path, **options}, output=True, kind=kind)


@dataclass(frozen=True)
class Command:
    """A command's declaration: its name, ``--help`` texts and arguments in order (an
    :class:`Arg`, a tuple of them, or a :class:`OneOf` group)."""

    name: str
    help: str
    args: tuple
    description: str | None = None
    add_help: bool = True

    def register(self, sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = sub.add_parser(self.name, help=self.help, description=self.description,
                                add_help=self.add_help)
        for item in self.args:
            group = parser.add_mutually_exclusive_group() if isinstance(item, OneOf) else None
            for one in (item,) if isinstance(item, Arg) else item:
                one.add_to(parser, group)
        return parser


# ``--config FILE`` (partial, merged over config/config.yaml; repeated, merged in order),
# ``--run`` and ``key=value`` overrides
CONFIG = (
    arg("--config", type=Path, action="append", default=None,
        help="YAML config (may be partial; merged over config/config.yaml); "
             "repeat to merge several in order, as snakemake --configfile A B"),
    arg("--run", default=None, help="apply the named variant from the config's runs: section"),
    arg("overrides", nargs="*", metavar="key=value",
        help="config overrides, e.g. train.lr=1e-3 model.loops=8"),
)
NO_TRACK = arg("--no-track", action="store_true",
               help="a plain local run: log nothing to MLflow (tracking.enabled=false)")
SNAPSHOT = arg("--snapshot", type=Path, required=True, help="snapshot directory")
DATA = arg("--data", type=Path, required=True, help="packed data directory")
TOKENIZER = arg("--tokenizer", type=Path, default=None,
                help="tokenizer.json to use instead of the snapshot's own")
# the end of the description of a command that reads a snapshot's config
OWN_CONFIG = "Without --config the snapshot's own config.yaml is used."


def tracking(joins: str, default: str = "the run the snapshot belongs to") -> tuple[Arg, Arg]:
    """``--run-dir`` (whose MLflow parent run ``joins`` the stage's child run; ``default``:
    the one without it) and ``--no-track``."""
    return (out("--run-dir", default=None,
                help=f"run directory whose MLflow parent run {joins} (default: {default})"),
            NO_TRACK)


# the summaries': no snapshot names their run
SUMMARY_TRACKING = (out("--run-dir", default=None,
                        help="run directory (results/<run>) whose MLflow parent run the "
                             "summary joins; required unless --no-track"), NO_TRACK)


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


def snapshot_setup(args: argparse.Namespace) -> tuple[Config, Path]:
    """A command on one snapshot: its config (:func:`config_from_args`; without ``--config``
    the snapshot's own) and run directory (``--run-dir``, else the one the snapshot is in)."""
    run_dir = args.run_dir if args.run_dir is not None else run_dir_of(args.snapshot)
    return config_from_args(args, snapshot=args.snapshot), run_dir


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
