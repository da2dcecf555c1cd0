"""Hand a trained model on: the Hugging Face export of a snapshot (:mod:`.hf`).

``modeling_loopline.py`` here is not imported by loopline: it is copied into every export
and imported by transformers (``trust_remote_code=True``).
"""

from __future__ import annotations

from .hf import export_snapshot

__all__ = ["export_snapshot"]
