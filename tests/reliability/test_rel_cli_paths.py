"""Every stage command with a bad path: exit status 2, one ``error:`` line, no traceback
(issue 21, property-style).

For each command of :data:`pipeline_lib.cli.COMMAND_MODULES` that reads or writes files
(``schema``, ``lm_eval``, ``device_check`` and ``device_results`` are left out: they print
or pass through, or need an accelerator), with minimal valid other arguments, three kinds
of bad path are given in turn: an output under a regular file (directly and with a missing
directory in between), an output in an unwritable place, and a missing input or a file
where a directory is expected. Tests run as root, which ignores permission bits, so the
unwritable place is ``/proc/self/…`` (access(2) denies root there; a chmod 0o500 directory
would not). The commands run in this process through :func:`pipeline_lib.cli.main` (a
subprocess per case would cost seconds of imports each); a traceback would be an
exception escaping ``main``, which fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline_lib.cli import COMMAND_MODULES, main

TESTED = ["pack", "train", "snapshot_index", "heff", "summarize_heff", "trajectories", "bench",
          "summarize_bench", "export", "import_hf", "retrofit_plan", "generate", "track_init", "sync_tracking",
          "compare", "results_doc"]
UNWRITABLE = Path("/proc/self/loopline")


@pytest.fixture(scope="module")
def ready(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack and a snapshot (four steps, no tracking), made with the commands themselves."""
    from support.output_rule import write_tiny_config

    root = tmp_path_factory.mktemp("cli_paths")
    cfg = write_tiny_config(root / "c.yaml", bench={"tasks": ["loopline_parity"], "h_eff": [1]},
                            tracking={"enabled": False})
    assert main(["pack", "--config", str(cfg), "--out", str(root / "data")]) == 0
    assert main(["train", "--config", str(cfg), "--data", str(root / "data"), "--resume-from",
                 "none", "--until-step", "4", "--out", str(root / "run" / "snapshots" /
                                                           "step_0000004"), "--no-track"]) == 0
    (root / "blocker").write_text("a regular file\n")
    (root / "README.md").write_text("# r\n<!-- results:begin -->\n<!-- results:end -->\n")
    return root


def _argv(command: str, root: Path, out: Path | None = None, src: Path | None = None
          ) -> list[str] | None:
    """The command line of ``command``: ``out`` replaces its output, ``src`` its input
    (None: a valid one); None when the command has no such path."""
    cfg, data = str(root / "c.yaml"), str(root / "data")
    snap = str(src or root / "run" / "snapshots" / "step_0000004")
    o = str(out) if out is not None else None
    s = str(src) if src is not None else None
    lines = {
        "pack": ["pack", "--config", s or cfg, "--out", o or str(root / "new_pack")],
        "train": ["train", "--config", cfg, "--data", s or data, "--resume-from", "none",
                  "--until-step", "4", "--out", o or str(root / "new" / "step_0000004"),
                  "--no-track"],
        "snapshot_index": ["snapshot-index", snap, "--out",
                           o or str(Path(snap).parent / "index.json")],
        "heff": ["heff", "--snapshot", snap, "--data", data, "--out", o or str(root / "h.json"),
                 "--no-track"],
        "trajectories": ["trajectories", "--snapshot", snap, "--data", data, "--out",
                         o or str(root / "traj"), "--tokens", "4", "--no-track"],
        "summarize_heff": ["summarize-heff", "--inputs", s or str(root / "h.json"),
                           "--out-table", o or str(root / "h.parquet"), "--out-plot",
                           str(root / "h.png"), "--no-track", "--config", cfg],
        "bench": ["bench", "--snapshot", snap, "--out", o or str(root / "b.json"),
                  "--no-track", "--config", cfg],
        "summarize_bench": ["summarize-bench", "--inputs", s or str(root / "b.json"),
                            "--out-parquet", o or str(root / "b.parquet"), "--out-png",
                            str(root / "b.png"), "--no-track", "--config", cfg],
        "export": ["export", "--snapshot", snap, "--out", o or str(root / "export")],
        "import_hf": ["import-hf", "--source", s or str(root / "no_model"), "--out",
                      o or str(root / "imported")],
        "retrofit_plan": ["retrofit-plan", "--source", s or str(root / "no_model"), "--data",
                          data, "--out", o or str(root / "plan")],
        "generate": None if out is not None else ["generate", "--snapshot", snap, "--prompt",
                                                   "a"],
        "track_init": ["track-init", "--config", cfg, "--run-dir", o or str(root / "run"),
                       "--data", s or data, "--no-track"],
        "sync_tracking": ["sync-tracking", "--config", cfg, "--run-dir",
                          s or str(root / "run"), "--uri",
                          f"sqlite:///{o or root / 'store.db'}"],
        "compare": ["compare", s or str(root / "run"), "--out", o or str(root / "cmp")],
        "results_doc": ["results-doc", "--results", s or str(root / "results"), "--doc",
                        o or str(root / "README.md"), "--docs", str(root / "docs")],
    }
    if command in ("import_hf",) and out is not None:
        return None  # its input check (the source) comes first: no valid source here
    return lines[command]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture, *named: str) -> str:
    rc = main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert rc == 2, (argv, captured.err[-2000:])
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert any(name in lines[0] for name in named), (named, lines[0])
    return lines[0]


def test_every_file_command_is_walked() -> None:
    skipped = {"schema", "lm_eval", "device_check", "device_results"}
    assert sorted(TESTED) == sorted(set(COMMAND_MODULES) - skipped)


@pytest.mark.parametrize("command", TESTED)
@pytest.mark.parametrize("where", ["under_a_file", "missing_dir_under_a_file", "unwritable"])
def test_output_in_a_place_that_cannot_hold_it(command: str, where: str, ready: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    base = {"under_a_file": ready / "blocker", "unwritable": UNWRITABLE,
            "missing_dir_under_a_file": ready / "blocker" / "missing"}[where]
    out = base / ("out.db" if command == "sync_tracking" else "out")
    argv = _argv(command, ready, out=out)
    if argv is None:
        pytest.skip(f"{command} writes no file")
    before = sorted(p.name for p in ready.iterdir())
    _one_line_error(argv, capsys, str(out), str(out.parent), str(ready / "blocker"),
                    "/proc/self")
    assert (ready / "blocker").read_text() == "a regular file\n"
    assert sorted(p.name for p in ready.iterdir()) == before  # nothing written beside


@pytest.mark.parametrize("command", TESTED)
@pytest.mark.parametrize("kind", ["missing", "file_for_directory"])
def test_input_that_is_missing_or_a_file(command: str, kind: str, ready: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    src = ready / "nothing_here" if kind == "missing" else ready / "blocker"
    if command == "pack" and kind == "file_for_directory":
        pytest.skip("pack's input is a config file")
    argv = _argv(command, ready, src=src)
    assert argv is not None
    before = sorted(p.name for p in ready.iterdir())
    _one_line_error(argv, capsys, str(src))
    assert sorted(p.name for p in ready.iterdir()) == before
