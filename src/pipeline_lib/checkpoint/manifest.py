"""MANIFEST.json: the sha256 and size of every file of a snapshot, written last.

A snapshot directory is complete exactly when its MANIFEST.json exists and every listed file
matches it; nothing else may sit in the directory. Names are relative POSIX paths: a sharded
snapshot lists the files inside its DCP directories (``model_dcp/shard-…safetensors``). :func:`verify_snapshot` checks all of
that and raises :class:`CheckpointError` naming the offending file, so a half-written,
truncated or bit-flipped snapshot is refused before anything is loaded from it.

Torch-free (hashlib + json), so workflow code can verify without the tensor stack.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import CheckpointError
from ..fsio import file_sha256
from ..spec.names import CONFIG_JSON, MANIFEST_NAME, PACK_METADATA, PACK_TOKENS
from .fsutil import publish_dir

SNAPSHOT_FORMAT = "loopline-snapshot"
SNAPSHOT_VERSION = 1
# Files every snapshot holds (checkpoint.contents names them; repeated here, torch-free).
_SNAPSHOT_FILES = frozenset({"model.safetensors", "trainer_state.json", "config.yaml"})
_CHUNK = 1 << 20  # hash and write in cache-sized pieces: 8 MiB ones ran 2x slower here
_THREAD_MIN = 1 << 20  # smaller writes are collected and hashed in batches


class HashingWriter:
    """File writer that hashes (sha256) and counts the bytes as they go out.

    The hash runs on one helper thread, in write order, while the main thread writes
    (hashlib and file writes both release the GIL), so hashing costs little extra time.
    Small writes (norm weights between large matrices) are copied into a batch that is
    hashed before the next large write: the writer never waits for the hash mid-file.
    Call :meth:`record` (which waits for the hash) after the last write.
    """

    def __init__(self, fh: BinaryIO):
        self.fh = fh
        self.sha = hashlib.sha256()
        self.size = 0
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self._small = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes < _THREAD_MIN:
            self._small += view  # a copy: hashed later, before anything written after it
            self.fh.write(view)
            if len(self._small) >= _CHUNK:
                self._hash_small()
        else:
            self._hash_small()
            for start in range(0, view.nbytes, _CHUNK):
                chunk = view[start:start + _CHUNK]
                # one worker runs updates in submission order; the view keeps its buffer alive
                self._submit(chunk)
                self.fh.write(chunk)
        self.size += view.nbytes

    def _submit(self, data: bytes | bytearray | memoryview) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._last = self._pool.submit(self.sha.update, data)

    def _hash_small(self) -> None:
        """Hand the collected small writes to the hash thread (a new batch starts)."""
        if self._small:
            self._submit(self._small)
            self._small = bytearray()

    def record(self, role: str) -> dict[str, Any]:
        """Wait for the hash; the manifest record ``{"size", "sha256", "role"}``."""
        if self._pool is None:  # small writes only: hash them here
            self.sha.update(self._small)
        else:
            self._hash_small()
            self._last.result()
            self._pool.shutdown()
            self._pool = None
        return {"size": self.size, "sha256": self.sha.hexdigest(), "role": role}


def write_bytes_file(path: Path, data: bytes | str, role: str) -> dict[str, Any]:
    """Write ``data`` (a str as UTF-8) to ``path``, fsync it, and return its manifest record."""
    with open(path, "wb") as fh:
        writer = HashingWriter(fh)
        writer.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    return writer.record(role)


def manifest_bytes(files: dict[str, dict[str, Any]]) -> bytes:
    """The MANIFEST.json content for these file records (sorted, deterministic)."""
    doc = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
           "files": {name: files[name] for name in sorted(files)}}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def describe_non_snapshot(path: Path, option: str = "--resume-from") -> str:
    """What a directory without MANIFEST.json is, and what to pass instead: a data pack, a
    run directory or its snapshots/ folder are common mix-ups; only a directory holding
    snapshot files is an interrupted (or damaged) snapshot. ``option``: the flag that took
    it (``--resume-from`` also takes ``none``)."""
    names = {p.name for p in path.iterdir()}
    steps = sorted(n for n in names if n.startswith("step_") and (path / n).is_dir())
    if {PACK_METADATA, PACK_TOKENS} <= names:
        none = " or none" if option == "--resume-from" else ""
        return (f"{path} is a packed data directory, not a snapshot; pass it as --data, and "
                f"as {option} a snapshot directory (…/snapshots/step_NNNNNNN){none}")
    if (path / "snapshots").is_dir():
        return (f"{path} is a run directory, not a snapshot; pass {path / 'snapshots'}/final "
                "or one of its step_NNNNNNN directories")
    if steps:
        return (f"{path} holds snapshots but is not one; pass one of them, e.g. "
                f"{path / steps[-1]}")
    if CONFIG_JSON in names and "config.yaml" not in names:
        return _describe_model_directory(path, option)
    if names & _SNAPSHOT_FILES:
        return (f"snapshot {path} is incomplete: {MANIFEST_NAME} is missing (its write was "
                "interrupted or it was deleted); resume from an earlier snapshot or rerun the "
                "segment that writes it")
    return (f"{path} is not a snapshot (no {MANIFEST_NAME}, no snapshot files); pass a snapshot "
            "directory (…/snapshots/step_NNNNNNN)")


def _describe_model_directory(path: Path, option: str) -> str:
    """A directory with a Hugging Face ``config.json``: loopline's export of a snapshot, or
    another model (which import-hf turns into a snapshot)."""
    try:
        model_type = json.loads((path / CONFIG_JSON).read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type == "loopline":
        return (f"{path} is a Hugging Face export of a snapshot (config.json with model_type "
                f"'loopline'), not a snapshot; load it with transformers "
                f"(trust_remote_code=True), or pass as {option} the snapshot it was exported from")
    return (f"{path} is a Hugging Face model directory (config.json), not a snapshot; turn it "
            f"into one with python -m pipeline_lib import-hf, and pass that as {option}")


def read_manifest(path: Path) -> dict[str, Any]:
    """Parse ``path/MANIFEST.json``; CheckpointError when it is absent or malformed."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"snapshot {path} does not exist or is not a directory; pass the "
                              "path of a snapshot directory (…/snapshots/step_NNNNNNN)")
    mpath = path / MANIFEST_NAME
    if not mpath.is_file():
        raise CheckpointError(describe_non_snapshot(path))
    try:
        doc = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"snapshot {path}: {MANIFEST_NAME} is unreadable ({exc}); the "
                              "snapshot is corrupted, rerun the segment that writes it") from None
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise CheckpointError(f"snapshot {path}: {MANIFEST_NAME} is not a {SNAPSHOT_FORMAT} "
                              "manifest; point at a directory written by pipeline_lib")
    if doc.get("version") != SNAPSHOT_VERSION:
        raise CheckpointError(f"snapshot {path}: {MANIFEST_NAME} has format version "
                              f"{doc.get('version')!r}, this code reads {SNAPSHOT_VERSION}; use "
                              "the matching pipeline_lib version")
    files = doc.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("size"), int)
            and isinstance(r.get("sha256"), str) for r in files.values()):
        raise CheckpointError(f"snapshot {path}: {MANIFEST_NAME} has a malformed 'files' table; "
                              "the snapshot is corrupted, rerun the segment that writes it")
    for name in files:
        if not _plain_relative(name):
            raise CheckpointError(f"snapshot {path}: {MANIFEST_NAME} lists {name!r}, which is not "
                                  "a relative path inside the snapshot; the manifest is corrupted "
                                  "or forged, do not load this snapshot")
    return doc


