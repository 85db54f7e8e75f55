"""End to end: an LLM-style API with a requests and a tokens budget, called by the real
``openai`` SDK through ``ThrottledTransport`` and by plain aiohttp through the middleware.

The local server (:class:`LLMAPI`) enforces N requests per sliding window and a
token budget per sliding window, answers 429 with ``retry-after-ms`` and
OpenAI's ``x-ratelimit-*`` headers, and reports every answer's token ``usage``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx
import pytest
from _server import Hit, LocalServer, Reply, Script, Stream
from aiohttp import web

import throttlekit
from throttlekit.adapters import aiohttp as aiohttp_adapter
from throttlekit.adapters.httpx import ThrottledTransport, throttling, token_usage

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
API = "api.test"
PROMPT_TOKENS = 60
COMPLETION_TOKENS = 40
USED = PROMPT_TOKENS + COMPLETION_TOKENS


def load_recipe() -> Any:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("cookbook_openai")


class LLMAPI:
    """``requests`` per sliding ``window`` and ``tokens`` per sliding ``window``, OpenAI-style."""

    def __init__(self, *, requests: int, tokens: int, window: float) -> None:
        self.requests = requests
        self.tokens = tokens
        self.window = window
        self.sent: deque[float] = deque()  # when each accepted request arrived
        self.spent: deque[tuple[float, int]] = deque()  # (arrival, tokens) of each
        self.answers: list[tuple[float, int]] = []  # (arrival, status)

    def _expire(self, now: float) -> None:
        while self.sent and self.sent[0] <= now - self.window:
            self.sent.popleft()
        while self.spent and self.spent[0][0] <= now - self.window:
            self.spent.popleft()

    def _reset(self, times: list[float], now: float) -> str:
        """Time until the oldest use leaves the window, as a Go duration."""
        seconds = max(0.0, times[0] + self.window - now) if times else 0.0
        return f"{math.ceil(seconds * 1000)}ms"

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        body = json.loads(await request.read()) if request.can_read_body else {}
        now = time.monotonic()
        self._expire(now)
        used = sum(tokens for _, tokens in self.spent)
        refused = len(self.sent) >= self.requests or used + USED > self.tokens
        if not refused:
            self.sent.append(now)
            self.spent.append((now, USED))
            used += USED
        headers = {
            "x-ratelimit-limit-requests": str(self.requests),
            "x-ratelimit-remaining-requests": str(self.requests - len(self.sent)),
            "x-ratelimit-reset-requests": self._reset(list(self.sent), now),
            "x-ratelimit-limit-tokens": str(self.tokens),
            "x-ratelimit-remaining-tokens": str(max(0, self.tokens - used)),
            "x-ratelimit-reset-tokens": self._reset([at for at, _ in self.spent], now),
        }
        self.answers.append((now, 429 if refused else 200))
        await asyncio.sleep(0.01)
        if refused:
            oldest = self.sent[0] if len(self.sent) >= self.requests else self.spent[0][0]
            wait_ms = math.ceil(max(0.0, oldest + self.window - now) * 1000)
            headers["retry-after-ms"] = str(wait_ms)
            error = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
            return web.json_response(error, status=429, headers=headers)
        completion = {
            "id": f"chatcmpl-{len(self.answers)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "gpt-4o-mini"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello!"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": USED,
            },
        }
        return web.json_response(completion, headers=headers)

    def refusals_after(self, seconds: float) -> int:
        start = self.answers[0][0]
        return sum(1 for at, status in self.answers if status == 429 and at - start >= seconds)

    def refusals(self) -> int:
        return sum(1 for _, status in self.answers if status == 429)

    def accepted(self) -> int:
        return sum(1 for _, status in self.answers if status == 200)


def least_time(calls: int, per_window: int, window: float) -> float:
    """The budget's shortest run: a full window between each batch of ``per_window``."""
    return (math.ceil(calls / per_window) - 1) * window


@pytest.fixture
def llm_server() -> Any:
    with LocalServer() as server:
        yield server


