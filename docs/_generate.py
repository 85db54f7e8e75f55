"""Draw the images of the docs: the request-flow diagram and the controller charts.

Run it from the repository root after changing a controller or the diagram::

    python docs/_generate.py            # every image
    python docs/_generate.py backoff    # only the named ones

Every chart comes from a real :class:`throttlekit.Limiter` run by
:func:`throttlekit.testing.simulate` against a simulated server in virtual
time (seconds of wall time for minutes of traffic). The runs are seeded and
the PNGs carry no timestamp, so rerunning without a code change rewrites the
same files. Needs matplotlib (``pip install "throttlekit-http[plot]"``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.ticker import FuncFormatter, NullFormatter

import throttlekit
from throttlekit import Adaptive, AutoThrottle, Backoff, Limiter, Rampup, ScopePolicy
from throttlekit.testing import (
    CapacityServer,
    FixedServer,
    QuotaServer,
    SimRequest,
    Trace,
    burst,
    simulate,
    steady,
)

STATIC = Path(__file__).resolve().parent / "_static"
CHARTS = STATIC / "controllers"

BLUE = "#2f6db5"
ORANGE = "#e07b24"
RED = "#c8372d"
GREEN = "#3a8f4b"
GREY = "#777777"
LIGHT = "#eef3fa"

plt.rcParams.update(
    {
        "font.size": 10,
        "axes.titlesize": 11,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "legend.frameon": False,
        "legend.fontsize": 9,
    }
)


def save(figure: Figure, path: Path) -> None:
    """Write ``figure`` as a PNG without a timestamp, so reruns give the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(figure)
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


# -- chart helpers ---------------------------------------------------------------------


def delay_steps(trace: Trace, scope: str) -> tuple[list[float], list[float]]:
    """The effective delay of ``scope`` as a step function ``(times, delays)``."""
    times = [0.0]
    delays = [trace.policies[scope].delay]
    for sample in trace.samples.get(scope, ()):
        times.append(sample.time)
        delays.append(sample.delay)
    times.append(trace.duration)
    delays.append(delays[-1])
    return times, delays


def plot_delay(axes: Axes, trace: Trace, scope: str, label: str, color: str = BLUE) -> None:
    times, delays = delay_steps(trace, scope)
    axes.step(times, delays, where="post", color=color, label=label, linewidth=1.6)


def plot_rate(
    axes: Axes,
    trace: Trace,
    scope: str,
    bucket: float,
    *,
    color: str = BLUE,
    label: str = "sent",
    errors: bool = True,
) -> None:
    """Bars of sends per second, with 429 and 5xx responses stacked in red."""
    timeline = trace.timeline(bucket, scope)
    starts = [b.start for b in timeline]
    widths = [0.9 * (b.end - b.start) for b in timeline]
    ok = [(b.sent - b.throttled - b.errors) / (b.end - b.start) for b in timeline]
    axes.bar(starts, ok, width=widths, align="edge", color=color, label=label, alpha=0.85)
    if errors and any(b.throttled or b.errors for b in timeline):
        bad = [(b.throttled + b.errors) / (b.end - b.start) for b in timeline]
        axes.bar(
            starts,
            bad,
            bottom=ok,
            width=widths,
            align="edge",
            color=RED,
            label="answered 429 / 5xx",
        )


def finish(
    axes: Axes, *, ylabel: str, xlabel: str | None = None, legend: str = "upper right"
) -> None:
    axes.set_ylabel(ylabel)
    if xlabel:
        axes.set_xlabel(xlabel)
    axes.set_ylim(bottom=0)
    axes.legend(loc=legend, frameon=True, facecolor="white", framealpha=0.9, edgecolor="none")


def numbers(trace: Trace, scope: str, start: float) -> str:
    sent = [r for r in trace.sends(scope) if r.sent is not None and r.sent >= start]
    throttled = sum(1 for r in sent if r.status == 429)
    rate = len(sent) / (trace.duration - start)
    return f"{rate:.2f} req/s, {throttled} x 429 after t={start:g} s"


