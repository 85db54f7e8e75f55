"""``throttlekit fetch``: a polite, resumable bulk fetcher writing JSON lines."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import anyio
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import __version__
from .. import scopes as _scopes
from .._limiter import Limiter
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    CLIError,
    build_limiter,
    read_toml,
    split_config,
    stderr,
)

if TYPE_CHECKING:
    import httpx

# httpx and the adapter are imported when a fetch runs, so that other commands
# start fast.

__all__ = ["fetch_command"]

_TABLE_KEYS = ("timeout", "retries", "user_agent", "proxy", "output", "retry_failed")
_DEFAULT_USER_AGENT = f"throttlekit-fetch/{__version__}"
#: Statuses worth another try later (the limiter backs off in between).
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 520, 521, 522, 523, 524})


def _failed(record: dict[str, Any]) -> bool:
    """Whether a result line counts as a failure (and is re-fetched by --retry-failed)."""
    status = record.get("status")
    return (
        record.get("error") is not None
        or not isinstance(status, int)
        or (status in _RETRY_STATUSES or status >= 500)
    )


def read_urls(path: Path) -> tuple[list[str], list[str]]:
    """The URLs of ``path`` in order (duplicates dropped), and a report line per bad line.

    Blank lines and lines starting with ``#`` are skipped silently.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise CLIError(f"URL file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise CLIError(f"cannot read URL file {str(path)!r}: {exc.strerror}") from None
    urls: list[str] = []
    seen: set[str] = set()
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        reason = _bad_url(line)
        if reason is not None:
            problems.append(f"{path}:{number}: {reason}: {line[:200]!r}")
        elif line not in seen:
            seen.add(line)
            urls.append(line)
    return urls, problems


def _bad_url(line: str) -> str | None:
    if any(character.isspace() for character in line):
        return "not a URL (contains spaces)"
    try:
        parts = urlsplit(line)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "not an http(s) URL"
    if not parts.hostname:
        return "URL without a host"
    return None


def _done_urls(path: Path, retry_failed: bool) -> tuple[set[str], int]:
    """URLs that already have a result in ``path`` (the last line per URL wins).

    A line that is not valid JSON (e.g. cut short by a crash) is ignored.
    Returns the URLs and the number of ignored lines.
    """
    latest: dict[str, dict[str, Any]] = {}
    ignored = 0
    try:
        with path.open(encoding="utf-8", errors="replace") as file:
            for line in file:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    ignored += 1
                    continue
                if isinstance(record, dict) and isinstance(record.get("url"), str):
                    latest[record["url"]] = record
                else:
                    ignored += 1
    except FileNotFoundError:
        return set(), 0
    except OSError as exc:
        raise CLIError(f"cannot read output file {str(path)!r}: {exc.strerror}") from None
    done = {url for url, record in latest.items() if not (retry_failed and _failed(record))}
    return done, ignored


