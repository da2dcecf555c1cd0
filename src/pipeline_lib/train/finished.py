"""A finished segment kept in its resume point's place, so a rerun adopts it.

Snakemake records a job's output only when the job has ended and reported to it. A segment
job whose Snakemake was killed (a lost login session) finishes unseen, and the next call
takes its snapshot for incomplete: it deletes it before running the job again, or, when it
started that job while the old one still trained, when the new job fails. So a segment's
snapshot also lives outside Snakemake's outputs, in the slot its resume point uses
(``{run}/train/resume/step_{end}``, :meth:`~pipeline_lib.spec.layout.RunLayout.resume_point`):
once the snapshot is published, rank 0 stages hard links to its files beside the slot
(:func:`stage_finished`), and once the segment's metrics are committed it swaps them into
the slot (:func:`keep_finished`), replacing the resume point of a stopped attempt. No extra
disk: the same files under a second name. A slot therefore holds at most one thing: a
stopped attempt (continued by :func:`.segment_start.segment_start`) or the finished segment.

A later job of the same segment (same input snapshot, end step and train signature, as the
finished snapshot's last ``segments`` record says: :func:`.segment_start.same_segment`)
adopts it (:func:`adopt_finished`): every file checked against the manifest, then
published as the job's output, trained and logged by nobody again. A slot goes when the next
segment starts from its snapshot (:func:`drop_consumed`); a run's last segment keeps its
slot, a second name of the final snapshot's files.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..checkpoint.fsutil import clean_stale_siblings, link_tree, publish_dir, tmp_sibling
from ..checkpoint.manifest import TOOL_MARKERS, verify_snapshot
from ..errors import CheckpointError
from ..spec.layout import RunLayout
from .segment_start import finished_record, read_state, same_segment

log = logging.getLogger(__name__)


def stage_finished(out: Path, point: Path) -> Path | None:
    """Hard links to the published snapshot ``out`` in a hidden sibling of its slot
    ``point``; None where the file system makes no hard links (then a rerun whose output
    Snakemake deleted trains the segment again, as before)."""
    clean_stale_siblings(point)
    tmp = tmp_sibling(point)
    try:
        link_tree(Path(out), tmp, skip=TOOL_MARKERS)
    except OSError as exc:
        log.warning("cannot keep %s under %s (%s): a rerun that finds it deleted trains "
                    "the segment again", out, point.parent, exc)
        return None
    return tmp


def keep_finished(staged: Path | None, point: Path) -> None:
    """Swap the staged links into the slot ``point`` (after the metrics were committed, so
    that an adopted segment has every metric logged); without them, empty the slot (a
    stopped attempt's resume point is spent)."""
    if staged is not None:
        publish_dir(staged, point)
    else:
        shutil.rmtree(point, ignore_errors=True)


def adopt_finished(run_dir: Path, input_snapshot: Path | None, until_step: int,
                   signature: str, out: Path) -> bool:
    """Publish the finished segment kept in the slot as ``out`` when it is this job's
    segment and verifies; True when it was adopted (nothing is left to train)."""
    point = RunLayout.at(run_dir).resume_point(until_step)
    done = finished_record(read_state(point), until_step)
    if done is None or done.get("signature") is None or not same_segment(
            done, input_snapshot, until_step, signature):
        return False
    try:
        verify_snapshot(point)
    except CheckpointError as exc:
        log.warning("not adopting %s: %s; training the segment instead", point, exc)
        shutil.rmtree(point, ignore_errors=True)
        return False
    out = Path(out)
    clean_stale_siblings(out)
    tmp = tmp_sibling(out)
    try:
        link_tree(point, tmp)
    except OSError as exc:
        log.warning("cannot link %s to %s (%s); training the segment instead", point, out, exc)
        return False
    publish_dir(tmp, out)
    log.warning("segment %s→%d was finished by an earlier job (attempt %s) whose Snakemake did "
                "not see it end: adopted its snapshot %s as %s (verified); nothing is trained "
                "or logged again", done.get("start_step"), until_step, done.get("attempt"),
                point, out)
    return True


def drop_consumed(run_dir: Path, input_step: int | None) -> None:
    """Remove the slots of segments that end at or before ``input_step`` (the step of the
    job's input): Snakemake started this job from that snapshot, so it has recorded it and
    the ones before. No finished segment outlives its snapshot by more than one segment
    (a temporary snapshot's files are not kept alive)."""
    if input_step is None:
        return
    for slot in RunLayout.at(run_dir).resume_point(0).parent.glob("step_*"):
        step = slot.name.removeprefix("step_")
        if step.isdigit() and int(step) <= input_step and slot.is_dir():
            shutil.rmtree(slot, ignore_errors=True)


__all__ = ["adopt_finished", "drop_consumed", "keep_finished", "stage_finished"]
