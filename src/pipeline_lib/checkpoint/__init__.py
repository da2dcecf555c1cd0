"""Snapshot mechanics (write atomically, verify, load, RNG, resume checks, best copy).

Policy (which steps to keep) lives in :mod:`pipeline_lib.snapshots_policy`. Names are
exported lazily (PEP 562) so that torch-free parts (``manifest``, ``best``, ``fsutil``)
can be imported without loading torch.
"""

from __future__ import annotations

from ..lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS)
