"""Single-file outputs own only what they made; outputs are checked before the work and
published as a set (issue 29, classes 3 and 4).

Class 3, the output rule for files (:mod:`pipeline_lib.output_paths`): never inside a
snapshot, a pack or an export, never one of the command's inputs, never an existing file
of another kind; an input named twice is refused. Class 4: an unsupported extension or a
parent that is a file is refused before any work, and a write that fails (a full disk:
here RLIMIT_FSIZE, which fails a write with EFBIG as a full disk fails it with ENOSPC) is
one line naming the output and leaves the previous outputs as they were, with no
temporary sibling (:mod:`pipeline_lib.output_set`). The property-style sweep over every
command is tests/reliability/test_rel_output_property.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.output_rule import SNAPSHOT, SWEEP, build_ready, hashes, refused, small_disk
from support.rel_messages import assert_one_line_error, entries, run_cli

from pipeline_lib.cli import main


@pytest.fixture(scope="module")
def ready(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ready(tmp_path_factory.mktemp("output_rule"))


def _heff(ready: Path, out: Path, *extra: str) -> list:
    return ["heff", "--snapshot", ready / SNAPSHOT, "--data", ready / "data", "--out", out,
            "--no-track", *extra]


# ---------------------------------------------------------------- class 3: what a file may replace


def test_heff_onto_a_snapshot_manifest_is_refused_and_the_snapshot_still_loads(ready, capsys):
    from pipeline_lib.checkpoint.manifest import verify_snapshot

    before = hashes(ready)
    refused(_heff(ready, ready / SNAPSHOT / "MANIFEST.json"), capsys,
            f"lies inside the snapshot {ready / SNAPSHOT}")
    assert hashes(ready) == before
    verify_snapshot(ready / SNAPSHOT)


def test_bench_onto_a_pack_metadata_is_refused(ready, capsys):
    before = hashes(ready)
    refused(["bench", "--snapshot", ready / SNAPSHOT, "--out", ready / "data" / "metadata.json",
             "--no-track", "--config", ready / "c.yaml"], capsys,
            f"lies inside the data pack {ready / 'data'}")
    assert hashes(ready) == before


@pytest.mark.parametrize("option", ["--out-table", "--out-plot"])
def test_summarize_heff_onto_its_own_input_is_refused(ready, capsys, option):
    outs = {"--out-table": ready / "h.parquet", "--out-plot": ready / "h.png",
            option: ready / SWEEP}
    before = hashes(ready)
    refused(["summarize-heff", "--inputs", ready / SWEEP, *[a for o, p in outs.items()
                                                           for a in (o, p)], "--no-track"],
            capsys, f"{option} {ready / SWEEP} is also the command's input --inputs")
    assert hashes(ready) == before


def test_a_tracking_store_inside_a_snapshot_is_refused(ready, capsys):
    before = hashes(ready)
    refused(["sync-tracking", "--config", ready / "c.yaml", "--uri",
             f"sqlite:///{ready / SNAPSHOT / 'store.db'}"], capsys,
            f"tracking store {ready / SNAPSHOT / 'store.db'} lies inside the snapshot")
    assert hashes(ready) == before


def test_heff_onto_a_users_yaml_or_json_is_refused_its_own_result_replaced(ready, tmp_path,
                                                                            capsys):
    (ready / "mine.json").write_text('{"my": "settings"}\n')
    before = hashes(ready)
    refused(_heff(ready, ready / "c.yaml", "--config", ready / "c.yaml"), capsys,
            "is also the command's input --config")
    refused(_heff(ready, ready / "notes.yaml"), capsys, "notes.yaml must end in .json")
    refused(_heff(ready, ready / "mine.json"), capsys,
            'mine.json exists and is not an H_eff sweep result (JSON with "losses")',
            "remove that file by hand")
    assert hashes(ready) == before
    (ready / "mine.json").unlink()
    out = tmp_path / "h.json"  # its own earlier result, or an empty file, it replaces
    out.touch()
    for _ in range(2):
        assert main([str(a) for a in _heff(ready, out)]) == 0
        assert json.loads(out.read_text())["step"] == 4
    assert entries(tmp_path) == ["h.json"]


def test_an_input_named_twice_or_a_copy_is_refused(ready, tmp_path, capsys):
    (tmp_path / "link").symlink_to(ready / "run")  # one run directory under two names
    copy = tmp_path / "copy.json"
    shutil.copyfile(ready / SWEEP, copy)
    outs = ["--out-table", tmp_path / "h.parquet", "--out-plot", tmp_path / "h.png",
            "--no-track"]
    refused(["summarize-heff", "--inputs", ready / SWEEP, ready / SWEEP, *outs], capsys,
            f"--inputs names {ready / SWEEP} twice", "pass each once")
    refused(["compare", ready / "run", tmp_path / "link", "--out", tmp_path / "cmp"], capsys,
            f"run_dirs names {tmp_path / 'link'} twice (as {ready / 'run'} and")
    refused(["summarize-heff", "--inputs", ready / SWEEP, copy, *outs], capsys,
            "are sweeps of the same snapshot (step 4)")
    assert entries(tmp_path) == ["copy.json", "link"]


# ---------------------------------------------------------------- class 4: checked first, written as a set


def test_an_unsupported_plot_extension_is_refused_before_the_table(ready, tmp_path, capsys):
    refused(["summarize-heff", "--inputs", ready / SWEEP, "--out-table", tmp_path / "h.parquet",
             "--out-plot", tmp_path / "x.txt", "--no-track"], capsys,
            f"--out-plot {tmp_path / 'x.txt'} must end in .png or .svg or .pdf")
    assert entries(tmp_path) == []


def test_device_check_out_under_a_file_is_refused_before_the_first_check(tmp_path, capsys):
    (tmp_path / "blocker").write_text("keep\n")
    line = refused(["device-check", "--quick", "--only", "cross_entropy", "--out",
                    tmp_path / "blocker" / "out.json"], capsys,
                   f"{tmp_path / 'blocker'} is a file, not a directory")
    assert "cross_entropy" not in line
    assert entries(tmp_path) == ["blocker"] and (tmp_path / "blocker").read_text() == "keep\n"


def _previous(ready: Path, tmp_path: Path) -> tuple[list, dict[str, str]]:
    """summarize-heff's arguments into ``tmp_path`` and the hashes of its first outputs."""
    argv = ["summarize-heff", "--inputs", ready / SWEEP, "--out-table", tmp_path / "h.parquet",
            "--out-plot", tmp_path / "h.png", "--no-track", "--title", "first"]
    assert main([str(a) for a in argv]) == 0
    return argv, hashes(tmp_path)


