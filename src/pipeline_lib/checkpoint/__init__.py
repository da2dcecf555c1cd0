"""Snapshot mechanics (write atomically, verify, load, RNG, resume checks, best copy).

Policy (which steps to keep) lives in :mod:`pipeline_lib.spec.snapshots`. Import the
submodules themselves (``checkpoint.snapshot``, ``.manifest``, ``.best``, …): this package
imports nothing, so the torch-free parts (``manifest``, ``best``, ``fsutil``, ``contents``)
load without torch.
"""
