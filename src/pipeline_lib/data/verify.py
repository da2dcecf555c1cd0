"""Checking a packed data directory before it is trained on, at a cost that stays small.

Every file the pack writes is covered: ``metadata.json`` carries its own sha256
(``metadata_sha256``, over its other keys) and the sha256 of ``tokenizer.json`` and of
every array (``tokens.bin``, ``docs.npy``, ``answer_spans.npy``, ``levels.npy``, a labelled
pack's ``labels.bin``, each split's ``doc_start``/``doc_len``/``row_ptr``). A mismatch is a one-line
:class:`~pipeline_lib.errors.DataError` naming the file and the fix (re-pack).

Hashing a large pack on every training segment would cost minutes per job, so a file is
hashed only until it has been verified once: a marker beside the pack
(``.{data_id}.verified.json``, outside the directory so Snakemake never sees the pack
change) records, per file, the sha256 it was checked against and the file's identity
(inode, size, mtime_ns, ctime_ns). Later checks ``stat`` each file and hash only those whose
identity changed. Any write to a file changes its ctime (which, unlike the mtime, cannot be
set back), and a copied or re-written pack has new inodes, so each is hashed again once.
A file changed less than :data:`TIMESTAMP_SLACK_S` before it was verified is not recorded
(a later write within the same timestamp tick would leave its identity unchanged), so
it is hashed again next time. What the marker cannot see is decay of the disk's bytes
under an unchanged inode; ``PackedData.verify()`` hashes everything regardless.

Parallel readers (ranks, variants) take a lock beside the marker, so one process hashes
while the others wait and then find the marker valid.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..fsio import file_sha256, write_text_atomic
from ..spec.names import PACK_METADATA

log = logging.getLogger(__name__)

SELF_HASH_KEY = "metadata_sha256"
MARKER_FORMAT = 1
# Coarsest timestamp granularity trusted (network and FAT-like filesystems: up to 2 s).
TIMESTAMP_SLACK_S = 2.0


@dataclass
class VerifyReport:
    """What one check did: the files hashed and those trusted from the marker."""

    hashed: list[str] = field(default_factory=list)
    trusted: list[str] = field(default_factory=list)
    recorded: bool = False  # the marker was (re)written


def metadata_digest(meta: Mapping[str, Any]) -> str:
    """sha256 of ``meta`` without its own :data:`SELF_HASH_KEY` (canonical JSON)."""
    body = {k: v for k, v in meta.items() if k != SELF_HASH_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def marker_path(data_dir: Path) -> Path:
    """``.{name}.verified.json`` beside ``data_dir``."""
    data_dir = Path(data_dir).absolute()
    return data_dir.with_name(f".{data_dir.name}.verified.json")


def _damaged(path: Path, what: str, data_dir: Path) -> DataError:
    return DataError(f"{path} {what}; the pack is damaged: re-pack it (delete {data_dir.name}/ "
                     "and rerun snakemake, or `python -m pipeline_lib pack --out` into it)")


def check_metadata(data_dir: Path, meta: Mapping[str, Any]) -> None:
    """Raise DataError naming metadata.json when it does not match its own digest (packs
    written before the digest existed carry none and pass)."""
    if SELF_HASH_KEY in meta and meta[SELF_HASH_KEY] != metadata_digest(meta):
        raise _damaged(Path(data_dir) / PACK_METADATA,
                       "does not match its own metadata_sha256", Path(data_dir))


def expected_hashes(data_dir: Path, meta: Mapping[str, Any]) -> dict[str, str]:
    """Relative path → sha256 of every file the pack's metadata covers (metadata.json's own
    digest checked here). Raises DataError naming metadata.json when it was altered."""
    data_dir = Path(data_dir)
    check_metadata(data_dir, meta)
    arrays = meta.get("arrays")
    if not isinstance(arrays, dict) or not arrays:
        raise _damaged(data_dir / PACK_METADATA, "lists no array checksums", data_dir)
    hashes = dict(arrays)
    if meta.get("tokenizer_sha256"):
        hashes["tokenizer.json"] = meta["tokenizer_sha256"]
    return hashes


def _identity(st: os.stat_result) -> list[int]:
    # No st_dev: it differs between the nodes of a cluster mounting the same pack.
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != MARKER_FORMAT:
        return {}
    files = doc.get("files")
    return files if isinstance(files, dict) else {}


@contextlib.contextmanager
def _marker_lock(marker: Path) -> Iterator[None]:
    """An exclusive lock beside the marker; none where the filesystem has no locks."""
    lock_path = marker.with_name(marker.name.removesuffix(".json") + ".lock")
    try:
        fh = open(lock_path, "a")  # noqa: SIM115 (closed below)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError:  # e.g. a Lustre mount without -o flock
            pass
        yield
    finally:
        fh.close()


def _check_files(data_dir: Path, hashes: Mapping[str, str], known: Mapping[str, Any],
                 report: VerifyReport) -> dict[str, Any]:
    """Hash the files the marker does not vouch for; return the entries to record."""
    start_ns = time.time_ns()
    entries: dict[str, Any] = {}
    for rel, expected in sorted(hashes.items()):
        path = data_dir / rel
        try:
            st = path.stat()
        except FileNotFoundError:
            raise DataError(f"{path} is missing; the pack in {data_dir} is incomplete: "
                            "re-pack it") from None
        identity = _identity(st)
        entry = known.get(rel)
        if isinstance(entry, dict) and entry.get("sha256") == expected \
                and entry.get("identity") == identity:
            report.trusted.append(rel)
            entries[rel] = entry
            continue
        if file_sha256(path) != expected:
            raise _damaged(path, "does not match its sha256 in metadata.json", data_dir)
        report.hashed.append(rel)
        if st.st_ctime_ns < start_ns - int(TIMESTAMP_SLACK_S * 1e9) and \
                _identity(path.stat()) == identity:
            entries[rel] = {"sha256": expected, "identity": identity}
    return entries


def verify_pack(data_dir: str | Path, meta: Mapping[str, Any], *,
                use_marker: bool = True) -> VerifyReport:
    """Check every file of the pack in ``data_dir`` against ``meta`` (its metadata.json).

    With ``use_marker`` (the default), files the marker vouches for are only ``stat``-ed;
    without it, everything is hashed and the marker is left alone.
    """
    data_dir = Path(data_dir)
    hashes = expected_hashes(data_dir, meta)
    report = VerifyReport()
    if not use_marker:
        _check_files(data_dir, hashes, {}, report)
        return report
    marker = marker_path(data_dir)
    with _marker_lock(marker):
        known = _read_marker(marker)
        entries = _check_files(data_dir, hashes, known, report)
        if report.hashed and entries != known:
            doc = {"format": MARKER_FORMAT, "data_dir": str(data_dir.absolute()),
                   "files": entries}
            try:
                write_text_atomic(marker, json.dumps(doc, indent=1, sort_keys=True) + "\n")
                report.recorded = True
            except OSError as exc:
                log.warning("cannot record the verified pack in %s (%s); every segment will "
                            "hash the pack again", marker, exc)
    if report.hashed:
        log.info("verified %d file(s) of %s against metadata.json (%d unchanged since "
                 "verified)", len(report.hashed), data_dir, len(report.trusted))
    return report
