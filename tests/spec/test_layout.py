"""The run layout: every path of a run from one place, and patterns for the Snakefile."""

from pathlib import Path

from pipeline_lib.spec.layout import (
    ResultsLayout,
    RunLayout,
    job_benchmark,
    job_benchmarks,
    job_log,
    run_dir_of,
    snapshots_dir_of,
    step_dir_name,
)


def test_run_paths() -> None:
    run = RunLayout(Path("results"), "loop4")
    assert run.run_dir == Path("results/loop4")
    assert run.snapshot(250) == Path("results/loop4/snapshots/step_0000250")
    assert run.snapshot(250, kept=False) == Path("results/loop4/snapshots/transient/step_0000250")
    assert (run.best, run.index) == (
        Path("results/loop4/snapshots/best"), Path("results/loop4/snapshots/index.json"))
    assert (run.metrics, run.spike_log, run.rollback_record, run.tensorboard) == (
        Path("results/loop4/train/metrics.jsonl"), Path("results/loop4/train/spike_events.jsonl"),
        Path("results/loop4/train/rollback.json"), Path("results/loop4/tensorboard"))
    assert (run.tracking_json, run.tracking_files, run.outbox, run.outbox_sync_state) == (
        Path("results/loop4/tracking.json"), Path("results/loop4/tracking_files"),
        Path("results/loop4/tracking_outbox.jsonl"),
        Path("results/loop4/tracking_outbox.sync.json"))
    assert run.heff_result(30) == Path("results/loop4/eval/heff/step_0000030.json")
    assert (run.heff_table, run.heff_plot, run.adaptive_table, run.adaptive_plot) == (
        Path("results/loop4/eval/heff.parquet"), Path("results/loop4/eval/heff.png"),
        Path("results/loop4/eval/heff_adaptive.parquet"),
        Path("results/loop4/eval/heff_adaptive.png"))
    assert (run.label_table, run.label_plot) == (
        Path("results/loop4/eval/heff_labels.parquet"), Path("results/loop4/eval/heff_labels.png"))
    assert run.bench_result(30) == Path("results/loop4/bench/step_0000030.json")
    assert run.bench_tasks(30) == Path("results/loop4/bench/tasks_step_0000030")
    assert (run.bench_table, run.bench_plot) == (
        Path("results/loop4/bench/summary.parquet"), Path("results/loop4/bench/accuracy_vs_heff.png"))


def test_results_paths() -> None:
    results = ResultsLayout(Path("out"))
    assert results.run("r") == RunLayout(Path("out"), "r")
    assert results.data_dir("0123456789ab") == Path("out/data/0123456789ab")
    assert results.compare_dir == Path("out/compare")
    assert results.tracking_marker == Path("out/.tracking/store.json")
    assert results.demo_time == Path("out/demo_time.json")
    assert RunLayout.at("out/r") == RunLayout(Path("out"), "r")


def test_best_and_index_sit_in_the_snapshots_dir() -> None:
    run = RunLayout(Path("r"), "x")
    assert (run.best.name, run.index.name) == ("best", "index.json")
    assert run.index.parent == run.best.parent == run.snapshots_dir


def test_wildcard_patterns() -> None:
    """A string step or run is a Snakemake wildcard and is used verbatim."""
    run = RunLayout(Path("results"), "{run}")
    assert step_dir_name(250) == "step_0000250" and step_dir_name("{step}") == "step_{step}"
    assert str(run.snapshot("{step}", kept=False)) == "results/{run}/snapshots/transient/step_{step}"
    assert str(run.heff_result("{step}")) == "results/{run}/eval/heff/step_{step}.json"
    assert str(run.log("train_segment", "{step}")) == "logs/train_segment/{run}/step_{step}.log"
    assert str(run.log("snapshot_index")) == "logs/snapshot_index/{run}.log"
    assert str(run.benchmark("train_segment", "{step}", kept=False)) == (
        "logs/benchmarks/train_segment/{run}/transient/step_{step}.tsv")
    assert job_log("compare_runs") == Path("logs/compare_runs.log")
    assert job_benchmark("pack_data", "{data_id}") == Path("logs/benchmarks/pack_data/{data_id}.tsv")


def test_job_benchmarks_found_under_logs(tmp_path: Path, monkeypatch) -> None:
    """Benchmark TSVs live under logs/benchmarks/{rule}/ (benchmarks/ holds scripts only)."""
    monkeypatch.chdir(tmp_path)
    run = RunLayout(Path("results"), "r")
    written = [run.benchmark("train_segment", 10, kept=False), run.benchmark("train_segment", 20),
               RunLayout(Path("results"), "other").benchmark("train_segment", 10)]
    for tsv in written:
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text("s\n1\n")
    assert run.benchmarks("train_segment") == sorted(written[:2])
    assert run.benchmarks("eval_heff") == []
    pack = job_benchmark("pack_data", "0123456789ab")
    pack.parent.mkdir(parents=True)
    pack.write_text("s\n1\n")
    assert job_benchmarks("pack_data", "0123456789ab") == [pack]
    assert not Path("benchmarks").exists()


def test_run_dir_of_a_snapshot() -> None:
    assert run_dir_of(Path("results/r/snapshots/step_0000100")) == Path("results/r")
    assert run_dir_of(Path("results/r/snapshots/transient/step_0000100")) == Path("results/r")
    assert run_dir_of(Path("x/out")) == Path("x")
    assert snapshots_dir_of(Path("results/r/snapshots/transient/step_0000100")) == Path(
        "results/r/snapshots")
    assert snapshots_dir_of(Path("x/out")) == Path("x")


def test_run_dirs_with(tmp_path: Path) -> None:
    results = ResultsLayout(tmp_path)
    for name in ("b", "a"):
        results.run(name).outbox.parent.mkdir(parents=True)
        results.run(name).outbox.write_text("")
    (tmp_path / "c").mkdir()
    assert results.run_dirs_with(results.run("a").outbox.name) == [tmp_path / "a", tmp_path / "b"]
