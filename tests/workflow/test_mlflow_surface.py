"""The tiny pipeline (one variant) against a real `mlflow server --workers 1`, read back over
its REST API: the parent run carries the headline results (loss at step = H_eff, benchmark
scores with intervals, size and cost), the pack as a dataset input, the final snapshot as a
logged model of the train run, and a lifetime that follows the pipeline: FINISHED, FAILED
when a job fails, FINISHED again after the rerun, with the headline points still once."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mlflow_server import Server
from support.workflow_runs import snakemake

pytestmark = pytest.mark.slow

RUN = "solo"
TARGET = f"results/{RUN}/tracking_files/finished.json"


def _rest(base: str, endpoint: str, body: dict | None = None, **query: str) -> dict[str, Any]:
    url = f"{base}/api/2.0/mlflow/{endpoint}"
    if body is None:
        request = urllib.request.Request(f"{url}?{urllib.parse.urlencode(query)}")
    else:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def _runs(base: str, experiment_id: str) -> tuple[dict, dict[str, dict]]:
    """(parent, {stage: child}) of RUN."""
    runs = _rest(base, "runs/search", {"experiment_ids": [experiment_id], "max_results": 200,
                                       "filter": f"tags.`loopline.run` = '{RUN}'"})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    [parent] = [r for r, t in zip(runs, tags, strict=True) if t.get("loopline.role") == "parent"]
    children = {t["loopline.stage"]: r for r, t in zip(runs, tags, strict=True)
                if "loopline.stage" in t}
    return parent, children


def _history(base: str, run_id: str, key: str) -> list[tuple[int, float]]:
    metrics = _rest(base, "metrics/get-history", run_id=run_id, metric_key=key)["metrics"]
    return sorted((int(m.get("step", 0)), m["value"]) for m in metrics)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "server"
    root.mkdir()
    server = Server(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _check_results(base: str, run_dir: Path, parent: dict, children: dict[str, dict]) -> None:
    pid = parent["info"]["run_id"]
    heff = json.loads((run_dir / "eval" / "heff" / "step_0000010.json").read_text())
    assert _history(base, pid, "heff/final_loss") == sorted(
        (int(h), v) for h, v in heff["losses"].items())
    assert _history(base, pid, "heff/best_h_eff") == [(0, float(heff["best_h_eff"]))]
    bench = json.loads((run_dir / "bench" / "step_0000010.json").read_text())
    scores = bench["tasks"]["loopline_parity"]["h_eff"]
    assert _history(base, pid, "bench/loopline_parity/acc") == [
        (int(h), s["overall"]["acc"]) for h, s in sorted(scores.items())]
    assert _history(base, pid, "bench/loopline_parity/acc_ci_low") == [
        (int(h), s["overall_ci"]["acc"]["ci_low"]) for h, s in sorted(scores.items())]
    state = json.loads((run_dir / "snapshots" / "step_0000010" / "trainer_state.json").read_text())
    assert _history(base, pid, "train/tokens_seen") == [(0, state["tokens_seen"])]
    wall = sum(s["wall_before_save_s"] for s in state["segments"])
    assert _history(base, pid, "train/wall_time_s")[0][1] == pytest.approx(wall)
    [(_, params)] = _history(base, pid, "model/params")
    [(_, flops)] = _history(base, pid, "model/flops_per_token")
    assert params > 0 and flops > 2 * params / 2  # 2 FLOPs per weight, attention on top


def _check_depth_while_training(base: str, run_dir: Path, train: dict) -> None:
    """The train run's validation loss at every eval.h_eff, per validation step, over REST:
    what MLflow's chart view draws as the depth profile evolving with training."""
    logged = [json.loads(line) for line in (run_dir / "train" / "metrics.jsonl").open()]
    val_steps = [r for r in logged if any(k.startswith("val/loss_h") for k in r)]
    assert val_steps
    for h in (1, 2, 4):  # tiny.yaml's eval.h_eff
        key = f"val/loss_h{h}"
        history = _history(base, train["info"]["run_id"], key)
        assert [step for step, _ in history] == [r["step"] for r in val_steps], key
        assert [v for _, v in history] == pytest.approx([r[key] for r in val_steps]), key


