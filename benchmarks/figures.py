"""Figures of the results page: line charts described in a suite's JSON, drawn with matplotlib.

A suite puts figure specs in ``data["figures"]``; the results JSON keeps the
numbers, and ``python -m benchmarks.report`` turns each spec into a
``.. figure::`` on the page (:func:`figure_rst`) and a PNG next to it
(:func:`draw_figures`), so the plot always shows the numbers of the tables.

A spec::

    {
        "image": "_static/benchmarks/name.png",  # relative to the page's directory
        "alt": "...", "caption": "...",
        "panels": [
            {
                "title": "...", "xlabel": "...", "ylabel": "...",
                "lines": [{"label": "...", "x": [...], "y": [...]}],  # "style": "dashed"
                "hlines": [{"y": 10.0, "label": "capacity"}],
            },
        ],
    }
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["draw_figures", "figure_rst", "figures_of"]

_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\*`|_[]<>"})


def _text(value: Any) -> str:
    """Plain text on one line, safe for reStructuredText inline content."""
    return " ".join(str(value).split()).translate(_SPECIAL)


def figures_of(document: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """Every figure spec of every suite of a results ``document``."""
    for suite in document.get("suites", {}).values():
        yield from suite.get("data", {}).get("figures", [])


def figure_rst(figure: dict[str, Any]) -> list[str]:
    """The reStructuredText lines of one figure."""
    alt = " ".join(str(figure.get("alt", "")).split())
    caption = _text(figure.get("caption", ""))
    lines = [f".. figure:: {figure['image']}", "   :width: 100%"]
    if alt:
        lines.append(f"   :alt: {alt}")
    lines.append("")
    if caption:
        lines += [f"   {caption}", ""]
    return lines


def draw_figures(document: dict[str, Any], directory: Path) -> list[Path]:
    """Draw every figure of ``document`` as a PNG under ``directory`` (the page's directory).

    Returns the files written. Does nothing (and returns ``[]``) without
    matplotlib, which the ``plot`` extra installs.
    """
    figures = list(figures_of(document))
    if not figures:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return []
    written = []
    for figure in figures:
        panels = figure.get("panels", [])
        if not panels:
            continue
        columns = 2 if len(panels) > 1 else 1
        rows = math.ceil(len(panels) / columns)
        fig, axes = pyplot.subplots(
            rows, columns, figsize=(6.0 * columns, 3.4 * rows), squeeze=False
        )
        for axis, panel in zip(axes.flat, panels, strict=False):
            for line in panel.get("lines", []):
                if line.get("style") == "dashed":
                    axis.plot(
                        line["x"],
                        line["y"],
                        label=line["label"],
                        color="0.4",
                        linestyle="--",
                        linewidth=1.0,
                        drawstyle="steps-mid",
                    )
                else:
                    axis.plot(line["x"], line["y"], label=line["label"], linewidth=1.4)
            for hline in panel.get("hlines", []):
                axis.axhline(
                    hline["y"], color="0.4", linestyle="--", linewidth=1.0, label=hline["label"]
                )
            axis.set_title(panel.get("title", ""), fontsize=9)
            axis.set_xlabel(panel.get("xlabel", ""), fontsize=8)
            axis.set_ylabel(panel.get("ylabel", ""), fontsize=8)
            axis.tick_params(labelsize=8)
            axis.set_ylim(bottom=0)
            axis.grid(True, linewidth=0.3)
            axis.legend(fontsize=7, loc="best")
        for axis in list(axes.flat)[len(panels) :]:
            axis.set_visible(False)
        fig.tight_layout()
        path = directory / figure["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        # No metadata: the same numbers give the same bytes.
        fig.savefig(path, dpi=110, metadata={"Software": None})
        pyplot.close(fig)
        written.append(path)
    return written
