"""The Python sites of the real-limiter benchmark, in one aiohttp process.

Usage: ``python -m benchmarks.real_limiters_sites plan.json``

``plan.json`` lists ``sites``, each ``{"port", "kind", "log"}`` plus, for a
limiter, ``"limit"`` (a ``limits`` rate string such as ``"10/second"``):

* ``"moving"``: the ``limits`` library's moving window, with the headers
  slowapi sends when its headers are on, on every response: ``X-RateLimit-Limit``,
  ``X-RateLimit-Remaining``, ``X-RateLimit-Reset`` (``1 + reset``, a float
  epoch) and ``Retry-After`` (``int(1 + reset - now)``);
* ``"moving-int"``: the same moving window with Flask-Limiter's headers (as
  ``"fixed"`` below: an integer epoch reset, up to a second after the real one);
* ``"fixed"``: the ``limits`` library's fixed window (on its memory storage
  it opens at the first request), with the headers Flask-Limiter sends:
  ``X-RateLimit-Reset`` is ``int(reset + 1)`` (an integer epoch) and
  ``Retry-After`` is ``int(int(reset + 1) - now)``, the seconds left in the
  window, on every response;
* ``"origin"``: a plain 200 after ``delay`` seconds (the origin behind nginx's
  ``limit_conn``); not logged.

Refusals are 429s. Each limiter site appends one line per request to its
``log``: arrival and answer (epoch seconds), status and the ``Retry-After``
it sent. The process serves until it is terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["main"]


def _limiter_app(site: dict[str, Any], log: IO[str]) -> Any:
    from aiohttp import web
    from limits import parse
    from limits.storage import MemoryStorage
    from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

    item = parse(site["limit"])
    storage = MemoryStorage()
    moving = site["kind"] in ("moving", "moving-int")
    exact = site["kind"] == "moving"  # slowapi's float reset, not Flask-Limiter's integer one
    limiter = MovingWindowRateLimiter(storage) if moving else FixedWindowRateLimiter(storage)

    async def handle(request: web.Request) -> web.Response:
        arrived = time.time()
        accepted = limiter.hit(item, "client")
        reset_time, remaining = limiter.get_window_stats(item, "client")
        # slowapi states 1 + reset as it is; Flask-Limiter rounds it down to an int.
        stated: float = 1 + reset_time if exact else int(reset_time + 1)
        retry_after = int(stated - time.time())
        headers = {
            "X-RateLimit-Limit": str(item.amount),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(stated),
            "Retry-After": str(retry_after),
        }
        status = 200 if accepted else 429
        log.write(f"{arrived:.6f} {time.time():.6f} {status} {retry_after}\n")
        return web.Response(status=status, text="ok" if accepted else "", headers=headers)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    return app


def _origin_app(site: dict[str, Any]) -> Any:
    from aiohttp import web

    delay = float(site.get("delay", 0.1))

    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    return app


async def _serve(plan: dict[str, Any], logs: dict[int, IO[str]]) -> None:
    from aiohttp import web

    for site in plan["sites"]:
        if site["kind"] == "origin":
            app = _origin_app(site)
        else:
            app = _limiter_app(site, logs[int(site["port"])])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(site["port"]), backlog=1024).start()
    await asyncio.Event().wait()  # until terminated; each log line is already flushed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.real_limiters_sites plan.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    with contextlib.ExitStack() as stack, contextlib.suppress(KeyboardInterrupt):
        logs = {
            int(site["port"]): stack.enter_context(
                Path(site["log"]).open("a", encoding="utf-8", buffering=1)
            )
            for site in plan["sites"]
            if site["kind"] != "origin"
        }
        asyncio.run(_serve(plan, logs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
