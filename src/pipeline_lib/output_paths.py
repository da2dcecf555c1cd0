"""The output rule: checks of a command's output locations, made before it does any work.

A command owns only what it made, for folders and files alike:

- an output directory it replaces must be absent, empty, or recognisably its own (a pack's
  metadata.json, a snapshot's MANIFEST.json, an export's config.json, …: the caller says how
  to recognise it);
- an output file (:class:`Output` with an :class:`OutputKind`) must end in one of its kind's
  extensions and, when it exists, be empty or of that kind (a sweep JSON, a Parquet table, a
  figure): a user's YAML, a pack's metadata.json or another command's JSON is never written
  over;
- no output lies inside a snapshot, a data pack or an export (:func:`protected_folder`),
  none is one of the command's inputs, no two outputs share a path, and no input is named
  twice;
- the place it goes is creatable: no file where a directory is needed on the way, a
  writable nearest existing directory, and space left on its disk.

Each failure is one :class:`~pipeline_lib.errors.UsageError` line naming the path and the
fix, raised before anything is read, built or written, so a refused command leaves the disk
as it was. The CLI applies :func:`check_outputs` to every command's declared outputs
(:func:`pipeline_lib.commands._common.out`) and the stages to theirs; what a stage
then writes goes through :mod:`pipeline_lib.output_set` (temporary siblings, published
together).

Standard library only (a leaf above :mod:`~pipeline_lib.errors`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError
from .spec.names import CONFIG_JSON, MANIFEST_NAME, MODELING_FILE, PACK_METADATA, PACK_TOKENS


@dataclass(frozen=True)
class OutputKind:
    """What a single-file output holds: its extensions (none: any name) and how to
    recognise a file of the kind (one this command, or an earlier run of it, wrote)."""

    name: str
    suffixes: tuple[str, ...]
    recognise: Callable[[Path], bool]


def _json_with(key: str) -> Callable[[Path], bool]:
    def recognise(path: Path) -> bool:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and key in doc

    return recognise


def _starts_with(*magics: bytes) -> Callable[[Path], bool]:
    def recognise(path: Path) -> bool:
        try:
            with open(path, "rb") as fh:
                head = fh.read(64).lstrip()
        except OSError:
            return False
        return head.startswith(magics)

    return recognise


# The single-file outputs of the commands (what each writes is decided by its writer; the
# key or magic here is what recognises one, and tests/reliability/test_rel_output_rule.py
# checks that every command's real output is recognised).
HEFF_JSON = OutputKind('an H_eff sweep result (JSON with "losses")', (".json",),
                       _json_with("losses"))
BENCH_JSON = OutputKind('a benchmark result (JSON with "tasks")', (".json",), _json_with("tasks"))
DEVICE_JSON = OutputKind('a device check report (JSON with "checks")', (".json",),
                         _json_with("checks"))
DEPTH_JSON = OutputKind('a depth check (JSON with "comparisons")', (".json",),
                        _json_with("comparisons"))
RECORD_JSON = OutputKind('a tracking record (JSON with "parent_run_id")', (".json",),
                         _json_with("parent_run_id"))
INDEX_JSON = OutputKind('a snapshot index (JSON with "kept")', (".json",), _json_with("kept"))
TABLE = OutputKind("a Parquet table", (".parquet",), _starts_with(b"PAR1"))
FIGURE = OutputKind("a figure (PNG, SVG or PDF)", (".png", ".svg", ".pdf"),
                    _starts_with(b"\x89PNG", b"<?xml", b"<svg", b"%PDF"))
PAGE = OutputKind("a Markdown page", (".md",), _starts_with(b""))  # markers: results_doc
SQLITE = OutputKind("a SQLite database", (), _starts_with(b"SQLite format 3\x00"))  # any name

# Folders no command writes into, by the files their writers name them with.
_PROTECTED = (("snapshot", (MANIFEST_NAME,)),
              ("data pack", (PACK_METADATA, PACK_TOKENS)),
              ("export", (CONFIG_JSON, MODELING_FILE)))


@dataclass(frozen=True)
class Output:
    """One output of a command: ``what`` names it in messages (``--out``, ``output``);
    ``kind`` None for a directory."""

    path: Path
    what: str
    kind: OutputKind | None = None


def _writable(directory: Path) -> bool:
    """Whether new entries can be made in ``directory`` (permissions, a read-only mount)."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only and os.access(directory, os.W_OK | os.X_OK)


