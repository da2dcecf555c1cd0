"""Every output of every command, pointed where it must not write (issue 29, property-style).

The outputs are those the commands declare (:func:`pipeline_lib.commands._common.out`),
read from the parser, so a new command or option is covered without editing this file. Each
is pointed in turn at (a) a file inside a snapshot (its MANIFEST.json), (b) one of the
command's own inputs, (c) a place on a full tmpfs (mounted here when the machine allows it;
skipped with the reason otherwise). Every case must end in exit status 2 with one ``error:``
line and no traceback, before any work, with every file below the working tree (and on the
tmpfs) byte for byte as it was. The commands run in this process through
:func:`pipeline_lib.cli.main` (an exception escaping it fails the test).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.output_rule import SNAPSHOT, SWEEP, build_ready, hashes, refused, small_disk

from pipeline_lib.cli import build_parser


def _declared() -> dict[str, list]:
    """command → its declared outputs [(dest, flag, kind)]."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name: list(p.get_default("_outputs")) for name, p in sub.choices.items()
            if p.get_default("_outputs")}


DECLARED = _declared()
CASES = [(command, flag, kind) for command, outs in DECLARED.items() for _, flag, kind in outs]


def _base(root: Path) -> dict[str, tuple[list, tuple[str, Path]]]:
    """command → (a valid command line, one of its inputs as (flag, path))."""
    cfg, data, snap = root / "c.yaml", root / "data", root / SNAPSHOT
    return {
        "pack": (["pack", "--config", cfg, "--out", root / "p"], ("--config", cfg)),
        "train": (["train", "--config", cfg, "--data", data, "--resume-from", "none",
                   "--until-step", "4", "--out", root / "t" / "step_0000004", "--no-track"],
                  ("--data", data)),
        "snapshot-index": (["snapshot-index", snap, "--out", snap.parent / "index.json"],
                           ("snapshots", snap)),
        "heff": (["heff", "--snapshot", snap, "--data", data, "--out", root / "h.json",
                  "--no-track"], ("--snapshot", snap)),
        "trajectories": (["trajectories", "--snapshot", snap, "--data", data, "--out",
                          root / "traj", "--tokens", "4", "--no-track"], ("--data", data)),
        "summarize-heff": (["summarize-heff", "--inputs", root / SWEEP, "--out-table",
                            root / "h.parquet", "--out-plot", root / "h.png", "--no-track"],
                           ("--inputs", root / SWEEP)),
        "bench": (["bench", "--snapshot", snap, "--out", root / "b.json", "--no-track",
                   "--config", cfg], ("--config", cfg)),
        "summarize-bench": (["summarize-bench", "--inputs", root / SWEEP, "--out-parquet",
                             root / "b.parquet", "--out-png", root / "b.png", "--no-track"],
                            ("--inputs", root / SWEEP)),
        "export": (["export", "--snapshot", snap, "--out", root / "e"], ("--snapshot", snap)),
        "import-hf": (["import-hf", "--source", root / "no_model", "--out", root / "i"],
                      ("--source", root / "no_model")),
        "retrofit-plan": (["retrofit-plan", "--source", root / "no_model", "--data", data,
                           "--out", root / "rp"], ("--data", data)),
        "track-init": (["track-init", "--config", cfg, "--run-dir", root / "r", "--data", data,
                        "--no-track"], ("--data", data)),
        "compare": (["compare", root / "run", "--out", root / "cmp"], ("run_dirs", root / "run")),
        "results-doc": (["results-doc", "--results", root / "results", "--doc",
                         root / "README.md", "--docs", root / "docs"],
                        ("--results", root / "results")),
        "device-check": (["device-check", "--quick", "--only", "cross_entropy", "--out",
                          root / "dc.json", "--config", cfg], ("--config", cfg)),
        "device-results": (["device-results", "--report", root / SWEEP, "--doc",
                            root / "README.md"], ("--report", root / SWEEP)),
    }


def _with(argv: list, flag: str, path: Path) -> list:
    """``argv`` with ``flag`` set to ``path`` (replaced where it is given, else added)."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[:i + 1], path, *argv[i + 2:]]
    return [*argv, flag, path]


@pytest.fixture(scope="module")
def ready(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ready(tmp_path_factory.mktemp("output_property"))


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 64 KiB tmpfs filled to the last block (its filler file must not change)."""
    with small_disk(tmp_path_factory.mktemp("full_disk")) as disk:
        yield disk


def test_every_command_that_writes_declares_its_outputs() -> None:
    assert sorted(DECLARED) == sorted(_base(Path("/")))


@pytest.mark.parametrize(("command", "flag", "kind"), CASES,
                         ids=[f"{c}{f}" for c, f, _ in CASES])
@pytest.mark.parametrize("where", ["in_snapshot", "own_input", "full_disk"])
def test_an_output_where_it_must_not_go_is_one_line_and_changes_nothing(
        command, flag, kind, where, ready, request, capsys) -> None:
    argv, (in_flag, in_path) = _base(ready)[command]
    disk = request.getfixturevalue("full_disk") if where == "full_disk" else None
    suffix = kind.suffixes[0] if kind is not None else ""
    target, fragment = {
        "in_snapshot": (ready / SNAPSHOT / "MANIFEST.json",
                        f"lies inside the snapshot {ready / SNAPSHOT}"),
        "own_input": (in_path, f"is also the command's input {in_flag}"),
        "full_disk": (disk / f"out{suffix}" if disk else None,
                      f"no space left on the disk of {disk}"),
    }[where]
    before = hashes(ready), hashes(disk) if disk else None
    refused(_with(argv, flag, target), capsys, f"{flag} {target}", fragment)
    assert (hashes(ready), hashes(disk) if disk else None) == before
