"""Hand a trained model on: the Hugging Face export of a snapshot (:mod:`.hf`).

``modeling_loopline.py``, ``loopline_layers.py`` and ``loopline_adaptive.py`` here are not
imported by loopline: they are copied into every export and imported by transformers
(``trust_remote_code=True``).
"""

from __future__ import annotations

from .hf import export_snapshot

__all__ = ["export_snapshot"]