class _Fetcher:
    def __init__(
        self,
        limiter: Limiter,
        client: httpx.AsyncClient,
        out: IO[str],
        retries: int,
        progress: Progress | None,
        task: Any,
    ) -> None:
        self.limiter = limiter
        self.client = client
        self.out = out
        self.retries = retries
        self.progress = progress
        self.task = task
        self.ok = 0
        self.client_errors = 0  # 4xx answers other than 429: final, not retried
        self.failed = 0

    def scope_of(self, url: str) -> str:
        try:
            result = self.limiter.resolver(url)
        except Exception:
            return ""
        if not isinstance(result, (str, dict, set, list, tuple, frozenset)):
            return ""  # an async resolver: the scope is not known without awaiting
        return ",".join(sorted(_scopes.as_scope_costs(result)))

    async def fetch(self, url: str) -> None:
        import httpx

        from ._local import HEADERS_AT, SENT_AT

        queued = anyio.current_time()
        status: int | None = None
        size = 0
        latency: float | None = None
        error: str | None = None
        attempts = 0
        waited = 0.0
        while True:
            attempts += 1
            asked = anyio.current_time()
            try:
                async with self.client.stream("GET", url) as response:
                    size = 0
                    async for chunk in response.aiter_raw():
                        size += len(chunk)
                extensions = response.request.extensions
                status, error = response.status_code, None
                sent_at = extensions.get(SENT_AT, asked)
                latency = round(extensions.get(HEADERS_AT, sent_at) - sent_at, 6)
                retry = status in _RETRY_STATUSES
            except httpx.HTTPError as exc:
                status, size, latency = None, 0, None
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                try:
                    extensions = exc.request.extensions
                except RuntimeError:  # an error before the request was built
                    extensions = {}
                sent_at = extensions.get(SENT_AT, asked)
                retry = True
            waited += max(0.0, sent_at - asked)
            if not retry or attempts > self.retries:
                break
        # The wall-clock time of the last attempt's send (not of the queueing).
        sent_wall = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
            seconds=max(0.0, anyio.current_time() - sent_at)
        )
        record = {
            "url": url,
            "status": status,
            "bytes": size,
            "scope": self.scope_of(url),
            "latency": latency,
            "waited": round(waited, 6),
            "elapsed": round(anyio.current_time() - queued, 6),
            "attempts": attempts,
            "error": error,
            "fetched_at": sent_wall.isoformat(timespec="milliseconds"),
        }
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()
        if _failed(record):
            self.failed += 1
        elif status is not None and status >= 400:
            self.client_errors += 1
        else:
            self.ok += 1
        if self.progress is not None:
            self.progress.update(
                self.task,
                advance=1,
                description=f"[green]{self.ok} ok[/] {self.client_errors} 4xx "
                f"[red]{self.failed} failed",
            )


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def _fetch_all(
    urls: list[str],
    limiter: Limiter,
    out: IO[str],
    *,
    request_timeout: float,
    retries: int,
    user_agent: str,
    proxy: str | None,
    progress: Progress | None,
) -> tuple[int, int, int]:
    import httpx

    from ..adapters.httpx import ThrottledTransport
    from ._local import Stopwatch

    inner = Stopwatch(httpx.AsyncHTTPTransport(proxy=proxy))
    async with httpx.AsyncClient(
        transport=ThrottledTransport(limiter, inner),
        timeout=request_timeout,
        headers={"User-Agent": user_agent},
        follow_redirects=True,
        trust_env=False,
    ) as client:
        task = progress.add_task("fetching", total=len(urls)) if progress is not None else None
        fetcher = _Fetcher(limiter, client, out, retries, progress, task)
        # Bounded work in progress: the limiter decides the order of sends; this
        # only keeps memory flat for very long URL lists.
        for batch in _chunks(urls, 10_000):
            async with anyio.create_task_group() as tasks:
                for url in batch:
                    tasks.start_soon(fetcher.fetch, url)
        return fetcher.ok, fetcher.client_errors, fetcher.failed