# -- the charts ------------------------------------------------------------------------


def backoff() -> None:
    """An API allowing 5 requests per sliding second, answering 429 (no Retry-After) beyond."""
    server = QuotaServer(limit=5, window=1.0, sliding=True, retry_after=None)
    policy = ScopePolicy(concurrency=4, delay=0.05, slot_delay=0)  # backoff: the defaults
    duration = 600.0
    trace = simulate(
        lambda: Limiter(default=policy, concurrency=None, seed=1),
        server,
        steady("https://api.test/items/{i}", rate=8, duration=duration),
        duration=duration,
        seed=1,
    )
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True)
    plot_delay(top, trace, "api.test", "effective delay of api.test")
    top.axhline(1 / server.rate, color=GREY, linestyle="--", label="the server's pace (0.2 s)")
    finish(top, ylabel="seconds between sends")
    top.set_title("Backoff against an API that allows 5 requests/s (429s without Retry-After)")
    plot_rate(bottom, trace, "api.test", 20.0)
    bottom.axhline(server.rate, color=GREY, linestyle="--", label="server limit (5 req/s)")
    finish(bottom, ylabel="requests/s (20 s bins)", xlabel="time (s)", legend="lower right")
    save(figure, CHARTS / "backoff.png")
    print("  backoff:", numbers(trace, "api.test", 300.0))


def headers() -> None:
    """Two APIs with a quota of 30 requests per 10 s: one says Retry-After, one RateLimit."""
    sites = {
        "retry-after.test": QuotaServer(limit=30, window=10.0, latency=0.1, retry_after="reset"),
        "ratelimit.test": QuotaServer(
            limit=30, window=10.0, latency=0.1, retry_after="reset", rate_limit_headers="ietf"
        ),
    }
    policy = ScopePolicy(concurrency=4, delay=0, slot_delay=0)
    duration = 40.0
    requests = [
        *steady("https://retry-after.test/{i}", rate=12, duration=duration),
        *steady("https://ratelimit.test/{i}", rate=12, duration=duration),
    ]
    trace = simulate(
        lambda: Limiter(default=policy, concurrency=None, seed=2),
        sites,
        requests,
        duration=duration,
        seed=2,
    )
    figure, axes = plt.subplots(2, 1, figsize=(9, 5.4), sharex=True)
    for ax, scope, title in (
        (axes[0], "retry-after.test", "429 + Retry-After: blocked until the window resets"),
        (axes[1], "ratelimit.test", "RateLimit: r=…;t=… — paced when few requests remain"),
    ):
        plot_rate(ax, trace, scope, 1.0, label=f"sent to {scope}")
        blocked = [(s.time, s.stats.blocked_until) for s in trace.samples[scope]]
        spans = [(t, until) for t, until in blocked if until > t]
        for index, (start, until) in enumerate(merge(spans)):
            ax.axvspan(
                start,
                until,
                color=ORANGE,
                alpha=0.18,
                label="scope blocked by the server" if index == 0 else None,
            )
        for edge in range(0, int(duration) + 1, 10):
            ax.axvline(edge, color=GREY, linewidth=0.8, linestyle=":")
        ax.set_title(title)
        finish(ax, ylabel="requests/s")
    axes[1].set_xlabel("time (s); dotted lines: the server's quota windows (30 requests each)")
    save(figure, CHARTS / "headers.png")
    for scope in sites:
        print(f"  headers {scope}:", numbers(trace, scope, 0.0))


