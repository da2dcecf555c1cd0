"""Capture and restore every random stream a training step may draw from, without pickle.

The state is a nested dict of JSON-able values and uint8 tensors, which
:func:`~pipeline_lib.checkpoint.snapshot.write_snapshot` stores as ``rng.json`` +
``rng.safetensors``:

- ``python``: ``random`` module (Mersenne Twister words as a list of ints);
- ``numpy``: numpy's global ``RandomState`` (MT19937 key as a list of ints);
- ``torch_cpu``: ``torch.get_rng_state()`` (uint8 tensor);
- ``torch_cuda``: one uint8 tensor per visible CUDA device, present only when CUDA is;
- ``torch_npu``: the same for Ascend NPUs, when torch_npu is loaded and sees devices.

Multi-process runs capture one state per rank, each stored as ``rng_rank{r}.*`` in the
sharded snapshot.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError

log = logging.getLogger(__name__)


def capture_rng_state() -> dict[str, Any]:
    """The current state of python ``random``, numpy's global RNG, torch CPU and CUDA RNGs."""
    version, words, gauss_next = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(words), "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": [int(k) for k in np_state["state"]["key"]],
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    npu = _npu()
    if npu is not None:
        state["torch_npu"] = [s.cpu() for s in npu.get_rng_state_all()]
    return state


def _npu():
    """``torch.npu`` when torch_npu has been imported (by device resolution) and sees a
    device; never imports it here."""
    npu = getattr(torch, "npu", None)
    return npu if npu is not None and npu.is_available() else None


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every stream back to ``state`` (from :func:`capture_rng_state`).

    A CUDA state is restored only when the same number of devices is visible; otherwise it
    is skipped with a warning (CPU streams are still exact).
    """
    missing = {"python", "numpy", "torch_cpu"} - set(state)
    if missing:
        raise CheckpointError(f"RNG state lacks {sorted(missing)}; the snapshot's rng.json is "
                              "incomplete, resume from another snapshot or warm-start weights only")
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(w) for w in py["state"]), py["gauss_next"]))
    npd = state["numpy"]
    np.random.set_state({
        "bit_generator": npd["bit_generator"],
        "state": {"key": np.asarray(npd["key"], dtype=np.uint32), "pos": int(npd["pos"])},
        "has_gauss": int(npd["has_gauss"]),
        "gauss": float(npd["gauss"]),
    })
    torch.set_rng_state(state["torch_cpu"].to("cpu", torch.uint8))
    cuda = state.get("torch_cuda")
    if cuda is not None:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == len(cuda):
            torch.cuda.set_rng_state_all([s.to("cpu", torch.uint8) for s in cuda])
        else:
            log.warning("snapshot holds RNG states of %d CUDA devices, %d visible: CUDA RNG "
                        "not restored (CPU streams are)", len(cuda), have)
    npu_states, npu = state.get("torch_npu"), _npu()
    if npu_states is not None:
        if npu is not None and npu.device_count() == len(npu_states):
            npu.set_rng_state_all([s.to("cpu", torch.uint8) for s in npu_states])
        else:
            log.warning("snapshot holds RNG states of %d Ascend NPUs, which are not all "
                        "visible here: NPU RNG not restored (CPU streams are)", len(npu_states))


class RNGStreams:
    """Every RNG stream as one stateful part: :meth:`capture` at the moment that counts
    (right after a segment's last step), ``state_dict()`` gives that capture,
    ``load_state_dict()`` sets every stream back."""

    def __init__(self) -> None:
        self._captured: dict[str, Any] | None = None

    def capture(self) -> None:
        self._captured = capture_rng_state()

    def state_dict(self) -> dict[str, Any]:
        if self._captured is None:
            raise CheckpointError("the RNG streams were not captured before the snapshot; "
                                  "capture them right after the last step (a bug)")
        return self._captured

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng_state(state)
