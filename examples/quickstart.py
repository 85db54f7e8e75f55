"""Throttle 12 requests over 3 hosts and print when each was allowed out."""

from __future__ import annotations

import anyio

import throttlekit


async def main() -> None:
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=2, delay=0.2, slot_delay=0.5),
    )
    start = anyio.current_time()

    async def fetch(url: str) -> None:
        async with limiter.acquire(url) as permit:
            sent = anyio.current_time() - start
            await anyio.sleep(0.1)  # stands in for the HTTP request
            permit.record(status=200)
            print(f"{sent:5.2f}s  {url:40}  scopes={sorted(permit.scopes)}")

    async with anyio.create_task_group() as tg:
        for host in ("a.example", "b.example", "c.example"):
            for page in range(4):
                tg.start_soon(fetch, f"https://{host}/page/{page}")


if __name__ == "__main__":
    anyio.run(main)
