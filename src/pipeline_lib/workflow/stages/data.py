"""The data-side stages: the corpus packed once per data config (rule ``pack_data``, command
``pack``) and a run's snapshot index (rule ``snapshot_index``, command ``snapshot-index``).

Neither opens a child run of its own. A pack is shared by every variant with the same data
config, so it belongs to no single parent run: each variant logs it as its ``pack`` child
run when its parent run is set up (:func:`.parent_runs.init_tracking`). The index only lists
what the ``train`` child runs wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...checkpoint.index import write_index
from ...data.pack import pack_corpus
from ...errors import UsageError
from ...spec.config import DataConfig


def pack_stage(data: DataConfig, out: Path) -> dict[str, Any]:
    """Tokenize and pack the corpus of ``data`` into ``out`` (a previous pack there is
    replaced atomically); returns the pack's metadata (``metadata.json``)."""
    return pack_corpus(data, Path(out))


def index_stage(index: Path, kept: Sequence[Path]) -> dict[str, Any]:
    """Write ``index`` (snapshots/index.json) listing the ``kept`` snapshots and point the
    ``final`` link beside it at the last one; returns the index. The index names each
    snapshot by its folder name, so they must lie beside it (one line otherwise)."""
    index, kept = Path(index), [Path(p) for p in kept]
    for snap in kept:
        if snap.absolute().parent != index.absolute().parent:
            raise UsageError(f"snapshot {snap} is not in {index.parent}, the folder of the index "
                             f"{index}; pass the snapshots of one folder and an index beside "
                             "them (results/<run>/snapshots/index.json)")
    return write_index(index, kept)
