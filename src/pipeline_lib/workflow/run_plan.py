"""One run of the Snakefile's plan: its spec (and that spec's digest), its train signature,
its segment ends and the segment ends whose snapshots are kept.

Torch-free and cheap, like :mod:`pipeline_lib.workflow.plan`, which holds one per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..spec.config import Config
from ..spec.layout import RunLayout
from ..spec.run_spec import RunSpec, SpecRef
from ..spec.signatures import train_signature
from ..spec.snapshots import anchor_steps, kept_steps, segment_ends


@dataclass(frozen=True)
class RunPlan:
    """One variant of the experiment: its :class:`RunSpec` (the completed config), the
    digest of its spec file, its train signature, and the steps its segments end at and keep."""

    spec: RunSpec
    digest: str
    train_signature: str
    segment_ends: list[int]
    kept_steps: list[int]

    @classmethod
    def of(cls, spec: RunSpec, layout: RunLayout, digest: str | None = None) -> RunPlan:
        """The plan of ``spec``, whose run directory is ``layout``'s; ``digest``: its spec
        file's, when read from one (else computed)."""
        cfg = spec.config
        ends = segment_ends(cfg.train.total_steps, cfg.train.steps_per_segment)
        return cls(spec=spec, digest=digest or spec.digest,
                   train_signature=train_signature(cfg, spec.data_id), segment_ends=ends,
                   kept_steps=kept_steps(ends, cfg.snapshots))

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
