"""Which documents are trained on, how often, and which are validated.

Every document of a ``heldout`` source goes to validation (test sets, levels beyond the
training range); ``data.val_fraction`` of the others, a seeded choice of whole documents,
joins it. The training documents are then repeated by their source's ``weight``. Without a
heldout source this is the split every pack had before the key existed, byte for byte.
"""

from __future__ import annotations

import numpy as np

from ..errors import DataError
from ..spec.config import DataConfig

# Stream ids of the seeded generators (default_rng([seed, stream, …])); pack.py owns 3 and 4.
SPLIT_STREAM, WEIGHTS_STREAM = 1, 2


def validation_split(data: DataConfig, heldout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, val_idx) of whole documents: the ``heldout`` ones (bool [docs]: of a
    heldout source) and a seeded ``data.val_fraction`` of the others go to validation."""
    pool = np.flatnonzero(~heldout)
    num_docs = len(pool)
    num_val = int(round(data.val_fraction * num_docs))
    if data.val_fraction > 0 and num_docs >= 2:
        num_val = min(max(num_val, 1), num_docs - 1)
    elif data.val_fraction > 0 and not heldout.any():
        # an empty validation split: training and the H_eff sweep would fail on it later
        raise DataError(f"the corpus has {num_docs} document, so data.val_fraction = "
                        f"{data.val_fraction} holds out nothing for validation; add documents "
                        "(at least 2: one to train on, one to validate)")
    else:
        num_val = 0
    rng = np.random.default_rng([data.seed, SPLIT_STREAM])
    is_val = heldout.copy()
    is_val[pool[rng.choice(num_docs, num_val, replace=False)]] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def repeat_by_weight(data: DataConfig, train_idx: np.ndarray,
                     doc_source: np.ndarray) -> np.ndarray:
    """Training documents with repeats: floor(weight) copies, one more with p = frac(weight)."""
    weights = np.array([s.weight for s in data.sources], dtype=np.float64)[doc_source[train_idx]]
    rng = np.random.default_rng([data.seed, WEIGHTS_STREAM])
    whole = np.floor(weights)
    reps = whole.astype(np.int64) + (rng.random(len(train_idx)) < weights - whole)
    return np.repeat(train_idx, reps)
