"""A run's completed config, decided once per Snakemake call, stored under its digest and
read back, verified, by every job.

:class:`RunSpec` is what one run directory trains and evaluates: the ``runs:`` variant merged
over the other sections, the model section completed from ``model.init_from.source`` (and
what that source resolved to), ``train.total_steps`` filled in (the token budget decided),
the data pack's id and the vocabulary the tokenizer fixes before packing.
:func:`pipeline_lib.workflow.resolve.resolve_run` is the one function that makes one.

The contract between the plan and its jobs:

- **Content-addressed.** The workflow stores a spec as ``{run}/specs/{digest}.yaml``
  (:func:`write_run_spec`, before any job starts), ``digest`` being the start of the sha256
  of the file's text (:func:`spec_digest`). A file is never rewritten with other content, so
  no Snakemake call changes a spec that another call's jobs read (another run's call, or the
  same run's after a config change).
- **Named in the job's params.** Each job is given its run's digest (:class:`SpecRef`) by the
  plan that computed its signatures, and reads exactly that file (:func:`read_run_spec`).
- **Verified, never completed.** The text must hash to the digest (an edited or truncated
  file is refused), and its keys must be exactly the ones this code writes: a missing key is
  refused, never filled in with a dataclass default. Every refusal is one line naming the file
  and the fix.

The file holds the config as :func:`~pipeline_lib.spec.config_write.config_yaml` writes it:
without the credentials of ``tracking.uri``. A job puts them back from its own copy of the
config (:meth:`RunSpec.with_tracking_uri`), so no password reaches the run directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..credentials import redact_uri
from ..errors import ConfigError
from ..fsio import write_text_atomic
from .config import Config
from .config_load import config_from_dict
from .config_write import public_dict
from .layout import RunLayout

RUN_SPEC_FORMAT = 3  # 1: {run}/run_spec.yaml, rewritten by every call; 2: without init
DIGEST_CHARS = 16  # hex digits of the sha256 that name a spec file (64 bits)
SPEC_KEYS = ("format", "run", "data_id", "vocab_size", "init", "config")


def spec_digest(text: str) -> str:
    """The name of a spec file whose text is ``text``: its sha256, first 16 hex digits."""
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True)
class RunSpec:
    """One run's config, completed: what every stage of the run reads."""

    name: str  # the ``runs:`` variant ("default" without variants)
    config: Config  # variant merged, init_from applied, train.total_steps > 0; runs: {}
    data_id: str  # the data pack the run trains on (results/data/{data_id})
    vocab_size: int  # what the tokenizer fixes (byte, file; model.vocab_size 0 filled with it)
    # model.init_from.source as the plan resolved it: fingerprint, architecture, layers ({}: none)
    init: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_yaml(self) -> str:
        """The file :func:`read_run_spec` reads (``tracking.uri`` without credentials)."""
        doc = {"format": RUN_SPEC_FORMAT, "run": self.name, "data_id": self.data_id,
               "vocab_size": self.vocab_size, "init": self.init,
               "config": public_dict(self.config)}
        return yaml.safe_dump(doc, sort_keys=False)

    @property
    def digest(self) -> str:
        """The digest of :meth:`to_yaml`: the name of this spec's file."""
        return spec_digest(self.to_yaml())

    def with_tracking_uri(self, uri: str | None) -> RunSpec:
        """This spec with ``uri`` as its ``tracking.uri`` when ``uri`` names the same store
        (only its credentials differ); else unchanged."""
        tracking = self.config.tracking
        if not uri or uri == tracking.uri or redact_uri(uri) != tracking.uri:
            return self
        cfg = dataclasses.replace(self.config,
                                  tracking=dataclasses.replace(tracking, uri=uri))
        return dataclasses.replace(self, config=cfg)


@dataclass(frozen=True)
class SpecRef:
    """The spec a job runs (a rule's ``params.spec``): its run and digest.

    Deliberately not a plain value: Snakemake's params trigger leaves out params that are not
    builtins, so the digest, which changes with any key (``eval.*`` too), reruns nothing and
    records nothing; the signatures among the params decide what reruns, as before."""

    run: str
    digest: str

    def __str__(self) -> str:
        return self.digest


