"""The adaptive-exit figure: the last snapshot large with every criterion on the fixed curve's
axes, earlier snapshots small, the legend outside, threshold labels clear of each other."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest

from pipeline_lib.evaluate.exit.plot import STYLE, plot_adaptive, threshold_labels

H = 4


def section(criterion: str, points: list[tuple[float, float, float]]) -> dict:
    """(threshold, mean loops, loss) per point."""
    return {"criterion": criterion, "max_loops": H, "fixed_loss": 1.0,
            "points": [{"threshold": x, "mean_loops": m, "loss": v, "stderr": 0.01}
                       for x, m, v in points]}


def sweep(step: int, shift: float) -> dict:
    """A sweep whose losses fall with depth; three criteria that exit at several loops, with
    points of different criteria a few pixels apart (labels at one fixed offset collide)."""
    losses = {1: 1.3 + shift, 2: 1.15 + shift, 4: 1.0 + shift}
    by = {
        "kl": section("kl", [(0.0, H, losses[4]), (1e-3, 3.1, 1.04 + shift),
                             (0.01, 2.2, 1.12 + shift), (0.1, 2.2, 1.12 + shift),
                             (1.0, 2.2, 1.12 + shift)]),
        "entropy": section("entropy", [(0.0, H, losses[4]), (0.5, H, losses[4]),
                                       (2.0, 3.0, 1.045 + shift)]),
        "gate": section("gate", [(1.0, H, losses[4]), (0.9, 2.3, 1.118 + shift),
                                 (0.5, 1.2, 1.27 + shift)]),
    }
    return {"step": step, "losses": losses, "stderr": {"1": 0.02, "2": 0.02, "4": 0.02},
            "adaptive_by_criterion": by}


def test_threshold_labels_share_a_point_and_skip_points_without_early_exits():
    doc = sweep(30, 0.0)
    assert threshold_labels(doc["adaptive_by_criterion"]["kl"]) == [
        ("0.001", 3.1, 1.04), ("0.01–1", 2.2, 1.12)]
    assert threshold_labels(doc["adaptive_by_criterion"]["entropy"]) == [("2", 3.0, 1.045)]
    two = section("cosine", [(0.01, 2.0, 1.1), (0.1, 2.0, 1.1), (0.0, H, 1.0)])
    assert threshold_labels(two) == [("0.01, 0.1", 2.0, 1.1)]


def test_last_snapshot_large_earlier_ones_small(tmp_path: Path):
    plain = {"step": 5, "losses": {1: 2.0, 2: 1.9}}  # no adaptive section: no panel
    out = tmp_path / "sub" / "heff_adaptive.png"
    fig = plot_adaptive([plain, sweep(10, 0.4), sweep(20, 0.2), sweep(30, 0.0)], out, "demo")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    main, *small = fig.axes
    assert main.get_title() == "step 30 (last snapshot)"
    assert [ax.get_title() for ax in small] == ["step 10", "step 20"]
    area = main.bbox.width * main.bbox.height
    assert all(ax.bbox.width * ax.bbox.height < area / 3 for ax in small)
    legend = main.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "fixed H_eff", "kl (≤ 4 loops)", "entropy (≤ 4 loops)", "gate (≤ 4 loops)",
        "fixed ± standard error"]
    assert legend.get_window_extent().x0 >= main.bbox.x1  # outside the axes
    lines = {line.get_label(): line for line in main.get_lines()}
    assert lines["fixed H_eff"].get_color() == "black"
    assert list(lines["fixed H_eff"].get_xdata()) == [1, 2, 4]
    assert lines["gate (≤ 4 loops)"].get_color() == STYLE["gate"][0]
    assert list(lines["kl (≤ 4 loops)"].get_xdata()) == [2.2, 2.2, 2.2, 3.1, H]
    for ax, shift in zip(small, (0.4, 0.2), strict=True):  # same loop axis, own loss scale
        assert main.get_shared_x_axes().joined(main, ax)
        low, high = ax.get_ylim()
        assert low < 1.0 + shift and 1.3 + shift < high < 1.3 + shift + 0.1
        assert len(ax.get_lines()) == 4 and not ax.texts


def test_threshold_labels_are_placed_clear_of_each_other_and_the_points(tmp_path: Path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot_adaptive([sweep(30, 0.0)], tmp_path / "a.png")
    (main,) = fig.axes
    renderer = FigureCanvasAgg(fig).get_renderer()  # closed: a canvas to measure text on
    labels = [t for t in main.texts if t.get_text() and t.get_position() != (1.01, 0.0)]
    assert sorted(t.get_text() for t in labels) == ["0.001", "0.01–1", "0.5", "0.9", "2"]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for a, b in combinations(boxes, 2))
    frame = main.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1
               for b in boxes)
    points = [main.transData.transform(xy) for line in main.get_lines()
              for xy in line.get_xydata()]
    assert not any(b.x0 < x < b.x1 and b.y0 < y < b.y1 for b in boxes for x, y in points)
    assert {t.get_color() for t in labels if t.get_text() == "2"} == {STYLE["entropy"][0]}


def test_no_adaptive_results_says_so(tmp_path: Path):
    fig = plot_adaptive([{"step": 1, "losses": {1: 2.0}}], tmp_path / "e.png")
    (main,) = fig.axes
    assert [t.get_text() for t in main.texts] == [
        "no adaptive-exit results\n(eval.adaptive.thresholds is empty)"]
    assert (tmp_path / "e.png").is_file()


def test_spent_points_are_hollow_twins_of_the_needed_ones(tmp_path: Path):
    """Where the sweep has the cached decoder's replay, each criterion also draws its spent
    points (hollow, dashed for latest, dotted for skip) and the legend names each kv_fill."""
    doc = sweep(30, 0.0)
    for p in doc["adaptive_by_criterion"]["kl"]["points"]:
        p["spent"] = {"latest": {"mean_loops": p["mean_loops"] + 0.25, "loss": p["loss"] + 0.01},
                      "skip": {"mean_loops": p["mean_loops"] + 0.5, "loss": p["loss"] + 0.02}}
    fig = plot_adaptive([doc], tmp_path / "a.png")
    main = fig.axes[0]
    lines = {line.get_label(): line for line in main.get_lines()}
    latest, skip = lines["_kl spent, kv_fill latest"], lines["_kl spent, kv_fill skip"]
    assert list(latest.get_xdata()) == [2.45, 2.45, 2.45, 3.35, H + 0.25]
    assert list(skip.get_ydata()) == pytest.approx([1.14, 1.14, 1.14, 1.06, 1.02])
    assert (latest.get_linestyle(), skip.get_linestyle()) == ("--", ":")
    assert latest.get_color() == STYLE["kl"][0] and latest.get_markerfacecolor() == "white"
    assert not any(name.startswith("_entropy spent") for name in lines)  # none in the sweep
    assert [t.get_text() for t in main.get_legend().get_texts()][-2:] == [
        "spent by a cached decoder, kv_fill latest", "spent by a cached decoder, kv_fill skip"]