def merge(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping ``(start, end)`` spans joined."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def autothrottle() -> None:
    """AutoThrottle on a server whose latency grows with load, and on a fast-429 server."""
    capacity = CapacityServer(workers=2, service_time=0.25)  # 8 requests/s
    latency_policy = ScopePolicy(
        concurrency=8,
        delay=0,
        slot_delay=0,
        autothrottle=AutoThrottle(start_delay=2.0, target_concurrency=2.0),
    )
    duration = 60.0
    loaded = simulate(
        latency_policy,
        capacity,
        steady("https://shop.test/{i}", rate=12, duration=duration),
        duration=duration,
        seed=3,
    )
    fast_429 = QuotaServer(
        limit=1, window=1.0, sliding=True, latency=0.3, reject_latency=0.005, retry_after=None
    )
    runs = {}
    for name, backoff in (("AutoThrottle alone", None), ("AutoThrottle + Backoff", Backoff())):
        policy = ScopePolicy(
            concurrency=8,
            delay=0,
            slot_delay=0,
            backoff=backoff,
            autothrottle=AutoThrottle(start_delay=1.0),
        )
        runs[name] = simulate(
            policy,
            fast_429,
            steady("https://api.test/{i}", rate=4, duration=300.0),
            duration=300.0,
            seed=3,
        )
    figure, axes = plt.subplots(2, 2, figsize=(11, 5.6), sharex="col")
    plot_delay(axes[0][0], loaded, "shop.test", "AutoThrottle delay")
    latency = [(r.sent, r.latency) for r in loaded.sends("shop.test") if r.latency is not None]
    axes[0][0].plot(
        [t for t, _ in latency],
        [value / 2.0 for _, value in latency],
        ".",
        markersize=2,
        color=ORANGE,
        label="latency / target_concurrency",
    )
    axes[0][0].set_title("Latency grows with load (capacity 8 req/s)")
    finish(axes[0][0], ylabel="seconds between sends")
    plot_rate(axes[1][0], loaded, "shop.test", 2.0)
    axes[1][0].axhline(capacity.capacity, color=GREY, linestyle="--", label="capacity")
    finish(axes[1][0], ylabel="requests/s (2 s bins)", xlabel="time (s)", legend="lower right")
    for name, color in (("AutoThrottle alone", ORANGE), ("AutoThrottle + Backoff", BLUE)):
        plot_delay(axes[0][1], runs[name], "api.test", name, color=color)
        timeline = runs[name].timeline(20.0, "api.test")
        axes[1][1].plot(
            [b.start + 10 for b in timeline],
            [b.throttled / (b.end - b.start) for b in timeline],
            marker="o",
            color=color,
            label=f"429s/s, {name}",
        )
    axes[0][1].set_title("Fast 429s (1 req/s allowed, 429 in 5 ms)")
    finish(axes[0][1], ylabel="seconds between sends")
    finish(
        axes[1][1], ylabel="429 responses/s (20 s bins)", xlabel="time (s)", legend="center right"
    )
    save(figure, CHARTS / "autothrottle.png")
    print("  autothrottle loaded:", numbers(loaded, "shop.test", 20.0))
    for name, run in runs.items():
        print(f"  autothrottle {name}:", numbers(run, "api.test", 150.0))


def rampup() -> None:
    """Rampup on a pay-per-request API that allows 20 requests per sliding second."""
    server = QuotaServer(limit=20, window=1.0, sliding=True, latency=0.05, retry_after=None)
    policy = ScopePolicy(concurrency=2, delay=0.5, slot_delay=0, rampup=Rampup(window=10.0))
    duration = 300.0
    trace = simulate(
        lambda: Limiter(default=policy, concurrency=None, seed=4),
        server,
        steady("https://api.test/{i}", rate=24, duration=duration),
        duration=duration,
        seed=4,
    )
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True)
    plot_delay(top, trace, "api.test", "effective delay")
    top.set_yscale("log")
    top.set_yticks([0.04, 0.06, 0.1, 0.2, 0.3, 0.5])
    top.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    top.yaxis.set_minor_formatter(NullFormatter())
    top.set_title("Rampup (window 10 s, target 1 signal per window) on an API allowing 20 req/s")
    top.set_ylabel("seconds between sends (log)")
    top.legend(loc="upper right")
    plot_rate(bottom, trace, "api.test", 10.0)
    bottom.axhline(server.rate, color=GREY, linestyle="--", label="server limit (20 req/s)")
    finish(bottom, ylabel="requests/s (10 s bins)", xlabel="time (s)", legend="lower right")
    save(figure, CHARTS / "rampup.png")
    print("  rampup:", numbers(trace, "api.test", 120.0))


