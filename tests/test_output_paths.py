"""The output rule's pieces (pipeline_lib.output_paths, pipeline_lib.output_set): the kinds
recognise what the commands really write, the protected folders are named as their owners
name them, and an output set appears whole or not at all."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from pipeline_lib.errors import UsageError
from pipeline_lib.output_paths import (
    DEPTH_JSON,
    DEVICE_JSON,
    FIGURE,
    HEFF_JSON,
    TABLE,
    Output,
    check_outputs,
    protected_folder,
)
from pipeline_lib.output_set import output_set


def test_the_kinds_recognise_real_outputs_and_nothing_else(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_lib.compare import depth_check
    from pipeline_lib.diagnostics.runner import report_json
    from pipeline_lib.evaluate.heff import sweep_result

    (tmp_path / "h.json").write_text(json.dumps(sweep_result(4, {1: 2.0, 2: 1.9}, 10)))
    (tmp_path / "d.json").write_text(json.dumps(report_json([], {"device": "cpu"}, True)))
    (tmp_path / "c.json").write_text(json.dumps(depth_check([])))
    pq.write_table(pa.table({"a": [1]}), tmp_path / "t.parquet")
    for suffix in FIGURE.suffixes:
        fig = plt.figure()
        fig.savefig(tmp_path / f"f{suffix}")
        plt.close(fig)
    (tmp_path / "c.yaml").write_text("losses: 1\n")
    real = {HEFF_JSON: "h.json", DEVICE_JSON: "d.json", DEPTH_JSON: "c.json",
            TABLE: "t.parquet"}
    for kind, name in real.items():
        assert kind.recognise(tmp_path / name), name
        others = [k for k in real if k is not kind]
        assert not any(k.recognise(tmp_path / name) for k in others), name
    assert all(FIGURE.recognise(tmp_path / f"f{s}") for s in FIGURE.suffixes)
    assert not any(k.recognise(tmp_path / "c.yaml") for k in (*real, FIGURE))


def test_a_path_inside_a_snapshot_is_found_through_a_symbolic_link(tmp_path: Path) -> None:
    snap = tmp_path / "snapshots" / "step_1"
    snap.mkdir(parents=True)
    (snap / "MANIFEST.json").write_text("{}")
    (tmp_path / "snapshots" / "final").symlink_to("step_1")
    assert protected_folder(tmp_path / "snapshots" / "final" / "eval" / "x.json") == (
        "snapshot", snap)
    assert protected_folder(tmp_path / "snapshots" / "x.json") is None


def test_two_outputs_on_one_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--out-table and --out-plot are both"):
        check_outputs([Output(tmp_path / "a.png", "--out-table", FIGURE),
                       Output(tmp_path / "a.png", "--out-plot", FIGURE)])


def test_an_output_set_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    (tmp_path / "t.parquet").write_text("old table")
    with pytest.raises(RuntimeError):
        with output_set() as outputs:
            table = outputs.file(tmp_path / "t.parquet")
            outputs.file(tmp_path / "p.png")  # never written: the body fails first
            assert table.suffix == ".parquet" and table.parent == tmp_path
            table.write_text("new table")
            raise RuntimeError("the plot failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]
    assert (tmp_path / "t.parquet").read_text() == "old table"
    with output_set() as outputs:
        outputs.file(tmp_path / "t.parquet").write_text("new table")
        outputs.file(tmp_path / "sub" / "p.png").write_text("plot")
    assert (tmp_path / "t.parquet").read_text() == "new table"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["p.png", "sub", "t.parquet"]


def test_a_storage_failure_is_one_line_naming_the_output(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"cannot write {tmp_path / 'new' / 'x.json'}: No "
                                         "space left on device; free space there"):
        with output_set() as outputs:
            outputs.file(tmp_path / "new" / "x.json")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []  # the folder made for it is gone too
    with pytest.raises(FileNotFoundError):  # reading an input is not the output's failure
        with output_set() as outputs:
            outputs.file(tmp_path / "x.json")
            (tmp_path / "missing.json").read_text()
