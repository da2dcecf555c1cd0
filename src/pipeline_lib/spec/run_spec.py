"""A run's completed config, decided once per Snakemake call and read by every job.

:class:`RunSpec` is what one run directory trains and evaluates: the ``runs:`` variant merged
over the other sections, the model section completed from ``model.init_from.source``,
``train.total_steps`` filled in (the token budget decided), the data pack's id and the
vocabulary the plan counted with. :func:`pipeline_lib.workflow.resolve.resolve_run` is the
one function that makes one; the workflow writes it to ``{run}/run_spec.yaml``
(:func:`write_run_spec`) before any job starts, and each job reads it back
(:func:`read_run_spec`) instead of planning the experiment again.

The file holds the config as :func:`~pipeline_lib.config.config_yaml` writes it: without the
credentials of ``tracking.uri``. A job puts them back from its own copy of the config
(:meth:`RunSpec.with_tracking_uri`), so no password reaches the run directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..credentials import redact_uri
from ..errors import ConfigError
from ..fsio import write_text_atomic
from .config import Config, config_from_dict, public_dict
from .layout import RunLayout

RUN_SPEC_FORMAT = 1


@dataclass(frozen=True)
class RunSpec:
    """One run's config, completed: what every stage of the run reads."""

    name: str  # the ``runs:`` variant ("default" without variants)
    config: Config  # variant merged, init_from applied, train.total_steps > 0; runs: {}
    data_id: str  # the data pack the run trains on (results/data/{data_id})
    vocab_size: int  # the vocabulary planned before packing (model.vocab_size when set)

    def to_yaml(self) -> str:
        """The file :func:`read_run_spec` reads (``tracking.uri`` without credentials)."""
        doc = {"format": RUN_SPEC_FORMAT, "run": self.name, "data_id": self.data_id,
               "vocab_size": self.vocab_size, "config": public_dict(self.config)}
        return yaml.safe_dump(doc, sort_keys=False)

    def with_tracking_uri(self, uri: str | None) -> RunSpec:
        """This spec with ``uri`` as its ``tracking.uri`` when ``uri`` names the same store
        (only its credentials differ); else unchanged."""
        tracking = self.config.tracking
        if not uri or uri == tracking.uri or redact_uri(uri) != tracking.uri:
            return self
        cfg = dataclasses.replace(self.config,
                                  tracking=dataclasses.replace(tracking, uri=uri))
        return dataclasses.replace(self, config=cfg)


def run_spec_path(run_dir: str | Path) -> Path:
    """Where the run's spec lies (:attr:`~.layout.RunLayout.run_spec`)."""
    return RunLayout.at(run_dir).run_spec


def write_run_spec(spec: RunSpec, run_dir: str | Path) -> bool:
    """Write ``spec`` to ``{run_dir}/run_spec.yaml`` atomically (a reader sees the old file or
    the new one, never half of one) when its text changed; returns whether it wrote."""
    path, text = run_spec_path(run_dir), spec.to_yaml()
    try:
        if path.read_text() == text:
            return False  # unchanged: its mtime stays
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    return True


def read_run_spec(run_dir: str | Path) -> RunSpec:
    """The spec in ``{run_dir}/run_spec.yaml``; ConfigError (one line) when it is missing
    or not a spec this code wrote."""
    path = run_spec_path(run_dir)
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: Snakemake writes it before the first job "
                          "of the run (its onstart handler); run the job through snakemake, "
                          "not with --no-hooks") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{path} cannot be read ({problem}); delete it and rerun snakemake, "
                          "which writes it again") from None
    if not isinstance(doc, dict) or doc.get("format") != RUN_SPEC_FORMAT:
        raise ConfigError(f"{path} is not a run spec of format {RUN_SPEC_FORMAT}; delete it "
                          "and rerun snakemake, which writes it again")
    try:
        return RunSpec(name=str(doc["run"]), config=config_from_dict(doc["config"], str(path)),
                       data_id=str(doc["data_id"]), vocab_size=int(doc["vocab_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} lacks or mangles {exc}; delete it and rerun snakemake, "
                          "which writes it again") from None


__all__ = ["RunSpec", "read_run_spec", "run_spec_path", "write_run_spec"]