def _plain_relative(name: str) -> bool:
    """A normalised relative POSIX path with no ``..``, ``.`` or empty parts."""
    parts = name.split("/")
    return (bool(name) and "\\" not in name and not name.startswith("/")
            and all(part not in ("", ".", "..") for part in parts))


def snapshot_entries(path: Path) -> tuple[set[str], set[str]]:
    """(files, directories) below ``path`` as relative POSIX paths, the manifest and tool
    markers at the top left out. Symlinks count as files (and then fail the file check)."""
    files: set[str] = set()
    dirs: set[str] = set()
    for root, dirnames, filenames in os.walk(path):
        rel = Path(root).relative_to(path).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        for d in list(dirnames):
            if os.path.islink(os.path.join(root, d)):
                dirnames.remove(d)
                files.add(prefix + d)
            else:
                dirs.add(prefix + d)
        files.update(prefix + f for f in filenames)
    return files - {MANIFEST_NAME, *TOOL_MARKERS}, dirs


# Files that tools put into finished output directories: Snakemake stamps directory()
# outputs with this one. They are not part of the snapshot and never checked.
TOOL_MARKERS = (".snakemake_timestamp",)


def _unlisted(path: Path, name: str) -> str:
    """Why ``name`` in snapshot ``path`` is not in its manifest, and the fix: a file every
    snapshot writes means the manifest is damaged (deleting the file would lose the
    weights); anything else was put there later and is moved out."""
    if name in _SNAPSHOT_FILES | {"tokenizer.json"}:
        return (f"snapshot {path}: {MANIFEST_NAME} does not list {name}, a file every snapshot "
                f"writes, so {MANIFEST_NAME} is damaged; keep {name}, and rerun the segment that "
                "writes the snapshot (or restore it from a copy)")
    return (f"snapshot {path} holds {name}, which {MANIFEST_NAME} does not list; if you put it "
            "there, move it out of the snapshot (snapshots are written whole, never edited); "
            f"if not, {MANIFEST_NAME} is damaged: rerun the segment that writes the snapshot")


