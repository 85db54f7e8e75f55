"""Terminal charts (unicode sparklines) and PNG plots of a simulation trace."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from ._common import CLIError

if TYPE_CHECKING:
    from ..testing import Bucket, Trace

__all__ = ["chart_table", "check_plotting", "plot_png", "sparkline"]

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], *, low: float | None = None) -> str:
    """One character per value, eight heights; ``nan`` is a blank, 0 the lowest block.

    The scale runs from ``low`` (default: 0, or the smallest value if negative)
    to the largest value.
    """
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return " " * len(values)
    bottom = min(0.0, *finite) if low is None else low
    top = max(finite)
    span = top - bottom
    characters = []
    for value in values:
        if not math.isfinite(value):
            characters.append(" ")
        elif span <= 0:
            characters.append(_BLOCKS[0] if top == 0 else _BLOCKS[-1])
        else:
            level = round((value - bottom) / span * (len(_BLOCKS) - 1))
            characters.append(_BLOCKS[max(0, min(len(_BLOCKS) - 1, level))])
    return "".join(characters)


def _series(buckets: Sequence[Bucket]) -> dict[str, list[float]]:
    return {
        "sent/s": [bucket.rate for bucket in buckets],
        "ok/s": [bucket.ok / (bucket.end - bucket.start) for bucket in buckets],
        "429/s": [bucket.throttled / (bucket.end - bucket.start) for bucket in buckets],
        "errors/s": [bucket.errors / (bucket.end - bucket.start) for bucket in buckets],
        "delay s": [bucket.delay for bucket in buckets],
    }


def _label(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3g}"


def chart_table(trace: Trace, width: int) -> Table:
    """Rate, errors and delay over time, per scope, as rows of sparklines."""
    count = max(10, width)
    bucket = max(trace.duration / count, 1e-9)
    table = Table(
        title=f"over time: 0 → {trace.duration:g} s, {bucket:.3g} s per column",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    table.add_column("scope", style="bold")
    table.add_column("series")
    table.add_column("chart", no_wrap=True)
    table.add_column("max", justify="right")
    scopes = trace.scopes or [""]
    for scope in scopes:
        buckets = trace.timeline(bucket, scope or None)
        for index, (name, values) in enumerate(_series(buckets).items()):
            finite = [value for value in values if math.isfinite(value)]
            style = "red" if name in ("429/s", "errors/s") and any(finite) else "cyan"
            table.add_row(
                scope if index == 0 else "",
                name,
                Text(sparkline(values), style=style),
                _label(max(finite) if finite else math.nan),
            )
    return table


def check_plotting() -> None:
    """Fail early, with the install hint, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CLIError(
            '--plot needs matplotlib, which is not installed: pip install "throttlekit-http[plot]"'
        ) from None


def allowed_rate(model: object, times: list[float]) -> list[float] | None:
    """What a server model allows, in requests per second at each of ``times``, if it says."""
    rate_at = getattr(model, "rate_at", None)
    if callable(rate_at):
        return [float(rate_at(time)) for time in times]
    capacity = getattr(model, "capacity", None)
    if isinstance(capacity, (int, float)) and math.isfinite(capacity):
        return [float(capacity)] * len(times)
    return None


def plot_png(
    trace: Trace, path: Path, title: str, servers: Mapping[str, object] | None = None
) -> None:
    """Write rate, errors and delay over time as a PNG (matplotlib, no display needed).

    ``servers`` maps a scope to its server model: what the server allows is
    drawn on the rate chart as a dotted reference line.
    """
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    bucket = max(trace.duration / 120, 1e-9)
    figure, (rates, errors, delays) = pyplot.subplots(
        3, 1, sharex=True, figsize=(9, 7), constrained_layout=True
    )
    for scope in trace.scopes:
        buckets = trace.timeline(bucket, scope)
        series = _series(buckets)
        times = [item.start for item in buckets]
        rates.step(times, series["sent/s"], where="post", label=f"{scope} sent")
        rates.step(times, series["ok/s"], where="post", linestyle="--", label=f"{scope} ok")
        allowed = allowed_rate((servers or {}).get(scope), times)
        if allowed is not None:
            rates.step(
                times, allowed, where="post", linestyle=":", color="black",
                label=f"{scope}: the server allows",
            )  # fmt: skip
        errors.step(times, series["429/s"], where="post", label=f"{scope} 429")
        errors.step(times, series["errors/s"], where="post", label=f"{scope} 5xx/failures")
        delays.step(times, series["delay s"], where="post", label=scope)
    rates.set_ylabel("requests/s")
    errors.set_ylabel("errors/s")
    delays.set_ylabel("effective delay (s)")
    delays.set_xlabel("virtual time (s)")
    for axes in (rates, errors, delays):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best", fontsize="small")
    figure.suptitle(title)
    try:
        figure.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise CLIError(f"cannot write {str(path)!r}: {exc.strerror}") from None
    finally:
        pyplot.close(figure)
