"""What an adaptive exit is, in one place: :class:`ExitSpec` and its one text form.

A token stops looping at the first loop whose ``criterion`` score passes a threshold
(:mod:`.criteria`), at most ``max_loops``. One exit is named in text as
``adaptive:[CRITERION:]THRESHOLD[:MAX]`` (``adaptive:0.01:8``, ``adaptive:gate:0.9``):
``generate --h-eff/--adaptive``, the lm-eval model's ``h_eff=`` and the benchmarks' settings
all read it with :meth:`ExitSpec.parse` and write it with :meth:`ExitSpec.text`. A config
section's adaptive keys (``eval.adaptive``, ``bench.adaptive``) give one spec per criterion,
each with all its thresholds (:meth:`ExitSpec.from_config`): what the H_eff sweep evaluates
in one pass and the benchmarks score one threshold at a time (:meth:`ExitSpec.points`).

Torch-free: the rules it applies live with the config's (``config_rules``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ...spec.rules import EXIT_CRITERIA, check_exit_threshold, check_test_loops

CRITERIA = EXIT_CRITERIA
FORMS = "adaptive:THRESHOLD[:MAX] or adaptive:CRITERION:THRESHOLD[:MAX]"


@dataclass(frozen=True)
class ExitSpec:
    """One criterion's adaptive exit at each of ``thresholds``, at most ``max_loops`` deep."""

    thresholds: tuple[float, ...]
    criterion: str = "kl"
    max_loops: int = 0  # 0 = the caller's default (the largest H_eff, the training loops)

    @staticmethod
    def is_text(value: Any) -> bool:
        """Whether ``value`` asks for an adaptive exit (text starting ``adaptive``)."""
        return isinstance(value, str) and value.strip().lower().startswith("adaptive")

    @classmethod
    def parse(cls, text: str, key: str = "h_eff", criterion: str = "kl") -> ExitSpec:
        """``"adaptive:[CRITERION:]THRESHOLD[:MAX]"`` (``key`` names where it was given) →
        a spec of one threshold; ``criterion`` when the text names none, ``max_loops`` 0
        when it gives no MAX."""
        parts = [p.strip() for p in str(text).split(":")]
        fix = f"use {key}={FORMS}, e.g. adaptive:0.01:8 or adaptive:gate:0.9"
        if parts[0].lower() != "adaptive" or len(parts) not in (2, 3, 4):
            raise ConfigError(f"{key}={text!r} is not an adaptive exit; {fix}")
        if parts[1].lower() in CRITERIA:
            criterion, parts = parts[1].lower(), [parts[0], *parts[2:]]
        elif len(parts) == 4:
            raise ConfigError(f"{key}={text!r}: {parts[1]!r} is not a criterion of "
                              f"{list(CRITERIA)}; {fix}")
        if len(parts) not in (2, 3):
            raise ConfigError(f"{key}={text!r} is not an adaptive exit; {fix}")
        try:
            threshold = float(parts[1])
            max_loops = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            raise ConfigError(f"{key}={text!r}: THRESHOLD must be a number and MAX an integer; "
                              f"{fix}") from None
        try:
            check_exit_threshold(criterion, threshold,
                                 f"{key}={text!r}: the {criterion} threshold")
        except ConfigError as exc:
            raise ConfigError(f"{exc}; {fix}") from None
        if len(parts) == 3 and max_loops < 1:
            raise ConfigError(f"{key}={text!r}: MAX must be at least 1 loop; {fix}")
        if max_loops:
            check_test_loops(max_loops, f"{key}={text!r}: MAX")
        return cls((threshold,), criterion, max_loops)

    @classmethod
    def from_config(cls, adaptive: Any) -> list[ExitSpec]:
        """One spec per criterion of ``eval.adaptive`` or ``bench.adaptive`` (an
        AdaptiveExitConfig), in order, with its thresholds (``criterion_thresholds[c]``,
        else ``thresholds``); none when ``thresholds`` is empty (adaptive exit off)."""
        if not adaptive.thresholds:
            return []
        return [cls(tuple(float(x) for x in adaptive.criterion_thresholds.get(c,
                                                                              adaptive.thresholds)),
                    c, int(adaptive.max_loops)) for c in dict.fromkeys(adaptive.criteria)]

    @property
    def threshold(self) -> float:
        """The threshold of a one-threshold spec (what :meth:`parse` gives)."""
        assert len(self.thresholds) == 1, f"{self} has {len(self.thresholds)} thresholds"
        return self.thresholds[0]

    def text(self, default_criterion: str = "kl") -> str:
        """``adaptive:[CRITERION:]THRESHOLD:MAX`` of a one-threshold spec with its MAX; the
        criterion is named unless it is ``default_criterion``."""
        assert self.max_loops >= 1, "fill max_loops first (with_max_loops)"
        named = "" if self.criterion == default_criterion else f"{self.criterion}:"
        return f"adaptive:{named}{self.threshold:g}:{self.max_loops}"

    def with_max_loops(self, default: int) -> ExitSpec:
        """This spec with ``max_loops`` 0 replaced by ``default``."""
        return ExitSpec(self.thresholds, self.criterion, self.max_loops or int(default))

    def points(self) -> list[ExitSpec]:
        """One one-threshold spec per distinct threshold, in increasing order."""
        return [ExitSpec((x,), self.criterion, self.max_loops)
                for x in sorted(set(self.thresholds))]

    def resolved(self, h_effs: Sequence[int], key: str = "eval.adaptive") -> ExitSpec:
        """Checked (``key``: the config keys it came from), thresholds sorted and distinct,
        ``max_loops`` 0 replaced by ``max(h_effs)``."""
        if self.criterion not in CRITERIA:
            raise ConfigError(f"{key}.criteria lists {self.criterion!r}, not one of "
                              f"{list(CRITERIA)}; pick one")
        where = f"{key}.thresholds ({self.criterion})"
        if not self.thresholds:
            raise ConfigError(f"{where} is empty; list thresholds, e.g. [0, 0.001, 0.01]")
        for x in self.thresholds:
            check_exit_threshold(self.criterion, x, where)
        if self.max_loops < 0:
            raise ConfigError(f"{key}.max_loops = {self.max_loops} must be >= 1, or 0 for the "
                              f"largest h_eff")
        return ExitSpec(tuple(sorted(set(self.thresholds))), self.criterion,
                        self.max_loops or max(h_effs))
