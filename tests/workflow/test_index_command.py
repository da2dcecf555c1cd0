"""``snapshot-index`` names each snapshot by its folder name, so the snapshots must lie
beside the index: anything else is one line, and nothing is written."""

from __future__ import annotations

from pathlib import Path

from pipeline_lib.cli import main


def test_snapshots_that_are_not_beside_the_index_are_one_line(tmp_path: Path, capsys) -> None:
    snap = tmp_path / "elsewhere" / "step_0000004"
    snap.mkdir(parents=True)
    out = tmp_path / "run" / "snapshots" / "index.json"
    out.parent.mkdir(parents=True)
    assert main(["snapshot-index", str(snap), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: snapshot {snap} is not in {out.parent}, the folder of the index "
                   f"{out}; pass the snapshots of one folder and an index beside them "
                   "(results/<run>/snapshots/index.json)\n")
    assert list(out.parent.iterdir()) == []
