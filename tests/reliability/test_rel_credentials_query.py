"""A secret in any part of the tracking URI is used, never written (issue 39, class 6).

Besides the userinfo (``test_rel_credentials.py``), a store URI can carry a secret in its
query (``postgresql://db/mlflow?password=…``, ``…?token=…``, ``…?sig=…``). The worst case
runs a real Snakemake pipeline against a real SQLite store whose URI carries two tokens in
its query (SQLAlchemy reads the query as driver options and ignores these), then searches
every file under the working directory (the run directory, the store and its artifacts,
the job logs, ``.snakemake`` with its metadata of params) and every file name for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.credentials_helpers import AuthServer, files_containing, free_port, mlflow_env, run_cli
from support.workflow_runs import snakemake

from pipeline_lib.credentials import error_line, redact_config, redact_text, redact_uri
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.config_write import config_hash
from pipeline_lib.tracking.store import normalize_uri, probe, sqlite_path

TOKENS = ("tok-S3CRET-q1", "sig-S3CRET-q2")


@pytest.fixture(autouse=True)
def _clean_env() -> Iterator[None]:
    with mlflow_env():
        yield


def _leaks(root: Path) -> list[Path]:
    """Files under ``root`` holding a token, and paths whose name holds one."""
    named = [p for p in root.rglob("*") if any(t in p.name for t in TOKENS)]
    return sorted({*named, *(hit for t in TOKENS for hit in files_containing(root, t))})


def test_every_credential_bearing_part_is_redacted() -> None:
    """Userinfo dropped; every query value and a fragment replaced; the rest kept, so the
    redacted URI still names the store and is the same whatever the credentials."""
    cases = {
        "http://u:pw@h:5000/?token=abc": "http://h:5000/?token=***",
        "postgresql://u:pw@db:5432/m?sslmode=require&password=x":
            "postgresql://db:5432/m?sslmode=***&password=***",
        "sqlite:////r/mlflow.db?token=abc": "sqlite:////r/mlflow.db?token=***",
        "https://h/prefix?abc123": "https://h/prefix?***",  # a bare value
        "https://h/p?a=&b=1#frag": "https://h/p?a=&b=***#***",
        "http://u:pw@[::1/?token=abc": "http://[::1/?***",  # unparsable: cut all the same
        "sqlite:///results/mlflow.db": "sqlite:///results/mlflow.db",
        "databricks://profile": "databricks://profile",
    }
    assert {uri: redact_uri(uri) for uri in cases} == cases
    assert all(redact_uri(out) == out for out in cases.values())  # idempotent
    assert redact_uri("http://h/?token=a") == redact_uri("http://v:w@h/?token=b")
    text = "can't open 'sqlite:////x.db?token=abc' (see http://u:pw@h/?sig=d): x?"
    assert redact_text(text) == "can't open 'sqlite:////x.db?token=***' (see http://h/?sig=***): x?"
    assert error_line(RuntimeError("at http://h/?token=abc\ntraceback")) == "at http://h/?token=***"
    with_token = load_config(None, ["tracking.uri=sqlite:///m.db?token=abc"])
    without = load_config(None, ["tracking.uri=sqlite:///m.db?token=other"])
    assert redact_config({"tracking": {"uri": with_token.tracking.uri}}) == {
        "tracking": {"uri": "sqlite:///m.db?token=***"}}
    assert config_hash(with_token) == config_hash(without)  # credentials are not config


def test_a_sqlite_query_is_no_part_of_the_file_name() -> None:
    uri = normalize_uri("sqlite:///results/mlflow.db?token=abc")
    assert uri == f"sqlite:///{Path('results/mlflow.db').absolute()}?token=abc"  # for MLflow
    assert sqlite_path(uri) == Path("results/mlflow.db").absolute()


def test_probe_appends_health_to_the_path_and_keeps_the_query() -> None:
    """A server under a path prefix answers /health there; a query that authenticates
    goes with it. The reason names the URL with the token redacted."""
    with AuthServer(token="another") as server:
        reason = probe(f"{server.base}/mlflow/?token={TOKENS[0]}")
        (path, _, _), = server.requests
    assert path == f"/mlflow/health?token={TOKENS[0]}"  # not /mlflow/?token=…/health
    assert reason is not None and reason.startswith(
        f"{server.base}/mlflow/health?token=*** answered HTTP 401: credentials are needed")


def test_a_server_uri_with_a_query_is_refused_in_one_line_without_the_token(
        tmp_path: Path) -> None:
    """MLflow's client appends its API paths after a query (…?token=x/api/2.0/…), so no
    call would reach the API: refused before anything is written, the token not shown."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.json").write_text(json.dumps({"data_id": "d0", "num_docs": 3}))
    uri = f"http://127.0.0.1:{free_port()}/?token={TOKENS[0]}"
    for env, args in (({}, [f"tracking.uri={uri}"]), ({"MLFLOW_TRACKING_URI": uri}, [])):
        done = run_cli(["track-init", "--run-dir", str(tmp_path / "results" / "r"), "--data",
                        str(data), *args], cwd=tmp_path, env=env)
        assert done.returncode == 2, done.stdout[-3000:]
        assert done.stdout.splitlines() == [
            f"error: tracking.uri = '{uri.replace(TOKENS[0], '***')}' has a query or fragment, "
            "which MLflow's client cannot send: it appends its API paths after them, so no "
            "request would reach the server's API; leave them out and give a token as "
            "MLFLOW_TRACKING_TOKEN (a bearer header), or a user and password as "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD or user:password@ in the "
            "URI (basic auth)"]
    assert not (tmp_path / "results" / "r" / "tracking.json").exists()
    assert _leaks(tmp_path) == []