def quota() -> None:
    """A spending cap: 100 units per 60 s window, requests costing 1 to 5 units."""
    budget = ScopePolicy(concurrency=None, delay=0, slot_delay=0, quota=100.0, window=60.0)
    smooth = ScopePolicy(concurrency=None, delay=1.8, slot_delay=0, quota=100.0, window=60.0)
    requests = [
        SimRequest(
            at=index * 0.25,
            url=f"https://api.test/search/{index}",
            scopes={"api.test": 1.0, "budget": float(1 + index % 5)},
        )
        for index in range(960)
    ]
    duration = 240.0
    traces = {}
    for name, policy in (("quota only", budget), ("quota + delay 1.8 s", smooth)):
        traces[name] = simulate(
            lambda policy=policy: Limiter(  # type: ignore[misc]
                scopes={"budget": policy},
                default=ScopePolicy(concurrency=4, delay=0, slot_delay=0),
                concurrency=None,
                seed=5,
            ),
            FixedServer(latency=0.2),
            requests,
            duration=duration,
            seed=5,
        )
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True)
    for (name, trace), color in zip(traces.items(), (BLUE, GREEN), strict=True):
        samples = trace.samples["budget"]
        top.step(
            [0.0, *(s.time for s in samples)],
            [0.0, *(s.stats.quota_used for s in samples)],
            where="post",
            color=color,
            label=f"used in the last 60 s, {name}",
        )
        timeline = trace.timeline(5.0, "budget")
        bottom.step(
            [b.start for b in timeline],
            [b.rate for b in timeline],
            where="post",
            color=color,
            label=name,
        )
    top.axhline(100, color=GREY, linestyle="--", label="quota (100 units / 60 s)")
    top.set_title("A quota caps what a scope spends in any 60 s; a delay spreads it out")
    finish(top, ylabel="cost units", legend="lower right")
    finish(bottom, ylabel="requests/s (5 s bins)", xlabel="time (s)")
    save(figure, CHARTS / "quota.png")
    for name, trace in traces.items():
        print(f"  quota {name}:", numbers(trace, "budget", 0.0))


def crawl_delay() -> None:
    """Two sites under the same default policy; one robots.txt says Crawl-delay: 2."""

    def limiter() -> Limiter:
        made = Limiter(default=ScopePolicy(concurrency=4, delay=0.25, slot_delay=0), seed=6)
        made.set_crawl_delay("slow.test", 2.0)
        return made

    requests = [*burst("https://slow.test/{i}", 40), *burst("https://fast.test/{i}", 300)]
    servers = {"slow.test": FixedServer(latency=0.3), "fast.test": FixedServer(latency=0.3)}
    trace = simulate(limiter, servers, requests, duration=60.0, seed=6)
    figure, axes = plt.subplots(1, 1, figsize=(9, 3.2))
    for scope, color in (("fast.test", BLUE), ("slow.test", ORANGE)):
        times = trace.send_times(scope)
        axes.step(
            times,
            range(1, len(times) + 1),
            where="post",
            color=color,
            label=f"{scope}: {len(times) / 60:.2f} req/s",
        )
    axes.set_title("set_crawl_delay('slow.test', 2.0): concurrency 1, one send every 2 s")
    finish(axes, ylabel="requests sent", xlabel="time (s)")
    axes.legend(loc="upper left")
    save(figure, CHARTS / "crawl-delay.png")


# -- the request-flow diagram ----------------------------------------------------------