def _disk_full(directory: Path) -> bool:
    """Whether the file system of ``directory`` has no block left for this user (root may
    use the blocks reserved for it); False for pseudo file systems (no blocks at all)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return False
    free = stat.f_bfree if os.geteuid() == 0 else stat.f_bavail
    return stat.f_blocks > 0 and free == 0


def check_creatable(path: Path, what: str) -> None:
    """``path`` can be made: its nearest existing ancestor is a writable directory with
    space left."""
    path = Path(path)
    for ancestor in Path(os.path.abspath(path)).parents:
        if not os.path.lexists(ancestor):
            continue
        if not ancestor.is_dir():
            raise UsageError(f"{what} {path}: {ancestor} is a file, not a directory; pass a "
                             "path under a directory (or move that file away)")
        if not _writable(ancestor):
            raise UsageError(f"{what} {path}: cannot create entries in {ancestor} (not "
                             "writable); pass a path in a writable directory")
        if _disk_full(ancestor):
            raise UsageError(f"{what} {path}: no space left on the disk of {ancestor}; free "
                             "space there or pass a path on another disk")
        return


def check_output_file(path: Path, what: str) -> None:
    """``path`` may be written as a file (created, or an earlier result replaced)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a file; pass a file path")
    check_creatable(path, what)


def check_output_dir(path: Path, what: str, *, owned: Callable[[Path], bool],
                     kind: str) -> None:
    """``path`` may be created or replaced as a directory: absent, empty, or ``owned`` by
    this stage (``kind`` names what ``owned`` recognises, e.g. "a data pack (no
    metadata.json)")."""
    path = Path(path)
    if os.path.lexists(path):
        if not path.is_dir():
            raise UsageError(f"{what} {path} is a file, not a directory; move it away or pass "
                             "another path")
        if any(path.iterdir()) and not owned(path):
            raise UsageError(f"{what} {path} exists and is not {kind}; pass a new path or "
                             "remove it by hand (nothing was changed)")
    check_creatable(path, what)


def check_output_location(path: Path, what: str) -> None:
    """``path`` is (or can become) a directory that a stage adds files to (a run directory,
    a folder of figures): not a file, and creatable."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"{what} {path} is a file, not a directory; move it away or pass "
                         "another path")
    if path.is_dir() and not _writable(path):
        raise UsageError(f"{what} {path} is not writable; pass a writable directory")
    check_creatable(path, what)


def protected_folder(path: Path) -> tuple[str, Path] | None:
    """(what, folder) of the snapshot, data pack or export that ``path`` lies inside (any
    real ancestor, symbolic links resolved), or None."""
    for folder in Path(os.path.realpath(path)).parents:
        for what, markers in _PROTECTED:
            if all(os.path.lexists(folder / name) for name in markers):
                return what, folder
    return None


def _real(path: Path) -> str:
    return os.path.realpath(path)


def check_inputs(inputs: Sequence[tuple[str, Path]]) -> None:
    """No input is named twice by one option (``--inputs a.json a.json``, two names of one
    run directory)."""
    seen: dict[tuple[str, str], Path] = {}
    for what, path in inputs:
        key = (what, _real(path))
        if key in seen:
            raise UsageError(f"{what} names {path} twice (as {seen[key]} and {path}); pass each "
                             "once")
        seen[key] = Path(path)


def _check_kind(out: Output) -> None:
    kind, path = out.kind, Path(out.path)
    assert kind is not None
    if path.is_dir():
        raise UsageError(f"{out.what} {path} is a directory, not a file; pass a file path")
    if kind.suffixes and path.suffix.lower() not in kind.suffixes:
        raise UsageError(f"{out.what} {path} must end in {' or '.join(kind.suffixes)} (it is "
                         f"{kind.name}); pass such a path")
    if path.is_file() and path.stat().st_size > 0 and not kind.recognise(path):
        raise UsageError(f"{out.what} {path} exists and is not {kind.name}; this command "
                         "replaces only its own outputs: pass a new path or remove that file "
                         "by hand (nothing was changed)")


def check_outputs(outputs: Sequence[Output], inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """The whole output rule (see the module docstring) for one command, before its work:
    ``inputs`` are (option, path) of everything it reads."""
    check_inputs(inputs)
    claimed: dict[str, Output] = {}
    for out in outputs:
        real = _real(out.path)
        for what, path in inputs:
            if _real(path) == real:
                raise UsageError(f"{out.what} {out.path} is also the command's input {what}; "
                                 "pass another output path (nothing was changed)")
        if real in claimed:
            raise UsageError(f"{claimed[real].what} and {out.what} are both {out.path}; pass a "
                             "different path for each")
        claimed[real] = out
        inside = protected_folder(out.path)
        if inside is not None:
            raise UsageError(f"{out.what} {out.path} lies inside the {inside[0]} {inside[1]}, "
                             "which no command writes into; pass a path outside it")
        if out.kind is not None:
            _check_kind(out)
        elif os.path.lexists(out.path) and not Path(out.path).is_dir():
            raise UsageError(f"{out.what} {out.path} is a file, not a directory; move it away "
                             "or pass another path")
        check_creatable(Path(out.path), out.what)
