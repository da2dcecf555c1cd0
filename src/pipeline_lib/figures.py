"""The figures' matplotlib: pyplot on the Agg backend, imported on first use (~0.3 s that the
CLI's ``--help`` and the jobs that draw nothing never pay), and one way to write a figure."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot``, with the Agg backend set before it loads (no display needed)."""
    import matplotlib  # matplotlib (~0.3 s): only drawing needs it (see the module docstring)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # as above: Agg is set first

    return plt


def save_figure(fig: Any, out: Path) -> Any:
    """Write ``fig`` to ``out`` (its folder made) at 110 dpi and return it; a figure pyplot
    made is closed (pyplot holds it until then), a plain ``Figure`` needs no closing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    if "matplotlib.pyplot" in sys.modules:  # loaded: pyplot may hold this figure
        sys.modules["matplotlib.pyplot"].close(fig)
    return fig