def test_track_init_with_a_token_in_a_sqlite_query_writes_it_nowhere(tmp_path: Path) -> None:
    """The real store is opened with the URI as given (the parent run is created in it);
    tracking.json, the params, the config artifact, the lock file's name and the output
    hold the redacted URI only."""
    from mlflow import MlflowClient

    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.json").write_text(json.dumps({"data_id": "d0", "num_docs": 3}))
    db = tmp_path / "store" / "mlflow.db"
    query = f"?token={TOKENS[0]}&sig={TOKENS[1]}"
    done = run_cli(["track-init", "--run-dir", "results/r", "--data", str(data),
                    f"tracking.uri=sqlite:///{db}{query}"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    shown = f"sqlite:///{db}?token=***&sig=***"
    info = json.loads((tmp_path / "results" / "r" / "tracking.json").read_text())
    assert info["tracking_uri"] == shown and not info["parent_run_id"].startswith("local:")
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlartifacts", "mlflow.db",
                                                           "mlflow.db.lock"]
    parent = MlflowClient(f"sqlite:///{db}").get_run(info["parent_run_id"])
    assert parent.data.params["tracking.uri"] == shown
    assert not any(t in done.stdout for t in TOKENS)
    assert _leaks(tmp_path) == []


CONFIG = {
    "experiment": {"name": "loopline-secret-query"},
    "data": {"sources": [{"type": "reasoning", "num_docs": 120, "max_difficulty": 2}],
             "seq_len": 32, "epochs": 1, "val_fraction": 0.1},
    "model": {"d_model": 16, "n_heads": 2, "loops": 2},
    "train": {"total_steps": 2, "steps_per_segment": 2, "global_batch_rows": 4,
              "micro_batch_rows": 4, "warmup_steps": 1, "eval_interval": 2, "eval_rows": 4,
              "diagnostics_interval": 0, "sample_tokens": 0, "spike": {"warmup_steps": 1}},
    "eval": {"h_eff": [1, 2], "max_tokens": 256},
    "runs": {"solo": {}},
}


@pytest.mark.slow
def test_a_pipeline_with_tokens_in_the_store_query_writes_them_nowhere(tmp_path: Path) -> None:
    """Pack, store, parent run, a training segment, the parent's config update and an
    H_eff sweep under Snakemake, tracked into the real store: only the user's own config
    file holds the tokens afterwards."""
    from mlflow import MlflowClient

    work = tmp_path / "work"
    work.mkdir()
    db = work / "results" / "store" / "mlflow.db"
    query = f"?token={TOKENS[0]}&sig={TOKENS[1]}"
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "tracking": {
        "uri": f"sqlite:///results/store/mlflow.db{query}"}}))
    done = snakemake(work, "--cores", "2", "results/solo/tracking_files/parent.json",
                     "results/solo/eval/heff/step_0000002.json", config=config)
    assert done.returncode == 0, done.stderr[-5000:]
    assert not any(t in done.stdout + done.stderr for t in TOKENS)
    assert (work / ".snakemake" / "metadata").is_dir() and any((work / "logs").rglob("*.log"))
    config.unlink()  # the user's own file: the one place the tokens belong
    assert _leaks(work) == []
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name(
        "loopline-secret-query").experiment_id])
    stages = sorted(r.data.tags.get("loopline.stage", "parent") for r in runs)
    assert stages == ["eval_heff/step_0000002", "pack", "parent", "train"], stages
    assert {r.data.params.get("tracking.uri") for r in runs} == {
        None, "sqlite:///results/store/mlflow.db?token=***&sig=***"}  # parent and train