@pytest.mark.slow
def test_openai_sdk_through_the_transport_keeps_within_both_budgets(
    llm_server: LocalServer,
) -> None:
    # The numbers: 50 concurrent calls, 3 requests per sliding second,
    # and a token budget (500 per second: 5 calls of 100 tokens) that each
    # call's estimate (120) overstates until the response's usage corrects it.
    recipe = load_recipe()
    api = LLMAPI(requests=3, tokens=500, window=1.0)
    llm_server.route(API, behaviour=api)
    limiter = recipe.build_limiter(requests=3, tokens=500, window=1.0)
    client = recipe.build_client(
        limiter,
        api_key="sk-test",
        base_url=f"http://{API}/v1",
        transport=httpx.AsyncHTTPTransport(proxy=llm_server.proxy_url),
    )
    prompts = [f"Say hello number {n:02d}, briefly, please {'.' * 200}" for n in range(50)]
    started = time.monotonic()
    answers = anyio.run(recipe.ask_all, client, prompts)
    elapsed = time.monotonic() - started
    assert answers == ["Hello!"] * 50  # every call succeeded, and max_retries=0
    assert api.accepted() == 50
    assert api.refusals_after(1.0) == 0, api.answers
    allowed = least_time(50, 3, 1.0)
    assert elapsed <= 1.15 * allowed, (elapsed, allowed)
    stats = limiter.statistics().scopes
    # The usage of every call corrected its estimate: 100 tokens each, not 170.
    assert stats[recipe.TOKENS].quota_used <= 3 * USED


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_aiohttp_middleware_keeps_within_both_budgets(llm_server: LocalServer) -> None:
    # The same with plain aiohttp, on a window of a quarter second to keep it short.
    window = 0.25
    api = LLMAPI(requests=3, tokens=500, window=window)
    llm_server.route(API, behaviour=api)
    tokens = "api-tokens"
    free = throttlekit.ScopePolicy(concurrency=None, delay=0)
    limiter = throttlekit.Limiter(
        scopes={
            API: throttlekit.ScopePolicy(concurrency=None, delay=0, quota=3, window=window * 1.1),
            tokens: throttlekit.ScopePolicy(
                concurrency=None, delay=0, quota=500, window=window * 1.1
            ),
        },
        default=free,
        concurrency=64,
    )
    throttle = aiohttp_adapter.middleware(
        limiter, budgets={"tokens": tokens}, consumed=aiohttp_adapter.token_usage(tokens)
    )
    answers: list[str] = []

    async def call(session: aiohttp.ClientSession, n: int) -> None:
        with aiohttp_adapter.throttling(scopes={API: 1, tokens: 120}):
            async with session.post(
                f"http://{API}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": f"hi {n}"}]},
            ) as response:
                assert response.status == 200, await response.text()
                answers.append((await response.json())["choices"][0]["message"]["content"])

    started = time.monotonic()
    async with (
        aiohttp.ClientSession(proxy=llm_server.proxy_url, middlewares=(throttle,)) as session,
        anyio.create_task_group() as tasks,
    ):
        for n in range(50):
            tasks.start_soon(call, session, n)
    elapsed = time.monotonic() - started
    assert answers == ["Hello!"] * 50
    assert api.refusals_after(window) == 0, api.answers
    allowed = least_time(50, 3, window)
    assert elapsed <= 1.15 * allowed, (elapsed, allowed)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_without_a_limit_of_its_own_the_client_learns_from_the_headers(
    llm_server: LocalServer,
) -> None:
    # A limiter that knows nothing of the server's budgets: the first refusals
    # and the x-ratelimit headers teach it; no call fails for good.
    api = LLMAPI(requests=3, tokens=10_000, window=0.25)
    llm_server.route(API, behaviour=api)
    quick = throttlekit.Backoff(min_delay=0.05, window=1.0)
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=None, delay=0, backoff=quick)
    )
    transport = ThrottledTransport(
        limiter,
        httpx.AsyncHTTPTransport(proxy=llm_server.proxy_url),
        budgets={"tokens": "tokens"},
        consumed=token_usage("tokens"),
    )
    statuses: list[int] = []

    async def call(client: httpx.AsyncClient) -> None:
        for _ in range(5):  # the client's own retry: through the limiter again
            response = await client.post(f"http://{API}/v1/chat/completions", json={})
            if response.status_code != 429:
                statuses.append(response.status_code)
                return

    async with httpx.AsyncClient(transport=transport) as client, anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(call, client)
    assert statuses == [200] * 12
    # Refusals come in the first window only: the headers block the scope after.
    assert api.refusals_after(0.5) == 0, api.answers


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_consumed_hook_reads_json_and_streams_still_release(
    llm_server: LocalServer,
) -> None:
    llm_server.route(
        API,
        "/json",
        Reply(
            body=json.dumps({"usage": {"input_tokens": 7, "output_tokens": 5}}).encode(),
            headers={"Content-Type": "application/json"},
        ),
    )
    llm_server.route(API, "/stream", Stream(chunks=3, interval=0.05))
    limiter = throttlekit.Limiter(
        scopes={"tokens": throttlekit.ScopePolicy(concurrency=1, delay=0, quota=1000)},
        default=throttlekit.ScopePolicy(concurrency=None, delay=0),
    )
    seen: list[Any] = []

    def consumed(response: Any, body: Any) -> dict[str, float] | None:
        seen.append(body)
        return token_usage("tokens")(response, body)

    transport = ThrottledTransport(
        limiter, httpx.AsyncHTTPTransport(proxy=llm_server.proxy_url), consumed=consumed
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with throttling(scopes={API: 1, "tokens": 100}):
            response = await client.get(f"http://{API}/json")
        assert response.json() == {"usage": {"input_tokens": 7, "output_tokens": 5}}
        assert limiter.statistics().scopes["tokens"].quota_used == 12.0
        with throttling(scopes={API: 1, "tokens": 100}):
            async with client.stream("GET", f"http://{API}/stream") as streamed:
                assert limiter.statistics().scopes["tokens"].in_flight == 1
                chunks = [chunk async for chunk in streamed.aiter_bytes()]
            assert chunks
        # The stream was not read for the hook (body None), and released on close.
        assert seen == [{"usage": {"input_tokens": 7, "output_tokens": 5}}, None]
        assert limiter.statistics().scopes["tokens"].in_flight == 0
        assert limiter.statistics().scopes["tokens"].quota_used == 112.0


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param({"usage": {"total_tokens": 18}}, {"t": 18.0}, id="openai"),
        pytest.param(
            {"usage": {"input_tokens": 7, "output_tokens": 5}}, {"t": 12.0}, id="anthropic"
        ),
        pytest.param(
            {"usage": {"prompt_tokens": 3, "completion_tokens": 4}}, {"t": 7.0}, id="prompt"
        ),
        pytest.param({"error": {"message": "slow down"}}, None, id="error-body"),
        pytest.param({"usage": {"total_tokens": "many"}}, None, id="not-a-number"),
        pytest.param({"usage": {"total_tokens": -1}}, None, id="negative"),
        pytest.param([1, 2], None, id="not-an-object"),
        pytest.param(None, None, id="no-body"),
    ],
)
def test_token_usage(body: Any, expected: dict[str, float] | None) -> None:
    assert token_usage("t")(None, body) == expected