def verify_snapshot(path: str | Path, *, hash_files: Iterable[str] | None = None) -> dict[str, Any]:
    """Check a snapshot directory against its manifest and return the manifest.

    Refuses (CheckpointError naming the file): a missing or malformed MANIFEST.json, a
    listed file that is missing, a size mismatch, a sha256 mismatch, and any file or folder
    the manifest does not list (at any depth). ``hash_files`` restricts the (costly) sha256 check to those
    names (``dir/``: every file in that directory); sizes and presence are always checked for
    every file. Default: hash everything.
    """
    path = Path(path)
    doc = read_manifest(path)
    files: dict[str, dict[str, Any]] = doc["files"]
    present, dirs = snapshot_entries(path)
    listed_dirs = {parent.as_posix() for name in files for parent in Path(name).parents} - {"."}
    for name in sorted((present - set(files)) | (dirs - listed_dirs)):
        raise CheckpointError(_unlisted(path, name))
    wanted = set(files if hash_files is None else hash_files)
    to_hash = {name for name in files if name in wanted or f"{name.split('/')[0]}/" in wanted}
    for name in sorted(files):
        record = files[name]
        fpath = path / name
        if name not in present or not fpath.is_file():
            raise CheckpointError(f"snapshot {path} is missing {name}, listed in {MANIFEST_NAME}; "
                                  "the snapshot is damaged, rerun the segment that writes it")
        size = fpath.stat().st_size
        if size != record["size"]:
            raise CheckpointError(f"snapshot {path}: {name} has {size} bytes but {MANIFEST_NAME} "
                                  f"says {record['size']}; the file is truncated or corrupted, "
                                  "rerun the segment that writes it")
        if name in to_hash and file_sha256(fpath) != record["sha256"]:
            raise CheckpointError(f"snapshot {path}: {name} fails its sha256 check (the file is "
                                  "corrupted); rerun the segment that writes it or resume from "
                                  "an earlier snapshot")
    return doc


@contextlib.contextmanager
def staged_snapshot(tmp: Path, target: Path, what: str) -> Iterator[dict[str, dict[str, Any]]]:
    """Fill the hidden directory ``tmp``, then publish it as ``target``.

    Yields the manifest records for the block to fill as it writes files into ``tmp``. When
    the block ends normally, MANIFEST.json is written last and ``tmp`` is renamed onto
    ``target``; on any failure ``tmp`` is removed, so nothing half-written is ever seen as a
    snapshot. An OSError becomes a CheckpointError saying what could not be done.
    """
    records: dict[str, dict[str, Any]] = {}
    try:
        yield records
        write_bytes_file(tmp / MANIFEST_NAME, manifest_bytes(records), "manifest")
        publish_dir(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot {what}: {exc}; check free space and permissions") \
                from None
        raise
