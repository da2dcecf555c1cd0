"""One run of the Snakefile's plan: its spec (and that spec's digest), its train signature,
its segment ends and where each segment's snapshot goes (kept or temporary).

Torch-free and cheap, like :mod:`pipeline_lib.workflow.plan`, which holds one per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..spec.config import Config
from ..spec.layout import RunLayout
from ..spec.retention import Retention, retention
from ..spec.run_spec import RunSpec, SpecRef
from ..spec.signatures import train_signature
from ..spec.snapshots import anchor_steps, segment_ends


@dataclass(frozen=True)
class RunPlan:
    """One variant of the experiment: its :class:`RunSpec` (the completed config), the
    digest of its spec file, its train signature, and the steps its segments end at and keep
    (:func:`pipeline_lib.spec.retention.retention`: the settings decide the snapshots not
    written yet)."""

    spec: RunSpec
    digest: str
    train_signature: str
    segment_ends: list[int]
    retention: Retention

    @classmethod
    def of(cls, spec: RunSpec, layout: RunLayout, digest: str | None = None) -> RunPlan:
        """The plan of ``spec``, whose run directory is ``layout``'s (read for the snapshots
        written); ``digest``: its spec file's, when read from one (else computed)."""
        cfg = spec.config
        ends = segment_ends(cfg.train.total_steps, cfg.train.steps_per_segment)
        signature = train_signature(cfg, spec.data_id, spec.vocab_size)
        return cls(spec=spec, digest=digest or spec.digest, train_signature=signature,
                   segment_ends=ends,
                   retention=retention(layout, ends, cfg.snapshots, signature))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def config(self) -> Config:
        return self.spec.config

    @property
    def data_id(self) -> str:
        return self.spec.data_id

    @property
    def spec_ref(self) -> SpecRef:
        """What a job of this run gets as ``params.spec``."""
        return SpecRef(self.name, self.digest)

    @property
    def kept_steps(self) -> list[int]:
        return self.retention.kept

    @property
    def final_step(self) -> int:
        return self.segment_ends[-1]

    @cached_property
    def anchor_steps(self) -> list[int]:
        """Temporary segment ends with an anchor target (long temporary chains only)."""
        return anchor_steps(self.segment_ends, self.kept_steps)

    @cached_property
    def previous_ends(self) -> dict[int, int | None]:
        """Each segment end's previous one (None for the first): one lookup per job."""
        return dict(zip(self.segment_ends, [None, *self.segment_ends[:-1]], strict=True))

    @cached_property
    def kept_set(self) -> frozenset[int]:
        return frozenset(self.kept_steps)

    def retention_notes(self) -> list[str]:
        """One line per way the kept snapshots differ from the settings (none when they
        agree): what a changed ``snapshots.keep_last``/``keep_every`` did not do."""
        notes, r = [], self.retention
        if r.lost:
            notes.append(f"run {self.name}: snapshots.keep_last/keep_every now keep step(s) "
                         f"{_steps(r.lost)}, written as temporary snapshots (deleted once the "
                         "next segment has read them): they cannot come back without "
                         "retraining, so they stay temporary and out of snapshots/index.json; "
                         "nothing retrains")
        if r.held:
            notes.append(f"run {self.name}: step(s) {_steps(r.held)} were written as kept "
                         "snapshots and stay kept (listed in snapshots/index.json), though "
                         "snapshots.keep_last/keep_every no longer keep them: the settings "
                         "decide only the snapshots written from now on")
        return notes


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (f" and {len(steps) - 10} more"
                                              if len(steps) > 10 else "")