def _check_lineage(base: str, experiment_id: str, run_dir: Path, parent: dict,
                   children: dict[str, dict]) -> None:
    data_dir = next(p for p in (run_dir.parent / "data").iterdir() if p.is_dir())
    meta = json.loads((data_dir / "metadata.json").read_text())
    for run in (parent, children["train"]):
        full = _rest(base, "runs/get", run_id=run["info"]["run_id"])["run"]
        [entry] = full["inputs"]["dataset_inputs"]
        assert entry["dataset"]["name"] == data_dir.name
        assert json.loads(entry["dataset"]["profile"])["num_tokens"] == meta["total_tokens"]
    models = _rest(base, "logged-models/search", {"experiment_ids": [experiment_id]})["models"]
    [model] = models
    info = model["info"]
    assert info["source_run_id"] == children["train"]["info"]["run_id"]
    assert info["name"] == f"{RUN}-step10" and info["status"].endswith("READY")
    tags = {t["key"]: t["value"] for t in info.get("tags", [])}
    assert tags["loopline.export_dir"] == str((run_dir / "export").absolute())
    params = {p["key"]: p["value"] for p in model["data"].get("params", [])}
    assert params["num_loops"] == "2"


def test_parent_run_is_the_comparison_surface(server: Server, tmp_path: Path) -> None:
    override = tmp_path / "surface.yaml"
    override.write_text(
        f"tracking: {{uri: '{server.base}'}}\n"
        "train: {total_steps: 10, steps_per_segment: 5}\n"
        "bench: {tasks: [loopline_parity], h_eff: [1, 2], examples_per_level: 2}\n"
        f"runs: {{{RUN}: {{model: {{loops: 2}}}}}}\n")
    work = tmp_path / "work"
    work.mkdir()
    result = snakemake(work, "--cores", "2", TARGET, extra_configs=(override,))
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = work / "results" / RUN
    base = server.base
    experiment_id = _rest(base, "experiments/get-by-name",
                          experiment_name="loopline-tiny")["experiment"]["experiment_id"]
    parent, children = _runs(base, experiment_id)
    info = parent["info"]
    assert info["status"] == "FINISHED"
    starts = [int(c["info"]["start_time"]) for c in children.values()]
    ends = [int(c["info"]["end_time"]) for c in children.values()]
    assert int(info["start_time"]) <= min(starts) and int(info["end_time"]) >= max(ends)
    _check_results(base, run_dir, parent, children)
    _check_lineage(base, experiment_id, run_dir, parent, children)
    _check_depth_while_training(base, run_dir, children["train"])

    # A job fails (the final snapshot's config no longer matches its manifest): FAILED.
    config = run_dir / "snapshots" / "step_0000010" / "config.yaml"
    original = config.read_bytes()
    config.write_bytes(original + b"\n# edited\n")
    failed = snakemake(work, "--cores", "1", TARGET, "--forcerun", "eval_heff",
                       extra_configs=(override,))
    assert failed.returncode != 0 and "MANIFEST" in failed.stderr, failed.stderr[-3000:]
    assert _runs(base, experiment_id)[0]["info"]["status"] == "FAILED"
    # Repaired and rerun: FINISHED again, later; the same sweep adds no headline point.
    config.write_bytes(original)
    rerun = snakemake(work, "--cores", "2", TARGET, "--forcerun", "eval_heff",
                      extra_configs=(override,))
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    again, children = _runs(base, experiment_id)
    assert again["info"]["status"] == "FINISHED"
    assert int(again["info"]["end_time"]) > int(info["end_time"])
    assert again["info"]["start_time"] == info["start_time"]
    _check_results(base, run_dir, again, children)