def box(
    axes: Axes,
    x: float,
    y: float,
    width: float,
    height: float,
    title: str,
    body: str = "",
    *,
    color: str = LIGHT,
    edge: str = BLUE,
    size: float = 9.5,
) -> None:
    axes.add_patch(
        FancyBboxPatch(
            (x, y),
            width,
            height,
            boxstyle="round,pad=0.012,rounding_size=0.015",
            facecolor=color,
            edgecolor=edge,
            linewidth=1.3,
        )
    )
    if body:
        axes.text(
            x + width / 2,
            y + height - 0.022,
            title,
            ha="center",
            va="top",
            fontsize=size + 0.5,
            fontweight="bold",
        )
        axes.text(
            x + width / 2,
            y + height - 0.06,
            body,
            ha="center",
            va="top",
            fontsize=size - 0.5,
            linespacing=1.35,
        )
    else:
        axes.text(
            x + width / 2, y + height / 2, title, ha="center", va="center", fontsize=size + 0.5
        )


def arrow(
    axes: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str = "",
    *,
    color: str = "#333333",
    curve: float = 0.0,
    offset: tuple[float, float] = (0.0, 0.012),
) -> None:
    axes.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=14,
            color=color,
            linewidth=1.4,
            connectionstyle=f"arc3,rad={curve}",
        )
    )
    if label:
        axes.text(
            (start[0] + end[0]) / 2 + offset[0],
            (start[1] + end[1]) / 2 + offset[1],
            label,
            ha="center",
            va="bottom",
            fontsize=8.5,
            color=color,
            style="italic",
        )


def diagram() -> None:
    """How one request flows through throttlekit."""
    figure = plt.figure(figsize=(12.5, 6.6))
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.axis("off")

    # Top row: from the request to its scopes.
    box(
        axes,
        0.015,
        0.70,
        0.19,
        0.22,
        "1  request-like",
        "a URL string, httpx.Request,\naiohttp ClientRequest,\nscrapy.Request …\n"
        "(throttling_scopes in meta\nor extensions overrides)",
    )
    box(
        axes,
        0.245,
        0.70,
        0.20,
        0.22,
        "2  resolver",
        "by_host (default)\nby_registrable_domain\n"
        "by_domain_hierarchy\nby_endpoint · your function",
    )
    box(
        axes,
        0.485,
        0.70,
        0.19,
        0.22,
        "3  {scope: cost}",
        "{'books.toscrape.com': 1,\n 'toscrape.com': 1,\n 'api-budget': 2.5}",
    )
    arrow(axes, (0.205, 0.81), (0.245, 0.81))
    arrow(axes, (0.445, 0.81), (0.485, 0.81))

    # The limiter: scheduler and one ledger per scope.
    axes.add_patch(
        FancyBboxPatch(
            (0.715, 0.08),
            0.27,
            0.86,
            boxstyle="round,pad=0.012,rounding_size=0.02",
            facecolor="#fbfbfb",
            edgecolor=GREY,
            linewidth=1.2,
            linestyle="--",
        )
    )
    axes.text(0.85, 0.915, "4  Limiter.acquire()", ha="center", fontsize=11, fontweight="bold")
    box(
        axes,
        0.73,
        0.70,
        0.24,
        0.19,
        "scheduler",
        "grants when every scope and\nthe global cap allow it, all at once;\n"
        "priority, then first come first served;\none timer, no polling",
        color="#f3f7ee",
        edge=GREEN,
    )
    box(
        axes,
        0.73,
        0.37,
        0.24,
        0.29,
        "ledger (one per scope)",
        "policy: concurrency, delay,\nslot_delay, jitter, quota / window\n\n"
        "live state: in flight, last sends,\nquota used, blocked-until\n\n"
        "effective delay / concurrency\n= policy moved by controllers",
    )
    box(
        axes,
        0.73,
        0.10,
        0.24,
        0.23,
        "controllers (per scope)",
        "Backoff (429/5xx/timeouts,\nRetry-After, RateLimit)\nAutoThrottle (latency)\n"
        "Rampup (probe for more)\nyour own Controller",
        color="#fdf3ea",
        edge=ORANGE,
    )
    arrow(axes, (0.675, 0.81), (0.73, 0.81), "wait")
    arrow(axes, (0.85, 0.70), (0.85, 0.66))
    arrow(axes, (0.85, 0.33), (0.85, 0.37), color=ORANGE)

    # Bottom row: the permit's life, right to left.
    box(
        axes,
        0.485,
        0.40,
        0.19,
        0.17,
        "5  Permit",
        "permit.scopes: what was\ngranted and at what cost\n(async with … as permit)",
    )
    box(
        axes,
        0.245,
        0.40,
        0.20,
        0.17,
        "6  send the request",
        "your code, or an adapter:\nhttpx transport, aiohttp\nmiddleware, Scrapy middleware",
    )
    box(
        axes,
        0.015,
        0.40,
        0.19,
        0.17,
        "7  response / error",
        "status, headers,\nlatency, size — or a\ntimeout, a dropped connection",
    )
    box(
        axes,
        0.245,
        0.10,
        0.43,
        0.17,
        "8  permit.record(response, consumed=…)",
        "→ Feedback(status, headers, rate_limit, latency, exception, sent_at)\n"
        "for every scope of the permit; consumed= corrects the quota",
        color="#fdf3ea",
        edge=ORANGE,
    )
    arrow(axes, (0.73, 0.45), (0.675, 0.48), "grant")
    arrow(axes, (0.485, 0.485), (0.445, 0.485))
    arrow(axes, (0.245, 0.485), (0.205, 0.485))
    arrow(axes, (0.11, 0.40), (0.245, 0.19), curve=0.25)
    arrow(axes, (0.675, 0.19), (0.73, 0.20), "feedback", color=ORANGE, offset=(0.0, 0.02))
    axes.text(
        0.57,
        0.035,
        "9  leaving the async with block releases the concurrency — also on errors and "
        "cancellation; controllers move the next delay",
        ha="center",
        fontsize=9,
        color=GREY,
    )
    save(figure, STATIC / "request-flow.png")


