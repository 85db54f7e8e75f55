"""``throttlekit simulate``: a policy against a server model, in virtual time."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import attrs
import typer
from rich.markup import escape
from rich.table import Table

from .._limiter import Limiter
from ..testing import (
    QuotaServer,
    ServerModel,
    SimRequest,
    Sites,
    Trace,
    burst,
    check_respects,
    poisson,
    simulate,
)
from ._charts import chart_table, check_plotting, plot_png
from ._common import (
    EXIT_FAILED,
    CLIError,
    build_limiter,
    describe_policy,
    describe_server,
    make_console,
    parse_assignment,
    parse_server,
    print_wrapped,
    read_toml,
    server_from_table,
    split_config,
)

__all__ = ["simulate_command"]

_TABLE_KEYS = ("duration", "requests", "rate", "seed", "server", "sites")
_DEFAULT_SERVER = QuotaServer(limit=5, window=1.0)
#: Without a config file: 8 at a time and no delay, faster than the default
#: server allows, so that the run shows throttling at work.
_DEFAULT_POLICY = {
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_DELAY": 0.0,
    "DOWNLOAD_DELAY_PER_SLOT": 0.0,
}


@attrs.frozen
class _Plan:
    settings: dict[str, Any]
    server: ServerModel
    hosts: tuple[str, ...]
    requests: int | None
    rate: float | None
    duration: float
    seed: int
    description: str


def _number(table: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CLIError(f"{where}: {key} must be a number, got {value!r}")
    if kind is int and value != int(value):
        raise CLIError(f"{where}: {key} must be a whole number, got {value!r}")
    return kind(value)


def _server_of(value: Any, where: str) -> ServerModel:
    if isinstance(value, str):
        return parse_server(value, where)
    return server_from_table(value, where)


def _plan(
    config: Path | None,
    server: str | None,
    sites: list[str],
    settings_flags: dict[str, Any],
    delay: float | None,
    requests: int | None,
    rate: float | None,
    duration: float | None,
    seed: int | None,
) -> _Plan:
    settings: dict[str, Any] = {}
    table: dict[str, Any] = {}
    where = "simulate"
    if config is not None:
        where = str(config)
        settings, table = split_config(read_toml(config), "simulate", where, _TABLE_KEYS)
    settings.update(settings_flags)
    if delay is not None:
        settings["DOWNLOAD_DELAY"] = delay
        settings.setdefault("DOWNLOAD_DELAY_PER_SLOT", delay)
    if config is None:
        for name, value in _DEFAULT_POLICY.items():
            settings.setdefault(name, value)

    models: dict[str, ServerModel] = {}
    if sites:
        for item in sites:
            host, sep, spec = item.partition("=")
            if not sep or not host.strip():
                raise CLIError(f"--site expects HOST=SERVER, got {item!r}")
            models[host.strip().lower()] = parse_server(spec, f"--site {host.strip()}")
    elif server is not None:
        models["site.test"] = parse_server(server, "--server")
    elif "sites" in table:
        if not isinstance(table["sites"], Mapping) or not table["sites"]:
            raise CLIError(f"{where}: [simulate.sites] must map host names to servers")
        for host, value in table["sites"].items():
            models[str(host).lower()] = _server_of(value, f"{where}: [simulate.sites.{host}]")
    elif "server" in table:
        models["site.test"] = _server_of(table["server"], f"{where}: [simulate.server]")
    else:
        models["site.test"] = _DEFAULT_SERVER

    requests = requests if requests is not None else _number(table, "requests", where, int)
    rate = rate if rate is not None else _number(table, "rate", where, float)
    duration = duration if duration is not None else _number(table, "duration", where, float)
    seed = seed if seed is not None else _number(table, "seed", where, int)
    duration = 300.0 if duration is None else duration
    if not (math.isfinite(duration) and duration > 0):
        raise CLIError(f"duration must be > 0 seconds, got {duration!r}")
    if requests is not None and requests < 1:
        raise CLIError(f"requests must be >= 1, got {requests!r}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise CLIError(f"rate must be > 0 requests per second, got {rate!r}")
    hosts = tuple(models)
    if rate is None:
        count = requests if requests is not None else 2000
        description = f"{count} requests queued at t=0 (a crawl backlog)"
        requests = count
    else:
        description = f"requests arriving at {rate:g}/s on average (Poisson)"
        if requests is not None:
            description += f", at most {requests}"
    if len(hosts) > 1:
        description += f", spread over {len(hosts)} sites"
    server_model: ServerModel = Sites(models)
    return _Plan(
        settings=settings,
        server=server_model,
        hosts=hosts,
        requests=requests,
        rate=rate,
        duration=duration,
        seed=0 if seed is None else seed,
        description=description,
    )


def _workload(plan: _Plan) -> list[SimRequest]:
    hosts = plan.hosts
    if plan.rate is None:
        assert plan.requests is not None
        backlog = burst("https://backlog/{i}", plan.requests)
        return [
            attrs.evolve(request, url=f"https://{hosts[index % len(hosts)]}/page/{index}")
            for index, request in enumerate(backlog)
        ]
    arrivals = poisson("https://x/", rate=plan.rate, duration=plan.duration, seed=plan.seed)
    if plan.requests is not None:
        arrivals = arrivals[: plan.requests]
    return [
        attrs.evolve(request, url=f"https://{hosts[index % len(hosts)]}/page/{index}")
        for index, request in enumerate(arrivals)
    ]


def _summary(trace: Trace) -> Table:
    # Borderless, each cell on one line: the ten columns fit in 80 (a boxed
    # table squeezed its labels to "settl…" there).
    table = Table(title="summary", title_justify="left", box=None, pad_edge=False, padding=(0, 1))
    for name in (
        "scope",
        "sent",
        "ok",
        "429",
        "errors",
        "ok/s",
        "mean\ndelay",
        "final\ndelay",
        "settled",
        "backoff",
    ):
        if name == "scope":  # a long name folds over lines rather than squeeze the numbers
            table.add_column(name, justify="left", overflow="fold")
        else:
            widest = max(len(part) for part in name.split("\n"))
            table.add_column(name, justify="right", no_wrap=True, min_width=widest)
    rows = list(trace.scopes)
    if len(rows) > 1:
        rows.append("")
    for scope in rows:
        names = [scope] if scope else trace.scopes
        records = [record for record in trace.requests if not scope or scope in record.scopes]
        sent = sum(1 for record in records if record.sent is not None)
        ok = sum(1 for record in records if record.ok)
        throttled = sum(1 for record in records if record.status == 429)
        errors = sum(
            1
            for record in records
            if record.exception is not None or (record.status is not None and record.status >= 500)
        )
        samples = [sample for name in names for sample in trace.samples.get(name, ())]
        final = [trace.samples[name][-1].delay for name in names if trace.samples.get(name)]
        table.add_row(
            scope or "all",
            str(sent),
            str(ok),
            str(throttled),
            str(errors),
            f"{trace.throughput(scope or None):.2f}",
            f"{trace.mean_delay(scope or None):.2f} s",
            f"{max(final):.2f} s" if final else "-",
            f"{trace.settle_time(scope or None):.0f} s",
            str(max((sample.backoff_level for sample in samples), default=0)),
        )
    blocked = sum(1 for record in trace.requests if record.blocked)
    if blocked:
        table.caption = f"{blocked} of the ok responses were soft-block pages"
    return table


def _write_trace(trace: Trace, path: Path) -> None:
    try:
        with path.open("w", encoding="utf-8") as file:
            for record in trace.requests:
                row = {
                    "index": record.index,
                    "url": record.url,
                    "scopes": dict(record.scopes),
                    "arrived": record.arrived,
                    "sent": record.sent,
                    "responded": record.responded,
                    "released": record.released,
                    "status": record.status,
                    "exception": record.exception,
                    "latency": record.latency,
                    "blocked": record.blocked,
                    "outcome": record.outcome,
                    "headers": dict(record.headers),
                }
                file.write(json.dumps(row) + "\n")
    except OSError as exc:
        raise CLIError(f"cannot write {str(path)!r}: {exc.strerror}") from None


def simulate_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="TOML file: throttling settings (the names Limiter.from_settings reads, "
            "e.g. DOWNLOAD_DELAY) and a [simulate] table (server, sites, requests, rate, "
            "duration, seed).",
            dir_okay=False,
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            help="The server model: NAME[:key=value,...] with NAME one of fixed, capacity, "
            "quota, cdn, soft-block, flaky; e.g. 'quota:limit=5,window=1,retry_after=2'. "
            "Default: quota:limit=5,window=1.",
        ),
    ] = None,
    site: Annotated[
        list[str] | None,
        typer.Option(
            help="A site as HOST=SERVER (repeat for several sites; requests are spread "
            "over them), e.g. 'api.test=quota:limit=5'.",
        ),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option(
            help="Seconds between sends per scope: DOWNLOAD_DELAY, and "
            "DOWNLOAD_DELAY_PER_SLOT unless given with --set or in the config."
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(help="CONCURRENT_REQUESTS_PER_DOMAIN: requests in flight per scope."),
    ] = None,
    autothrottle: Annotated[
        bool | None,
        typer.Option(
            "--autothrottle/--no-autothrottle", help="AUTOTHROTTLE_ENABLED (latency-driven delay)."
        ),
    ] = None,
    backoff: Annotated[
        bool,
        typer.Option(
            "--backoff/--no-backoff",
            help="Error-driven backoff and Retry-After/RateLimit handling (on by default).",
        ),
    ] = True,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any setting as KEY=VALUE (a TOML value), e.g. 'RANDOMIZE_DOWNLOAD_DELAY=false'.",
        ),
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(help="Requests queued at t=0 (default 2000), or the most with --rate."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="Requests arriving per second (Poisson) instead of a backlog."),
    ] = None,
    duration: Annotated[float | None, typer.Option(help="Simulated seconds (default 300).")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed (default 0).")] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Also write the charts as a PNG (needs throttlekit-http[plot]).", dir_okay=False
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Write every simulated request as JSON lines.", dir_okay=False),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Verify the run respects the policy (concurrency, delays, quotas, "
            "Retry-After); exit 1 if not.",
        ),
    ] = False,
    width: Annotated[
        int | None,
        typer.Option(help="Chart width in columns (default: fit the terminal).", min=10, max=400),
    ] = None,
) -> None:
    """Run a throttling policy against a simulated server in virtual time.

    Prints a summary (throughput, 429s, errors, delays, time to settle) and
    charts of the send rate, errors and delay over time. Nothing is sent over
    the network and nothing sleeps: five simulated minutes take about a second.
    """
    flags: dict[str, Any] = {}
    for item in set_ or []:
        key, value = parse_assignment(item, "--set")
        flags[key] = value

    if concurrency is not None:
        flags["CONCURRENT_REQUESTS_PER_DOMAIN"] = concurrency
    if autothrottle is not None:
        flags["AUTOTHROTTLE_ENABLED"] = autothrottle
    if plot is not None:
        check_plotting()
    plan = _plan(config, server, site or [], flags, delay, requests, rate, duration, seed)
    where = str(config) if config is not None else "settings"
    limiter = build_limiter(plan.settings, where, seed=plan.seed)
    if not backoff:
        limiter = Limiter(
            default=attrs.evolve(limiter.default, backoff=None),
            scopes={
                name: attrs.evolve(policy, backoff=None)
                for name, policy in limiter.policies.items()
            },
            concurrency=limiter.statistics().concurrency,
            seed=plan.seed,
        )
    console = make_console()
    workload = _workload(plan)
    print_wrapped(console, f"workload: {plan.description}, {plan.duration:g}\xa0s simulated")
    for host in plan.hosts:
        model = plan.server.sites[host] if isinstance(plan.server, Sites) else plan.server
        print_wrapped(console, f"{host}: {describe_server(model)}")
        print_wrapped(console, f"policy: {describe_policy(limiter, host)}", "  ")
    started = time.perf_counter()
    result = simulate(limiter, plan.server, workload, duration=plan.duration, seed=plan.seed)
    elapsed = time.perf_counter() - started
    console.print(f"simulated {result.duration:g} s in {elapsed:.2f} s\n")
    console.print(_summary(result))
    console.print(chart_table(result, width or max(10, min(60, console.width - 28))))
    if plot is not None:
        servers = plan.server.sites if isinstance(plan.server, Sites) else {}
        policies = sorted({describe_policy(limiter, host) for host in plan.hosts})
        title = "\n".join([f"throttlekit simulate: {plan.description}", *policies])
        plot_png(result, plot, title, servers)
        console.print(f"wrote {escape(str(plot))}")
    if trace is not None:
        _write_trace(result, trace)
        console.print(f"wrote {escape(str(trace))}")
    if check:
        violations = check_respects(result, limiter)
        if violations:
            for violation in violations:
                console.print(f"[red]violation[/]: {escape(violation.message)}", soft_wrap=True)
            raise typer.Exit(EXIT_FAILED)
        console.print("[green]check passed[/]: every rule of the policy was respected")
