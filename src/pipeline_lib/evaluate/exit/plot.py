"""The adaptive-exit figure (``eval/heff_adaptive.png``): loss against loops used per token.

Every configured criterion is drawn on the same loss-vs-loops axes as the fixed H_eff
losses, so one reads off whether an exit rule reaches a fixed depth's loss with fewer loops
on average. The last snapshot gets the large panel: its fixed-H_eff losses in black
(loops = H_eff) and one colour and marker per criterion (one point per threshold, labelled
with it). Earlier snapshots get small panels below, with the same encoding and loop axis but
each its own loss scale (training moves the whole curve more than depth or exit rules move
it, so a shared scale would flatten every panel), and no threshold labels. The legend sits
outside the axes.

A criterion's filled markers are what each token needs (the one-pass exits); where the
sweep has them, hollow markers of the same colour and shape are what a cached decoder
spends under each ``kv_fill`` (the replay, :mod:`.replay`): its mean loops computed and the
loss of its predictions, ``latest`` on a dashed line, ``skip`` on a dotted one. A point
whose hollow twin sits on it costs the decoder what the token needs.

Labels avoid each other and the points: each tries offsets around its point, nearest first,
and takes the first whose box is free (a thin leader line when it had to move away).
Thresholds of one criterion that land on the same point share a label; points where no
token exits early (the never-exit threshold, 0 or gate's 1, and any other that exits no
token) sit on the fixed point at the maximum loops and are left unlabelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...figures import pyplot, save_figure

STYLE = {"kl": ("#0072B2", "s"), "entropy": ("#E69F00", "^"), "latent_diff": ("#009E73", "D"),
         "cosine": ("#CC79A7", "v"), "argmax_stable": ("#D55E00", "P"),
         "gate": ("#56B4E9", "*")}  # Okabe–Ito colours (colour-blind safe), one marker each
_OTHER = ("#666666", "o")
SPENT_LINES = {"latest": "--", "skip": ":"}  # a cached decoder's points: hollow, these lines
PER_ROW = 3  # small panels per row
_NEAR, _FAR = 4, 11  # label offsets from the point (points)
_LABEL_BOX = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
              "alpha": 0.75}
_OFFSETS = [(dx * r, dy * r, ha, va) for r in (_NEAR, _FAR, 2 * _FAR) for dx, dy, ha, va in (
    (1, 0.6, "left", "bottom"), (1, -0.6, "left", "top"), (-1, 0.6, "right", "bottom"),
    (-1, -0.6, "right", "top"), (0, 1.2, "center", "bottom"), (0, -1.2, "center", "top"))]


def sections(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The adaptive sections of one sweep, one per criterion: ``adaptive_by_criterion``, or
    the lone ``adaptive`` of sweeps written before several criteria."""
    if doc.get("adaptive_by_criterion"):
        return list(doc["adaptive_by_criterion"].values())
    return [doc["adaptive"]] if doc.get("adaptive") else []


