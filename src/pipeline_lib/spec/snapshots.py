"""Snapshot policy: where segments end, which segment snapshots are kept.

Everything here is known before training starts and is computed from the config alone, so
the Snakefile can declare the kept snapshots as outputs and the others as ``temp()`` ones
(deleted once the next segment consumed them). Torch-free: Snakemake imports this on every
call, dry runs included.

Long runs of temporary snapshots get *anchors* (:func:`anchor_steps`): Snakemake resolves
every target's dependencies recursively, so a chain of thousands of segments behind one
target would exceed Python's recursion limit; with a target every :data:`ANCHOR_SEGMENTS`
segments at most, each chain it resolves is short.

``snapshots.keep_best`` cannot be decided in advance; training jobs maintain
``snapshots/best`` themselves (:func:`pipeline_lib.checkpoint.best.update_best_snapshot`).
"""

from __future__ import annotations

from ..errors import ConfigError
from .config import SnapshotsConfig

# The longest run of temporary segments between two planned targets: Snakemake's DAG
# resolution nests about two Python frames per segment, and the default recursion limit of
# 1000 is met near 480 segments; 100 leaves room and costs one tiny job per 100 segments.
ANCHOR_SEGMENTS = 100


def segment_ends(total_steps: int, steps_per_segment: int) -> list[int]:
    """Steps at which segments end: every ``steps_per_segment`` and ``total_steps`` itself.

    Segment k trains steps ``[ends[k-1], ends[k])`` (from 0 for k = 0) and writes the
    snapshot ``step_{ends[k]}``; the last segment may be shorter.
    """
    if total_steps < 1:
        raise ConfigError(f"train.total_steps = {total_steps}: a run needs at least one step")
    if steps_per_segment < 1:
        raise ConfigError(f"train.steps_per_segment = {steps_per_segment} must be at least 1")
    ends = list(range(steps_per_segment, total_steps, steps_per_segment))
    return [*ends, total_steps]


def kept_steps(ends: list[int], snap: SnapshotsConfig) -> list[int]:
    """Segment ends whose snapshots are kept: the last ``keep_last``, every multiple of
    ``keep_every`` (when > 0), and always the final one. Sorted."""
    if not ends:
        return []
    kept = set(ends[-snap.keep_last:]) if snap.keep_last > 0 else set()
    if snap.keep_every > 0:
        kept.update(s for s in ends if s % snap.keep_every == 0)
    kept.add(ends[-1])
    return sorted(kept)


def previous_end(ends: list[int], step: int) -> int | None:
    """The snapshot step the segment ending at ``step`` resumes from (None for the first)."""
    if step not in ends:
        raise ConfigError(f"step {step} is not a segment end ({ends[:3]}…{ends[-1:]}); snapshots "
                          "exist only at multiples of train.steps_per_segment and total_steps")
    i = ends.index(step)
    return ends[i - 1] if i else None


def anchor_steps(ends: list[int], kept: list[int], every: int | None = None) -> list[int]:
    """Temporary segment ends that get an anchor: the ``every``-th (default
    :data:`ANCHOR_SEGMENTS`, read when called) of each run of temporary segments between
    kept ones, so that no run of them longer than ``every`` is left without a target. None
    when the kept snapshots are that close already (most configs)."""
    every = ANCHOR_SEGMENTS if every is None else every
    if every < 1:
        raise ValueError(f"anchor spacing {every} must be at least 1")
    kept_set, anchors, since = set(kept), [], 0
    for step in ends:
        since = 0 if step in kept_set else since + 1
        if since == every:
            anchors.append(step)
            since = 0
    return anchors