def adaptive() -> None:
    """A 20/s API whose quota drops to 10/s and rises to 30/s, bare 429s; Adaptive vs Backoff."""
    server = QuotaServer(
        limit=20,
        window=1.0,
        sliding=True,
        retry_after=None,
        latency=0.02,
        reject_latency=0.001,
        changes=((60.0, 10), (120.0, 30)),
    )
    duration = 180.0
    figure, axes = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True)
    for ax, label, policy in (
        (axes[0], "Adaptive", ScopePolicy(concurrency=16, delay=0, adaptive=Adaptive())),
        (axes[1], "Backoff alone (0.1)", ScopePolicy(concurrency=16, delay=0)),
    ):
        trace = simulate(
            lambda policy=policy: Limiter(default=policy, concurrency=None, seed=1),
            server,
            burst("https://api.test/items/{i}", 10_000),
            duration=duration,
            seed=1,
        )
        plot_rate(ax, trace, "api.test", 2.0, label=f"{label}: sent")
        ax.step(
            [0, 60, 120, duration], [20, 10, 30, 30], where="post", color=GREY, linestyle="--",
            label="server limit",
        )  # fmt: skip
        finish(ax, ylabel="requests/s (2 s bins)", legend="upper left")
        print(f"  adaptive ({label}):", numbers(trace, "api.test", 0.0))
    axes[0].set_title("A quota of 20/s that drops to 10/s and rises to 30/s (bare 429s)")
    axes[1].set_xlabel("time (s)")
    save(figure, CHARTS / "adaptive.png")


IMAGES: dict[str, Callable[[], None]] = {
    "diagram": diagram,
    "backoff": backoff,
    "headers": headers,
    "autothrottle": autothrottle,
    "rampup": rampup,
    "adaptive": adaptive,
    "quota": quota,
    "crawl-delay": crawl_delay,
}


def main(argv: Sequence[str]) -> int:
    names = list(argv) or list(IMAGES)
    unknown = [name for name in names if name not in IMAGES]
    if unknown:
        print(f"unknown image(s) {unknown}; choose from {sorted(IMAGES)}", file=sys.stderr)
        return 2
    print(f"throttlekit {throttlekit.__version__}")
    for name in names:
        IMAGES[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
