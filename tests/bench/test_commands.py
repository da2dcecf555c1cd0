"""The bench, summarize-bench and lm-eval stage commands through ``pipeline_lib.cli.main``."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline_lib.cli import main

pytestmark = pytest.mark.slow


def test_bench_and_summarize_commands(snapshot_dir, tmp_path, capsys):
    out = tmp_path / "bench" / "step_0000007.json"
    store = tmp_path / "mlflow.db"
    rc = main(["bench", "--snapshot", str(snapshot_dir), "--out", str(out), "--h-eff", "1,2",
               "bench.tasks=[loopline_parity]", "bench.examples_per_level=2",
               "bench.max_difficulty=2", "bench.adaptive.thresholds=[0]",
               f"tracking.uri=sqlite:///{store}", "--no-track"])
    assert rc == 0
    assert not store.exists()  # a plain local run contacts no store
    report = json.loads(out.read_text())
    assert report["step"] == 7 and report["h_eff"] == [1, 2]
    assert report["adaptive"] == ["adaptive:0:2"]  # MAX: the largest H_eff
    never = report["tasks"]["loopline_parity"]["adaptive"]["adaptive:0:2"]
    assert never["loops"]["mean"] == 2.0 and never["overall"]["acc"] == \
        report["tasks"]["loopline_parity"]["h_eff"]["2"]["overall"]["acc"]
    assert list(report["tasks"]) == ["loopline_parity"]
    assert sorted(report["tasks"]["loopline_parity"]["h_eff"]["2"]["levels"]) == ["1", "2"]
    assert (tmp_path / "bench" / "tasks" / "loopline_parity.jsonl").is_file()  # default tasks dir
    printed = capsys.readouterr().out
    assert "loopline_parity (acc)" in printed
    assert f"adaptive:0:2: {never['overall']['acc']:.3f} at 2.00 mean loops" in printed
    rc = main(["summarize-bench", "--inputs", str(out), "--out-parquet",
               str(tmp_path / "summary.parquet"), "--out-png", str(tmp_path / "acc.png"),
               "--no-track"])
    assert rc == 0
    assert (tmp_path / "summary.parquet").stat().st_size > 0
    assert (tmp_path / "acc.png").stat().st_size > 0


def test_bench_and_summarize_commands_track_their_stage_runs(snapshot_dir, tmp_path, capsys,
                                                             monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "results" / "base"  # the run the snapshot belongs to
    snap = shutil.copytree(snapshot_dir, run_dir / "snapshots" / snapshot_dir.name)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = [f"tracking.uri={uri}", "experiment.name=cli-bench"]
    out = run_dir / "bench" / "step_0000007.json"
    assert main(["bench", "--snapshot", str(snap), "--out", str(out), "--h-eff", "1",
                 "bench.tasks=[loopline_parity]", "bench.examples_per_level=2",
                 "bench.max_difficulty=2", *config]) == 0
    table, plot = run_dir / "bench" / "summary.parquet", run_dir / "bench" / "acc.png"
    assert main(["summarize-bench", "--inputs", str(out), "--out-parquet", str(table),
                 "--out-png", str(plot), "--run-dir", str(run_dir), *config]) == 0
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cli-bench").experiment_id
    parent = json.loads((run_dir / "tracking.json").read_text())["parent_run_id"]
    runs = {r.data.tags["loopline.stage"]: r for r in client.search_runs(
        [experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")}
    assert sorted(runs) == ["bench/step_0000007", "bench_summary"]
    bench = runs["bench/step_0000007"]
    acc = json.loads(out.read_text())["tasks"]["loopline_parity"]["h_eff"]["1"]["overall"]["acc"]
    assert bench.data.metrics["bench/loopline_parity/acc_h1"] == acc
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    capsys.readouterr()
    assert main(["summarize-bench", "--inputs", str(out), "--out-parquet", str(table),
                 "--out-png", str(plot), *config]) == 2  # tracking needs the run directory
    assert "--run-dir" in capsys.readouterr().err


def test_bench_command_errors_are_one_line(tmp_path, capsys):
    rc = main(["bench", "--snapshot", str(tmp_path / "nope"), "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "nope" in err


def test_lm_eval_passthrough_runs_loopline(snapshot_dir, bench_report, tmp_path, capsys):
    _, _, tasks_dir = bench_report
    rc = main(["lm-eval", "--model", "loopline", "--model_args",
               f"snapshot={snapshot_dir},h_eff=2,batch_size=4", "--tasks", "loopline_parity",
               "--include_path", str(tasks_dir), "--limit", "3", "--output_path",
               str(tmp_path / "out")])
    assert rc == 0
    (result_file,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(result_file.read_text())
    assert results["n-samples"]["loopline_parity"]["effective"] == 3
    assert 0.0 <= results["results"]["loopline_parity"]["acc,none"] <= 1.0
    assert results["config"]["h_eff"] == 2 and results["config"]["step"] == 7
    capsys.readouterr()
    rc = main(["lm-eval", "--model", "loopline", "--model_args", f"snapshot={snapshot_dir},h_eff=0",
               "--tasks", "loopline_parity", "--include_path", str(tasks_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and "error: loopline model_args h_eff=0" in err


def test_user_tasks_through_bench_and_lm_eval_commands(snapshot_dir, tmp_path, capsys,
                                                       monkeypatch):
    from user_task_helpers import write_user_tasks

    user = write_user_tasks(tmp_path / "my_tasks", level_field="level")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # relative data_files are next to the YAMLs
    out = tmp_path / "bench.json"
    rc = main(["bench", "--snapshot", str(snapshot_dir), "--out", str(out), "--h-eff", "2",
               "--include-path", str(user), "bench.tasks=[]", "--no-track"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert sorted(report["tasks"]) == ["my_echo", "my_pointer"]
    assert sorted(report["tasks"]["my_pointer"]["h_eff"]["2"]["levels"]) == ["1", "2"]
    assert "my_pointer (acc)" in capsys.readouterr().out
    rc = main(["lm-eval", "--model", "loopline", "--model_args",
               f"snapshot={snapshot_dir},h_eff=2,batch_size=4", "--tasks", "my_pointer",
               "--include_path", str(user), "--output_path", str(tmp_path / "out")])
    assert rc == 0
    (result_file,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(result_file.read_text())
    assert results["n-samples"]["my_pointer"]["effective"] == 4
    capsys.readouterr()
    rc = main(["lm-eval", "--model", "loopline", "--model_args", f"snapshot={snapshot_dir}",
               "--tasks", "my_pointer", "--include_path", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --include_path = ") and err.count("\n") == 1