def spec_path(run_dir: str | Path, digest: str) -> Path:
    """Where the spec of digest ``digest`` lies (:meth:`~.layout.RunLayout.spec`)."""
    return RunLayout.at(run_dir).spec(digest)


def write_run_spec(spec: RunSpec, run_dir: str | Path) -> bool:
    """Store ``spec`` as ``{run_dir}/specs/{digest}.yaml`` (atomically: a reader sees the
    whole file or none) unless that file already holds it; returns whether it wrote. A file
    of that name with other text (damaged) is written again: its content is fixed by its name."""
    text = spec.to_yaml()
    path = spec_path(run_dir, spec_digest(text))
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, text, if_changed=True)


def read_run_spec(run_dir: str | Path, digest: str) -> RunSpec:
    """The spec of digest ``digest`` in ``{run_dir}/specs/``: its text hashed and its keys
    checked (see the module docstring); ConfigError, one line, when it is not that spec."""
    path = spec_path(run_dir, digest)
    again = "run snakemake again, which writes the spec of the config it plans"
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: the Snakemake call that planned this job "
                          "writes its specs before the first job (onstart), and a changed "
                          f"config is another spec; {again} (not with --no-hooks)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}); {again}") from None
    if spec_digest(text) != digest:
        raise ConfigError(f"{path} was changed after it was written (its text no longer has "
                          f"digest {digest}); delete it and {again}")
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{path} cannot be read ({problem}); delete it and {again}") from None
    return _spec_from_doc(doc, path, again)


def _spec_from_doc(doc: Any, path: Path, again: str) -> RunSpec:
    """The spec in ``doc`` (a parsed spec file) if its keys are exactly those this code
    writes; ConfigError naming the first key missing or unknown."""
    if not isinstance(doc, dict) or doc.get("format") != RUN_SPEC_FORMAT:
        raise ConfigError(f"{path} is not a run spec of format {RUN_SPEC_FORMAT} (written by "
                          f"other code); {again}")
    key = _key_difference(dict.fromkeys(SPEC_KEYS), doc)
    if key is None:
        try:
            cfg = config_from_dict(doc["config"], str(path))
            spec = RunSpec(name=str(doc["run"]), config=cfg, data_id=str(doc["data_id"]),
                           vocab_size=int(doc["vocab_size"]), init=dict(doc["init"]))
        except (ConfigError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path} is not a spec this code reads ({exc}); {again}") \
                from None
        key = _key_difference(public_dict(cfg), doc["config"], "config.")
        if key is None:
            return spec
    raise ConfigError(f"{path} {key}: a spec is complete as written, never completed with "
                      f"defaults; {again}")


def _key_difference(wanted: Mapping[str, Any], got: Any, prefix: str = "") -> str | None:
    """The first key that ``got`` lacks or has beyond ``wanted`` (mappings compared key by key,
    lists item by item), as ``lacks key K`` / ``has unknown key K``; None when they agree."""
    if isinstance(wanted, Mapping) and isinstance(got, Mapping):
        for key in wanted:
            if key not in got:
                return f"lacks key {prefix}{key}"
            inner = _key_difference(wanted[key], got[key], f"{prefix}{key}.")
            if inner:
                return inner
        extra = [k for k in got if k not in wanted]
        return f"has unknown key {prefix}{extra[0]}" if extra else None
    if isinstance(wanted, list) and isinstance(got, list) and len(wanted) == len(got):
        for i, (w, g) in enumerate(zip(wanted, got, strict=True)):
            inner = _key_difference(w, g, f"{prefix.rstrip('.')}[{i}].")
            if inner:
                return inner
    return None


__all__ = ["RUN_SPEC_FORMAT", "RunSpec", "SpecRef", "read_run_spec", "spec_digest",
           "spec_path", "write_run_spec"]
