"""Snapshot mechanics (write atomically, verify, load, RNG, resume checks, best copy).

Policy (which steps to keep) lives in :mod:`pipeline_lib.snapshots_policy`. Names are
exported lazily (PEP 562) so that torch-free parts (``manifest``, ``best``, ``fsutil``)
can be imported without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Snapshot": "snapshot",
    "write_snapshot": "snapshot",
    "load_snapshot": "snapshot",
    "load_model_state": "snapshot",
    "find_snapshots": "snapshot",
    "step_dir_name": "snapshot",
    "TEST_PAUSE_ENV": "snapshot",
    "write_sharded_snapshot": "sharded",
    "read_dcp": "sharded",
    "verify_snapshot": "manifest",
    "read_manifest": "manifest",
    "MANIFEST_NAME": "manifest",
    "capture_rng_state": "rng",
    "restore_rng_state": "rng",
    "check_resume_compatible": "compat",
    "resume_mismatches": "compat",
    "config_from_yaml": "compat",
    "load_weights_only": "compat",
    "update_best_snapshot": "best",
    "read_best": "best",
    "BEST_DIR": "best",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