def plot_adaptive(sweeps: Sequence[dict[str, Any]], out: Path, title: str = "") -> Any:
    """Write the figure of the sweeps that have adaptive sections to ``out``; returns the
    (closed) matplotlib figure."""
    plt = pyplot()
    shown = [doc for doc in sweeps if sections(doc)]
    n_small = max(len(shown) - 1, 0)
    rows, cols = -(-n_small // PER_ROW), max(1, min(n_small, PER_ROW))
    fig = plt.figure(figsize=(10, 5 + 2.6 * rows), layout="constrained")
    grid = fig.add_gridspec(1 + rows, cols, height_ratios=[5] + [2.6] * rows)
    main = fig.add_subplot(grid[0, :])
    small = [fig.add_subplot(grid[1 + i // cols, i % cols], sharex=main)
             for i in range(n_small)]
    fig.suptitle(title or "adaptive exit vs fixed depth")
    if not shown:
        main.text(0.5, 0.5, "no adaptive-exit results\n(eval.adaptive.thresholds is empty)",
                  ha="center", va="center", transform=main.transAxes)
    else:
        _draw_all(fig, main, small, shown)
    return save_figure(fig, out)


def _draw_all(fig: Any, main: Any, small: Sequence[Any], shown: Sequence[dict]) -> None:
    *earlier, last = shown
    _panel(main, last, f"step {last.get('step')}" + (" (last snapshot)" if earlier else ""))
    for ax, doc in zip(small, earlier, strict=True):
        _panel(ax, doc, f"step {doc.get('step')}", small=True)
    hs = sorted({int(h) for doc in shown for h in doc["losses"]})
    main.set_xscale("log", base=2)
    main.set_xticks(hs, [str(h) for h in hs])
    main.minorticks_off()
    main.set_xlabel("loops per token (fixed: H_eff; adaptive: mean exit loop, needed or spent)")
    main.set_ylabel("validation loss (nats/token)")
    handles, labels = main.get_legend_handles_labels()
    spent = _spent_legend(last, handles, labels)
    main.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                borderaxespad=0.0, fontsize="small")
    main.text(1.01, 0.0, "beside each point: its threshold\nunlabelled: no token exits early\n"
              "(the never-exit threshold, 0 or\ngate's 1, is the fixed loss at max)" + (
                  "\nfilled: loops each token needs\n(one pass, every loop computed)\n"
                  "hollow: what a cached decoder\nspends (its own exits and loss)" if spent else ""),
              transform=main.transAxes, fontsize="x-small", va="bottom", ha="left")
    fig.canvas.draw()  # constrained layout places the axes once; labels go in after it
    fig.set_layout_engine("none")
    _label_thresholds(main, sections(last), fig.canvas.get_renderer())


def _spent_legend(doc: dict[str, Any], handles: list, labels: list) -> bool:
    """One grey legend entry per ``kv_fill`` drawn (the colour names the criterion); whether
    there is any."""
    from matplotlib.lines import Line2D  # as in plot_adaptive: matplotlib only when drawing

    drawn = {fill for section in sections(doc) for p in section["points"]
             for fill in p.get("spent", {})}
    for fill, style in SPENT_LINES.items():
        if fill in drawn:
            handles.append(Line2D([], [], color="#666666", marker="o", markerfacecolor="white",
                                  linestyle=style))
            labels.append(f"spent by a cached decoder, kv_fill {fill}")
    return bool(drawn)


def _spent_points(ax: Any, section: dict[str, Any], size: float) -> None:
    """Hollow markers (mean loops computed, loss) of a cached decoder, per ``kv_fill``."""
    colour, marker = STYLE.get(section["criterion"], _OTHER)
    for fill, style in SPENT_LINES.items():
        spent = sorted((p["spent"][fill] for p in section["points"] if fill in p.get("spent", {})),
                       key=lambda s: s["mean_loops"])
        if spent:
            ax.plot([s["mean_loops"] for s in spent], [s["loss"] for s in spent], color=colour,
                    marker=marker, markersize=size, markerfacecolor="white", linestyle=style,
                    linewidth=0.9, alpha=0.9,
                    label=f"_{section['criterion']} spent, kv_fill {fill}")  # _: no legend


def _panel(ax: Any, doc: dict[str, Any], name: str, small: bool = False) -> None:
    """The fixed H_eff curve (black) and every criterion's points of one sweep; a grey band
    of ± the fixed losses' standard error, which does not set the loss scale (it is wider
    than the differences between depths and exit rules, whose paired intervals are in the
    table; bars on every point would hide the points)."""
    hs = sorted(int(h) for h in doc["losses"])
    fixed = [doc["losses"][h] for h in hs]
    size = 3.5 if small else 6
    ax.plot(hs, fixed, color="black", marker="o", markersize=size, label="fixed H_eff",
            zorder=3)
    for section in sections(doc):
        colour, marker = STYLE.get(section["criterion"], _OTHER)
        points = sorted(section["points"], key=lambda p: (p["mean_loops"], p["threshold"]))
        ax.plot([p["mean_loops"] for p in points], [p["loss"] for p in points], color=colour,
                marker=marker, markersize=size, linewidth=1.0 if small else 1.4, alpha=0.9,
                label=f"{section['criterion']} (≤ {section['max_loops']} loops)")
        _spent_points(ax, section, size)
    ax.margins(y=0.12)
    ax.autoscale_view()
    ax.set_autoscaley_on(False)  # the band below keeps the points' scale
    stderr = [doc.get("stderr", {}).get(str(h), 0.0) for h in hs]
    ax.fill_between(hs, [v - e for v, e in zip(fixed, stderr, strict=True)],
                    [v + e for v, e in zip(fixed, stderr, strict=True)], color="black",
                    alpha=0.08, linewidth=0, label="fixed ± standard error")
    ax.set_title(name, fontsize="small" if small else "medium")
    ax.grid(True, alpha=0.25)


def threshold_labels(section: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(text, mean loops, loss) of one criterion's labels: thresholds on the same point
    share one ("a, b", or "a–c" for three or more); points where no token exits early
    (mean loops = max loops) get none."""
    groups: dict[tuple[float, float], list[float]] = {}
    for p in section["points"]:
        if p["mean_loops"] < section["max_loops"]:
            groups.setdefault((p["mean_loops"], p["loss"]), []).append(p["threshold"])
    out = []
    for (loops, loss), xs in groups.items():
        xs = sorted(xs)
        text = f"{xs[0]:g}–{xs[-1]:g}" if len(xs) > 2 else ", ".join(f"{x:g}" for x in xs)
        out.append((text, loops, loss))
    return out


def _label_thresholds(ax: Any, secs: Sequence[dict[str, Any]], renderer: Any) -> None:
    """Threshold labels in each criterion's colour, placed clear of each other, of the
    panel's points and inside the axes."""
    frame = ax.get_window_extent(renderer)
    taken = [_point_box(ax, x, y) for line in ax.get_lines() for x, y in line.get_xydata()]
    for section in secs:
        colour, _ = STYLE.get(section["criterion"], _OTHER)
        for text, loops, loss in threshold_labels(section):
            taken.append(_place(ax, text, (loops, loss), colour, taken, frame, renderer))


def _place(ax: Any, text: str, xy: tuple[float, float], colour: str, taken: list,
           frame: Any, renderer: Any) -> Any:
    """Annotate ``xy`` at the first free offset (else the least crowded); its box."""
    label = ax.annotate(text, xy, xytext=_OFFSETS[0][:2], textcoords="offset points",
                        fontsize=7, color=colour, bbox=_LABEL_BOX)
    best = None
    for i, (dx, dy, ha, va) in enumerate(_OFFSETS):
        label.xyann = (dx, dy)
        label.set_ha(ha)
        label.set_va(va)
        box = label.get_window_extent(renderer)
        clash = sum(box.overlaps(other) for other in taken) + (0 if _inside(box, frame) else 99)
        if best is None or clash < best[0]:
            best = (clash, i, box)
        if clash == 0:
            break
    _, i, box = best
    dx, dy, ha, va = _OFFSETS[i]
    label.xyann = (dx, dy)
    label.set_ha(ha)
    label.set_va(va)
    if abs(dx) > _NEAR or abs(dy) > 1.2 * _NEAR:  # moved away: a leader line to its point
        label.remove()
        label = ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=7,
                            color=colour, ha=ha, va=va, bbox=_LABEL_BOX, arrowprops={
                                "arrowstyle": "-", "color": colour, "lw": 0.5,
                                "shrinkA": 0, "shrinkB": 3})
    return box


def _point_box(ax: Any, x: float, y: float, half: float = 6.0) -> Any:
    from matplotlib.transforms import Bbox  # as in plot_adaptive: matplotlib only when drawing

    px, py = ax.transData.transform((x, y))
    return Bbox.from_extents(px - half, py - half, px + half, py + half)


def _inside(box: Any, frame: Any) -> bool:
    return (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
            and box.y1 <= frame.y1)