def fetch_command(
    urls_file: Annotated[
        Path,
        typer.Argument(
            metavar="URLS_FILE",
            help="Text file with one http(s) URL per line ('#' comments allowed).",
            dir_okay=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="JSON lines file to append results to; URLs already in it are skipped "
            "(resume). Default: standard output, without resume.",
            dir_okay=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="TOML file: throttling settings (the names Limiter.from_settings reads) and "
            "a [fetch] table (timeout, retries, user_agent, proxy, output, retry_failed).",
            dir_okay=False,
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(help="CONCURRENT_REQUESTS: requests in flight in total (default 16).", min=1),
    ] = None,
    per_host: Annotated[
        int | None,
        typer.Option(help="CONCURRENT_REQUESTS_PER_DOMAIN: in flight per host (default 1).", min=1),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option(
            help="Seconds between requests to a host: DOWNLOAD_DELAY, and "
            "DOWNLOAD_DELAY_PER_SLOT unless configured (default 1).",
            min=0.0,
        ),
    ] = None,
    adaptive: Annotated[
        bool,
        typer.Option(
            "--adaptive",
            help="THROTTLING_ADAPTIVE: find and hold what each host allows, with --per-host "
            "and --delay (default 0 here) as the ceiling.",
        ),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds before a request times out (default 30).")
    ] = None,
    retries: Annotated[
        int | None,
        typer.Option(help="Extra tries after a 429, 5xx or network error (default 2).", min=0),
    ] = None,
    retry_failed: Annotated[
        bool,
        typer.Option("--retry-failed", help="On resume, fetch again the URLs that failed."),
    ] = False,
    proxy: Annotated[str | None, typer.Option(help="HTTP proxy URL for every request.")] = None,
    user_agent: Annotated[str | None, typer.Option(help="The User-Agent header.")] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")
    ] = False,
) -> None:
    """Fetch URLs politely: per-host throttling with adaptive backoff, resumable JSON lines output.

    Each result line has: url, status, bytes, latency (send to headers),
    waited (time held back by the throttling), elapsed, attempts, scope,
    error and fetched_at. 429s, 5xx and network errors are retried with the
    host slowed down by backoff. Bad lines in the URL file are reported on
    stderr and skipped.

    Exit codes: 0 every URL fetched; 1 some URLs failed (network error, 429
    or 5xx after the retries) or some input lines were bad; 2 bad usage or
    configuration; 130 interrupted (the output stays resumable).
    """
    settings: dict[str, Any] = {}
    table: dict[str, Any] = {}
    where = "fetch"
    if config is not None:
        where = str(config)
        settings, table = split_config(read_toml(config), "fetch", where, _TABLE_KEYS)
    if concurrency is not None:
        settings["CONCURRENT_REQUESTS"] = concurrency
    if per_host is not None:
        settings["CONCURRENT_REQUESTS_PER_DOMAIN"] = per_host
    if delay is not None:
        settings["DOWNLOAD_DELAY"] = delay
        settings.setdefault("DOWNLOAD_DELAY_PER_SLOT", delay)
    if adaptive:
        settings["THROTTLING_ADAPTIVE"] = True
    limiter = build_limiter(settings, where)

    def option(value: Any, key: str, default: Any, kind: tuple[type, ...]) -> Any:
        if value is not None:
            return value
        value = table.get(key, default)
        if value is not None and (
            isinstance(value, bool) is not (bool in kind) or not isinstance(value, kind)
        ):
            raise CLIError(f"{where}: [fetch] {key} has the wrong type: {value!r}")
        return value

    timeout = option(timeout, "timeout", 30.0, (int, float))
    retries = option(retries, "retries", 2, (int,))
    user_agent = option(user_agent, "user_agent", _DEFAULT_USER_AGENT, (str,))
    proxy = option(proxy, "proxy", None, (str,))
    output_name = option(str(output) if output is not None else None, "output", None, (str,))
    retry_failed = retry_failed or bool(option(None, "retry_failed", False, (bool,)))
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise CLIError(f"timeout must be > 0 seconds, got {timeout!r}")
    if retries < 0:
        raise CLIError(f"retries must be >= 0, got {retries!r}")

    urls, problems = read_urls(urls_file)
    for problem in problems:
        stderr.print(f"[yellow]skipped[/] {escape(problem)}")
    skipped = 0
    out: IO[str]
    if output_name is not None:
        output_path = Path(output_name)
        done, ignored = _done_urls(output_path, retry_failed)
        if ignored:
            stderr.print(
                f"[yellow]ignored {ignored} unreadable line(s) in {escape(str(output_path))}[/]"
            )
        pending = [url for url in urls if url not in done]
        skipped = len(urls) - len(pending)
        try:
            out = output_path.open("a", encoding="utf-8")
        except OSError as exc:
            raise CLIError(f"cannot write {str(output_path)!r}: {exc.strerror}") from None
    else:
        pending = urls
        out = sys.stdout
    show = not quiet and stderr.is_terminal
    progress = (
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=stderr,
            transient=True,
        )
        if show
        else None
    )
    started = time.perf_counter()
    try:
        if progress is not None:
            progress.start()
        ok, client_errors, failed = asyncio.run(
            _fetch_all(
                pending,
                limiter,
                out,
                request_timeout=float(timeout),
                retries=int(retries),
                user_agent=str(user_agent),
                proxy=proxy,
                progress=progress,
            )
        )
    except KeyboardInterrupt:
        if out is not sys.stdout:
            hint = f"run the same command again to resume: {output_name} keeps what was fetched"
        else:
            hint = "give --output FILE to make a run resumable"
        stderr.print(f"[yellow]interrupted[/]: {escape(hint)}")
        raise typer.Exit(130) from None
    finally:
        if progress is not None:
            progress.stop()
        if out is not sys.stdout:
            out.close()
    if not quiet:
        stderr.print(
            f"fetched {ok + client_errors + failed} URL(s) in "
            f"{time.perf_counter() - started:.1f} s: {ok} ok, {client_errors} answered 4xx "
            f"(final, not retried), {failed} failed; {skipped} already in the output, "
            f"{len(problems)} bad line(s)"
        )
    raise typer.Exit(EXIT_FAILED if failed or problems else EXIT_OK)
