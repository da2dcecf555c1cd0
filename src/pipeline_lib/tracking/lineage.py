"""Lineage in MLflow's own terms: the data pack as an ``mlflow.data`` dataset input, the final
snapshot as an MLflow 3 logged model of the ``train`` run.

Both are idempotent, so a retried stage and a replayed outbox add nothing:

- a dataset is identified by (name, digest) in its experiment and an input by (dataset,
  run); MLflow's ``log_inputs`` reuses both when they exist;
- a logged model is found by its tag ``loopline.key`` (the run directory's name, the
  snapshot's step and its manifest's digest) and completed if an earlier attempt stopped
  half-way: its metrics carry the model's creation time as their timestamp, so logging them
  again repeats identical points (which MLflow stores once); it is marked READY last.

The pack's dataset: name = ``data_id``; digest = sha256 of the packed arrays' hashes and
the tokenizer's; source = the pack directory and each corpus source's fingerprint; schema =
the token and document arrays; profile = token, document and row counts.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .commit import clean_params, clean_tags
from .runs import KEY_TAG
from .store import call

DATA_CONTEXT = "train"  # the input tag mlflow.data.context, shown beside the dataset
MODEL_TYPE = "loopline"
_RACE_ATTEMPTS = 3
_PROFILE_KEYS = ("layout", "seq_len", "vocab_size", "num_epochs", "rows_per_epoch",
                 "num_train_docs", "num_val_docs", "train_tokens_per_epoch", "val_tokens",
                 "fill_ratio", "split_docs")
_SOURCE_KEYS = ("type", "path", "fingerprint", "num_docs", "num_tokens", "weight")


def pack_digest(meta: Mapping[str, Any]) -> str:
    """A short content digest of a pack: its arrays' sha256s and its tokenizer's."""
    content = {"arrays": meta.get("arrays"), "tokenizer": meta.get("tokenizer_sha256")}
    if content["arrays"] is None:  # a pack without array hashes: its whole metadata
        content = dict(meta)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pack_schema(meta: Mapping[str, Any]) -> str:
    """MLflow's tensor-spec schema of the pack: all tokens back to back, (start, length)
    per document."""
    features = [
        {"type": "tensor", "name": "tokens",
         "tensor-spec": {"dtype": str(meta.get("token_dtype", "uint16")), "shape": [-1]}},
        {"type": "tensor", "name": "docs", "tensor-spec": {"dtype": "int64", "shape": [-1, 2]}},
    ]
    return json.dumps({"mlflow_tensorspec": {"features": json.dumps(features), "targets": None}})


def pack_dataset(meta: Mapping[str, Any], data_dir: Path) -> dict[str, str]:
    """The fields of the ``mlflow.entities.Dataset`` of a pack (``metadata.json`` as ``meta``)."""
    sources = [{k: s[k] for k in _SOURCE_KEYS if k in s} for s in meta.get("sources") or []]
    source = {"uri": Path(data_dir).absolute().as_uri(), "sources": sources}
    profile = {"num_tokens": meta.get("total_tokens"), "num_documents": meta.get("num_docs"),
               **{k: meta[k] for k in _PROFILE_KEYS if k in meta}}
    return {"name": str(meta.get("data_id") or Path(data_dir).name), "digest": pack_digest(meta),
            "source_type": "local", "source": json.dumps(source, sort_keys=True),
            "schema": pack_schema(meta), "profile": json.dumps(profile, sort_keys=True)}


def log_dataset(client: Any, run_id: str, dataset: Mapping[str, str],
                context: str = DATA_CONTEXT) -> None:
    """Attach ``dataset`` (fields of :func:`pack_dataset`) to the run as an input (idempotent)."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.exceptions import MlflowException  # mlflow: as above

    entity = Dataset(**{k: dataset.get(k) for k in ("name", "digest", "source_type", "source",
                                                    "schema", "profile")})
    inputs = [DatasetInput(entity, [InputTag("mlflow.data.context", context)])]
    for attempt in range(_RACE_ATTEMPTS):
        try:
            call(client.log_inputs, run_id, inputs, what="log dataset input")
            return
        except MlflowException as exc:
            # Variants sharing a pack log it at once: MLflow looks the dataset up, then
            # inserts it, so the slower job hits the unique (experiment, name, digest) key;
            # looked up again, the dataset is found.
            if "unique" not in str(exc).lower() or attempt == _RACE_ATTEMPTS - 1:
                raise


def find_model(client: Any, experiment_id: str, key: str) -> Any:
    """The logged model tagged ``loopline.key = key`` in the experiment, or None."""
    if "'" in key:
        raise ValueError(f"model key {key!r} contains a quote")
    found = call(client.search_logged_models, [experiment_id],
                 filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=1,
                 what="search logged models")
    return found[0] if found else None


def log_model(client: Any, experiment_id: str, run_id: str, spec: Mapping[str, Any],
              files: Sequence[Path]) -> str:
    """Find or create the logged model ``spec`` describes as an output of ``run_id``; return
    its id. ``spec``: name, key, step, params, tags, metrics ({key: value} at ``step``),
    dataset (name and digest the metrics were measured on, or None). ``files`` are uploaded
    as the model's artifacts."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric

    model = find_model(client, experiment_id, spec["key"])
    if model is None:
        model = call(client.create_logged_model, experiment_id, name=spec["name"],
                     source_run_id=run_id, model_type=MODEL_TYPE,
                     tags=clean_tags({**spec.get("tags", {}), KEY_TAG: spec["key"]}),
                     params=clean_params(spec.get("params", {})), what="create logged model")
    if model.status != LoggedModelStatus.READY:
        dataset = spec.get("dataset") or {}
        metrics = [Metric(k, float(v), model.creation_timestamp, int(spec["step"]),
                          model_id=model.model_id, dataset_name=dataset.get("name"),
                          dataset_digest=dataset.get("digest"))
                   for k, v in sorted(spec.get("metrics", {}).items())]
        if metrics:
            call(client.log_batch, run_id, metrics=metrics, what="log model metrics")
        _upload(client, model.model_id, files)
        call(client.finalize_logged_model, model.model_id, LoggedModelStatus.READY,
             what="finalize logged model")
    outputs = call(client.get_run, run_id, what="get run").outputs
    if model.model_id not in {o.model_id for o in (outputs.model_outputs if outputs else [])}:
        call(client.log_outputs, run_id, [LoggedModelOutput(model.model_id, int(spec["step"]))],
             what="log model output")
    return model.model_id


def _upload(client: Any, model_id: str, files: Sequence[Path]) -> None:
    """Upload ``files`` as the model's top-level artifacts (one directory upload)."""
    files = [Path(f) for f in files if Path(f).is_file()]
    if not files:
        return
    with tempfile.TemporaryDirectory(prefix="loopline-model-") as tmp:
        for path in files:
            shutil.copyfile(path, Path(tmp) / path.name)
        call(client.log_model_artifacts, model_id, tmp, what="log model artifacts")