def test_adapters_validate_their_hooks() -> None:
    limiter = throttlekit.Limiter()
    with pytest.raises(TypeError, match="consumed"):
        ThrottledTransport(limiter, consumed="tokens")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="budgets"):
        ThrottledTransport(limiter, budgets={"tokens": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="consumed"):
        aiohttp_adapter.middleware(limiter, consumed=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scope"):
        token_usage(1)  # type: ignore[arg-type]


# -- retries with the client's own libraries (examples/cookbook_retries.py) ---------------

RETRY_CASES = ["with_httpx_retries", "with_stamina", "with_aiohttp_retry"]


@pytest.mark.parametrize("recipe_name", RETRY_CASES)
def test_retry_recipes_honour_retry_after_once(llm_server: LocalServer, recipe_name: str) -> None:
    # One 429 with Retry-After: 1, then 200: the retry goes through the limiter,
    # which blocks the scope for that second; the retry is sent after about
    # one second, not two (the library's own wait overlaps the block).
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    recipes = importlib.import_module("cookbook_retries")
    llm_server.route(
        API, "/item", Script(Reply(status=429, headers={"Retry-After": "1"}), then=Reply())
    )
    limiter = recipes.build_limiter()
    url = f"http://{API}/item"
    call = getattr(recipes, recipe_name)

    async def run() -> int:
        if recipe_name == "with_aiohttp_retry":
            return int(await call(limiter, url, proxy=llm_server.proxy_url))
        transport = httpx.AsyncHTTPTransport(proxy=llm_server.proxy_url)
        return int(await call(limiter, url, transport))

    status = asyncio.run(run())
    assert status == 200
    hits = llm_server.hits(API, "/item")
    assert [hit.status for hit in hits] == [429, 200]
    gap = hits[1].arrived - hits[0].arrived
    assert 0.95 <= gap < 1.6, gap
    assert limiter.statistics().scopes[API].last_signal == "429"


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_a_budget_around_sdk_calls_never_deadlocks(llm_server: LocalServer) -> None:
    # The reproduction: 50 tasks hold a budget permit around an SDK call
    # whose transport acquires the host scope on the same limiter; with the
    # global cap of 16 saturated by the outer permits, nothing may hang.
    recipe = load_recipe()
    llm_server.route(API, behaviour=LLMAPI(requests=1000, tokens=1_000_000, window=1.0))
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=None, delay=0), concurrency=16
    )
    client = recipe.build_client(
        limiter,
        api_key="sk-test",
        base_url=f"http://{API}/v1",
        transport=httpx.AsyncHTTPTransport(proxy=llm_server.proxy_url),
    )
    answers: list[str] = []

    async def call(n: int) -> None:
        async with limiter.acquire(scopes={"tenant-budget": 1}):
            answers.append(await recipe.ask(client, f"hello {n}"))

    with anyio.fail_after(30):
        async with client, anyio.create_task_group() as tasks:
            for n in range(50):
                tasks.start_soon(call, n)
    assert answers == ["Hello!"] * 50
    assert limiter.statistics().in_flight == 0