def test_summarize_heff_on_a_full_disk_keeps_the_previous_table_and_plot(ready, tmp_path):
    argv, before = _previous(ready, tmp_path)
    # the table (a few KiB) fits, the figure (tens of KiB) does not: a half set before
    result = run_cli(tmp_path, *argv[:-1], "second", limit_file_bytes=12_000)
    assert_one_line_error(result, "cannot write", str(tmp_path / "h.parquet"),
                          str(tmp_path / "h.png"), "File too large", "nothing was published")
    assert hashes(tmp_path) == before  # both as they were, no temporary sibling


def test_heff_on_a_full_disk_is_one_line_naming_the_output(ready, tmp_path):
    out = tmp_path / "h.json"
    shutil.copyfile(ready / SWEEP, out)
    result = run_cli(tmp_path, *_heff(ready, out), limit_file_bytes=300)
    assert_one_line_error(result, f"cannot write {out}", "File too large")
    assert entries(tmp_path) == ["h.json"]
    assert out.read_bytes() == (ready / SWEEP).read_bytes()


def test_compare_on_a_full_disk_keeps_the_previous_comparison(tmp_path):
    from test_compare import depth_results

    runs = depth_results(tmp_path / "results")
    out = tmp_path / "cmp"
    first = run_cli(tmp_path, "compare", *runs.values(), "--out", out)
    assert first.returncode == 0, first.stderr
    before = hashes(out)
    result = run_cli(tmp_path, "compare", *runs.values(), "--out", out,
                     limit_file_bytes=20_000)
    assert_one_line_error(result, "cannot write", "File too large", "nothing was published")
    assert hashes(out) == before
    assert [n for n in entries(tmp_path) if n.startswith(".")] == []


def test_export_onto_a_disk_that_fills_is_one_line_and_leaves_nothing(ready, tmp_path):
    """The weights (45 KiB) do not fit the 24 KiB left: safetensors' own error was a
    traceback."""
    with small_disk(tmp_path / "disk", free_kib=24) as disk:
        result = run_cli(tmp_path, "export", "--snapshot", ready / SNAPSHOT, "--out",
                         disk / "e")
        assert_one_line_error(result, f"cannot write export {disk / 'e'}",
                              "No space left on device", "nothing was published")
        assert entries(disk) == ["filler"]


def test_a_full_disk_outside_an_output_set_is_one_line_naming_the_file(tmp_path):
    """results-doc copies the comparison's figures (tens of KiB each) into --docs: a write
    failure there, outside any output set, is the CLI's one storage line, not a traceback."""
    from test_compare import depth_results

    from pipeline_lib.compare import compare_runs, run_dir_inputs

    results = tmp_path / "results"
    runs = depth_results(results)
    compare_runs({n: run_dir_inputs(d) for n, d in runs.items()}, results / "compare")
    page = tmp_path / "README.md"
    page.write_text("# r\n<!-- results:begin -->\n<!-- results:end -->\n")
    result = run_cli(tmp_path, "results-doc", "--results", results, "--doc", page, "--docs",
                     tmp_path / "docs", limit_file_bytes=20_000)
    line = assert_one_line_error(result, f"cannot write {tmp_path / 'docs'}", "File too large",
                                 "free space there")
    assert line.split(":")[1].strip().endswith(".png"), line
