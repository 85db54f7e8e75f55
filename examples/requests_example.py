"""Throttle requests and httpx.Client from threads: a polite multi-host crawl, an API budget.

Run it as ``python examples/requests_example.py``: eight threads crawl a few
pages of example.com, example.org and example.net through one
``requests.Session`` from a local stand-in for the web (``local_web.py``, no
network needed) and it prints when each host's requests arrived. Every
function takes an optional ``proxy``, which is how it reaches that stand-in
(and how the test suite runs it against its own local server).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import requests
from urllib3.util.retry import Retry

import throttlekit
from throttlekit.adapters.httpx import SyncThrottledTransport
from throttlekit.adapters.requests import ThrottledAdapter


def crawl(urls: list[str], *, proxy: str | None = None) -> dict[str, int]:
    """Fetch ``urls`` from 8 threads: at most 2 requests per host at a time, 0.25 s apart."""
    limiter = throttlekit.SyncLimiter(
        default=throttlekit.ScopePolicy(concurrency=2, delay=0.25, slot_delay=0),
    )
    # 429 and 503 are retried here, each attempt waiting for its own permit: a
    # Retry-After holds back the retry and every other request to that host.
    adapter = ThrottledAdapter(limiter, retries=Retry(total=3, status_forcelist=[429, 503]))
    with requests.Session() as session:
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        if proxy is not None:
            session.proxies = {"http": proxy}
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda url: session.get(url, timeout=10), urls))
    return {url: response.status_code for url, response in zip(urls, responses, strict=True)}


def search_api(queries: list[str], *, proxy: str | None = None) -> list[int]:
    """Call an API whose hosts share one budget, from threads sharing one httpx.Client."""
    limiter = throttlekit.SyncLimiter(
        scopes={"search-budget": throttlekit.ScopePolicy(concurrency=1, delay=0.05, slot_delay=0)},
    )
    transport = SyncThrottledTransport(limiter, httpx.HTTPTransport(proxy=proxy))
    with httpx.Client(transport=transport, timeout=10) as client:

        def search(number: int) -> int:
            region = ("eu", "us")[number % 2]
            response = client.get(
                f"http://{region}.search.example/q",
                params={"q": queries[number]},
                extensions={"throttling_scopes": "search-budget"},  # instead of the host
            )
            return response.status_code

        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(search, range(len(queries))))


def main() -> None:
    from local_web import LocalWeb

    with LocalWeb() as web:  # answers http:// URLs of any host, locally
        hosts = ("example.com", "example.org", "example.net")
        urls = [f"http://{host}/page/{n}" for host in hosts for n in range(4)]
        statuses = crawl(urls, proxy=web.proxy)
        print(f"{len(statuses)} pages, statuses {sorted(set(statuses.values()))}")
        print("2 at a time per host, sends 0.25 s apart per host, hosts in parallel:")
        print(web.report())


if __name__ == "__main__":
    main()