def test_client_helper_passes_budgets_and_consumed() -> None:
    from throttlekit.adapters.httpx import client

    hook = token_usage("t")
    made = client(throttlekit.Limiter(), budgets={"tokens": "t"}, consumed=hook)
    transport = made._transport
    assert isinstance(transport, ThrottledTransport)
    assert (transport._budgets, transport._consumed) == ({"tokens": "t"}, hook)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_sdk_calls_give_up_on_a_long_block_with_max_stall(llm_server: LocalServer) -> None:
    # The llm-apis page's promise: with max_stall, a 429 asking for an hour
    # makes the calls waiting behind it, and later ones, raise ScopeStalled
    # through the SDK at once, instead of waiting (or retrying) for that long.
    import openai

    recipe = load_recipe()
    error = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    block = Reply(
        status=429,
        body=json.dumps(error).encode(),
        headers={"retry-after-ms": "3600000", "content-type": "application/json"},
    )
    llm_server.route(
        API, behaviour=Script(block, then=LLMAPI(requests=1000, tokens=1_000_000, window=1.0))
    )
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=1, delay=0, max_stall=30)
    )
    client = recipe.build_client(
        limiter,
        api_key="sk-test",
        base_url=f"http://{API}/v1",
        transport=httpx.AsyncHTTPTransport(proxy=llm_server.proxy_url),
    )
    outcomes: list[str] = []

    async def call(n: int) -> None:
        try:
            await recipe.ask(client, f"hello {n}")
        except throttlekit.ScopeStalled as stalled:
            outcomes.append("stalled" if stalled.wait > 30 else f"stalled {stalled.wait} s")
        except openai.RateLimitError:
            outcomes.append("429")
        else:
            outcomes.append("answered")

    started = time.monotonic()
    with anyio.fail_after(30):
        async with client, anyio.create_task_group() as tasks:
            for n in range(10):
                tasks.start_soon(call, n)
    assert time.monotonic() - started < 10
    assert sorted(outcomes) == ["429"] + ["stalled"] * 9
    assert [hit.status for hit in llm_server.hits(API)] == [429]
    assert limiter.statistics().in_flight == 0
    assert limiter.statistics().waiting == 0
