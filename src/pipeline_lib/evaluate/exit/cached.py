"""The adaptive-exit criteria as an exit rule of cached decoding (:mod:`pipeline_lib.model.
kv_adaptive`): the same scores and thresholds as :func:`.criteria.adaptive_logits`, for the
rows of one decoding pass (one token each) that are still looping. One threshold for every
row, or one per row (:meth:`CriterionExit.per_row`: the sweep's replay decodes every
threshold in one batch, :mod:`.replay`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...errors import ConfigError
from ...spec.rules import check_exit_threshold
from .criteria import (
    LOGIT_CRITERIA,
    STATE_CRITERIA,
    ExitTracker,
    check_model_criterion,
    exit_scores,
    exit_threshold,
)
from .spec import CRITERIA, ExitSpec


class CriterionExit:
    """:class:`~pipeline_lib.model.kv_adaptive.ExitRule` of one threshold of ``spec``
    (``max_loops`` filled); ``key`` names the flag in errors."""

    def __init__(self, model: Any, spec: ExitSpec, key: str = "--adaptive") -> None:
        if spec.criterion not in CRITERIA:
            raise ConfigError(f"{key}: criterion {spec.criterion!r} is not one of "
                              f"{list(CRITERIA)}")
        check_exit_threshold(spec.criterion, spec.threshold, f"{key} threshold")
        if spec.max_loops < 1:
            raise ConfigError(f"{key}: MAX = {spec.max_loops} must be at least 1 loop")
        check_model_criterion(model, spec.criterion, key)
        self.model, self.criterion, self.max_loops = model, spec.criterion, spec.max_loops
        self.threshold = exit_threshold(spec.criterion, spec.threshold)
        self.row_thresholds: Tensor | None = None  # per_row: [rows] compared values
        self.live: Tensor | float = self.threshold  # of the rows still looping in a pass
        self.tracker: ExitTracker | None = None
        self.prev: Tensor | None = None

    def per_row(self, thresholds: Sequence[float], key: str = "threshold") -> None:
        """From now on row b of every pass exits under ``thresholds[b]`` (the user's units)."""
        for x in thresholds:
            check_exit_threshold(self.criterion, x, key)
        self.row_thresholds = torch.tensor([exit_threshold(self.criterion, x)
                                            for x in thresholds], dtype=torch.float32)

    def select(self, rows: Tensor) -> None:
        """Keep the per-row thresholds of ``rows`` only (as :meth:`KVCache.select`)."""
        if self.row_thresholds is not None:
            self.row_thresholds = self.row_thresholds[rows.to(self.row_thresholds.device)]

    def start(self, state: Tensor, readout: Callable[[], Tensor]) -> None:
        self.prev = None
        if self.row_thresholds is not None:
            self.row_thresholds = self.row_thresholds.to(state.device)
            assert len(self.row_thresholds) == state.shape[0], "one threshold per row"
        self.live = self.threshold if self.row_thresholds is None else self.row_thresholds
        if self.criterion == "kl" and self.max_loops > 1:  # p_0: the initial state's readout
            self.prev = torch.log_softmax(readout().float(), dim=-1)
        self.tracker = None
        if self.criterion not in LOGIT_CRITERIA:
            self.tracker = ExitTracker(self.model, self.criterion)
            self.tracker.start(state)

    @property
    def reads(self) -> str:
        """What a loop's score needs (:class:`~pipeline_lib.model.kv_adaptive.ExitRule`):
        the loop state alone, the readout's hidden state (the gate) or its logits."""
        if self.criterion in STATE_CRITERIA:
            return "state"
        return "hidden" if self.criterion == "gate" else "logits"

    def exited(self, state: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        if self.reads != "logits":
            assert self.tracker is not None
            return self.tracker.score(state, hidden, None) < self.live
        assert logits is not None, "kl, entropy and argmax_stable read the logits"
        logp = torch.log_softmax(logits.float(), dim=-1)
        if self.tracker is None:
            score = exit_scores(logp, self.prev, self.criterion)
        else:
            score = self.tracker.score(state, hidden, logp.argmax(-1))
        self.prev = logp
        return score < self.live

    def keep(self, still: Tensor) -> None:
        if isinstance(self.live, Tensor):
            self.live = self.live[still]
        if self.prev is not None:
            self.prev = self.prev[still]
        if self.tracker is not None:
            self.tracker.keep(still)
