"""End to end: an LLM-style API with a requests and a tokens budget, called by the real
``openai`` and ``anthropic`` SDKs through the httpx2 ``ThrottledTransport`` (the SDKs'
own HTTP library), by httpx through its transport and by plain aiohttp through the middleware.

The local server (:class:`LLMAPI`) enforces N requests per sliding window and a
token budget per sliding window, answers 429 with ``retry-after-ms`` and
OpenAI's ``x-ratelimit-*`` headers (or, as Anthropic, ``retry-after`` and
``anthropic-ratelimit-*``), and reports every answer's token ``usage``.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import json
import math
import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx
import httpx2
import pytest
from _server import Hit, LocalServer, Reply, Script, Stream
from aiohttp import web

import throttlekit
from throttlekit.adapters import aiohttp as aiohttp_adapter
from throttlekit.adapters import httpx as httpx_adapter
from throttlekit.adapters import httpx2 as httpx2_adapter
from throttlekit.adapters.httpx import ThrottledTransport, throttling, token_usage

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
API = "api.test"
PROMPT_TOKENS = 60
COMPLETION_TOKENS = 40
USED = PROMPT_TOKENS + COMPLETION_TOKENS


def load_recipe(name: str = "cookbook_openai") -> Any:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def rfc3339(seconds_from_now: float) -> str:
    """A wall-clock time ``seconds_from_now`` away, as Anthropic writes its resets."""
    moment = datetime.datetime.fromtimestamp(time.time() + seconds_from_now, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LLMAPI:
    """``requests`` per sliding ``window`` and ``tokens`` per sliding ``window``.

    ``dialect="openai"`` answers as OpenAI's chat completions (``x-ratelimit-*``,
    ``retry-after-ms``), ``"anthropic"`` as Anthropic's messages
    (``anthropic-ratelimit-*`` with RFC 3339 resets, ``retry-after`` in seconds).
    """

    def __init__(
        self, *, requests: int, tokens: int, window: float, dialect: str = "openai"
    ) -> None:
        self.requests = requests
        self.tokens = tokens
        self.window = window
        self.dialect = dialect
        self.sent: deque[float] = deque()  # when each accepted request arrived
        self.spent: deque[tuple[float, int]] = deque()  # (arrival, tokens) of each
        self.answers: list[tuple[float, int]] = []  # (arrival, status)

    def _expire(self, now: float) -> None:
        while self.sent and self.sent[0] <= now - self.window:
            self.sent.popleft()
        while self.spent and self.spent[0][0] <= now - self.window:
            self.spent.popleft()

    def _reset(self, times: list[float], now: float) -> str:
        """Time until the oldest use leaves the window, as a Go duration or an RFC 3339 time."""
        seconds = max(0.0, times[0] + self.window - now) if times else 0.0
        if self.dialect == "anthropic":
            return rfc3339(seconds)
        return f"{math.ceil(seconds * 1000)}ms"

    def _headers(self, now: float, used: int) -> dict[str, str]:
        requests_left = str(self.requests - len(self.sent))
        requests_reset = self._reset(list(self.sent), now)
        tokens_left = str(max(0, self.tokens - used))
        tokens_reset = self._reset([at for at, _ in self.spent], now)
        if self.dialect == "anthropic":
            return {
                "anthropic-ratelimit-requests-limit": str(self.requests),
                "anthropic-ratelimit-requests-remaining": requests_left,
                "anthropic-ratelimit-requests-reset": requests_reset,
                "anthropic-ratelimit-tokens-limit": str(self.tokens),
                "anthropic-ratelimit-tokens-remaining": tokens_left,
                "anthropic-ratelimit-tokens-reset": tokens_reset,
            }
        return {
            "x-ratelimit-limit-requests": str(self.requests),
            "x-ratelimit-remaining-requests": requests_left,
            "x-ratelimit-reset-requests": requests_reset,
            "x-ratelimit-limit-tokens": str(self.tokens),
            "x-ratelimit-remaining-tokens": tokens_left,
            "x-ratelimit-reset-tokens": tokens_reset,
        }

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.dialect == "anthropic":
            return {
                "id": f"msg_{len(self.answers)}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", "claude"),
                "content": [{"type": "text", "text": "Hello!"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": COMPLETION_TOKENS},
            }
        return {
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
        headers = self._headers(now, used)
        self.answers.append((now, 429 if refused else 200))
        await asyncio.sleep(0.01)
        if refused:
            oldest = self.sent[0] if len(self.sent) >= self.requests else self.spent[0][0]
            wait = max(0.0, oldest + self.window - now)
            if self.dialect == "anthropic":
                headers["retry-after"] = str(math.ceil(wait))
            else:
                headers["retry-after-ms"] = str(math.ceil(wait * 1000))
            error = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
            return web.json_response(error, status=429, headers=headers)
        return web.json_response(self._answer(body), headers=headers)

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


#: The two client libraries of the one transport: (module, its adapter module).
LIBRARIES = [
    pytest.param((httpx, httpx_adapter), id="httpx"),
    pytest.param((httpx2, httpx2_adapter), id="httpx2"),
]


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
        transport=httpx2.AsyncHTTPTransport(proxy=llm_server.proxy_url),
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


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_without_a_limit_of_its_own_the_client_learns_from_the_headers(
    llm_server: LocalServer, library: tuple[Any, Any]
) -> None:
    # A limiter that knows nothing of the server's budgets: the first refusals
    # and the x-ratelimit headers teach it; no call fails for good.
    api = LLMAPI(requests=3, tokens=10_000, window=0.25)
    llm_server.route(API, behaviour=api)
    quick = throttlekit.Backoff(min_delay=0.05, window=1.0)
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=None, delay=0, backoff=quick)
    )
    module, adapter = library
    transport = adapter.ThrottledTransport(
        limiter,
        module.AsyncHTTPTransport(proxy=llm_server.proxy_url),
        budgets={"tokens": "tokens"},
        consumed=token_usage("tokens"),
    )
    statuses: list[int] = []

    async def call(client: Any) -> None:
        for _ in range(5):  # the client's own retry: through the limiter again
            response = await client.post(f"http://{API}/v1/chat/completions", json={})
            if response.status_code != 429:
                statuses.append(response.status_code)
                return

    async with module.AsyncClient(transport=transport) as client, anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(call, client)
    assert statuses == [200] * 12
    # Refusals come in the first window only: the headers block the scope after.
    assert api.refusals_after(0.5) == 0, api.answers


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_consumed_hook_reads_json_and_streams_still_release(
    llm_server: LocalServer, library: tuple[Any, Any]
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

    module, adapter = library
    transport = adapter.ThrottledTransport(
        limiter, module.AsyncHTTPTransport(proxy=llm_server.proxy_url), consumed=consumed
    )
    async with module.AsyncClient(transport=transport) as client:
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
        transport=httpx2.AsyncHTTPTransport(proxy=llm_server.proxy_url),
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


@pytest.mark.parametrize("library", LIBRARIES)
def test_client_helper_passes_budgets_and_consumed(library: tuple[Any, Any]) -> None:
    module, adapter = library
    hook = token_usage("t")
    made = adapter.client(throttlekit.Limiter(), budgets={"tokens": "t"}, consumed=hook)
    assert isinstance(made, module.AsyncClient)
    transport = made._transport
    assert isinstance(transport, adapter.ThrottledTransport)
    assert isinstance(transport, module.AsyncBaseTransport)
    assert (transport._budgets, transport._consumed) == ({"tokens": "t"}, hook)
    with pytest.raises(TypeError, match="builds its own transport"):
        adapter.client(transport=transport)
    with pytest.raises(TypeError, match=f"{module.__name__}.AsyncBaseTransport"):
        adapter.ThrottledTransport(throttlekit.Limiter(), object())


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
        transport=httpx2.AsyncHTTPTransport(proxy=llm_server.proxy_url),
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


# -- the Anthropic SDK, retry-after-ms, and waits stated in a 429's body ------------------


@pytest.mark.slow
def test_anthropic_sdk_through_the_transport_keeps_within_both_budgets(
    llm_server: LocalServer,
) -> None:
    # The same as the OpenAI test with the real anthropic SDK (httpx2 underneath)
    # and Anthropic's headers, on a half-second window to keep it short:
    # 30 concurrent messages, 3 requests and 500 tokens per window, each call's
    # estimate (112 tokens) corrected by its usage (60 in + 40 out).
    recipe = load_recipe("cookbook_anthropic")
    window = 0.5
    api = LLMAPI(requests=3, tokens=500, window=window, dialect="anthropic")
    llm_server.route(API, behaviour=api)
    limiter = recipe.build_limiter(requests=3, tokens=500, window=window)
    client = recipe.build_client(
        limiter,
        api_key="sk-ant-test",
        base_url=f"http://{API}",
        transport=httpx2.AsyncHTTPTransport(proxy=llm_server.proxy_url),
    )
    prompts = [f"Say hello number {n:02d}, briefly, please {'.' * 200}" for n in range(30)]
    started = time.monotonic()
    answers = anyio.run(recipe.ask_all, client, prompts)
    elapsed = time.monotonic() - started
    assert answers == ["Hello!"] * 30
    assert api.accepted() == 30
    assert api.refusals() == 0, api.answers
    allowed = least_time(30, 3, window)
    assert elapsed <= 1.15 * allowed * recipe.MARGIN, (elapsed, allowed)
    stats = limiter.statistics().scopes
    assert stats[recipe.TOKENS].quota_used <= 3 * USED
    assert [hit.path for hit in llm_server.hits(API)] == ["/v1/messages"] * 30


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_a_429_wait_is_honoured_once_by_the_sdk_and_the_other_calls(
    llm_server: LocalServer, sdk: str
) -> None:
    # The first answer is a 429 asking for 500 ms (retry-after-ms, as OpenAI
    # and Azure send it; Anthropic's SDK reads it too). The scope blocks for
    # that long: the SDK's own retry and the nine calls waiting behind it
    # arrive after it, about 500 ms later (the SDK's sleep overlaps the
    # block instead of adding to it), and nothing is refused again.
    import anthropic
    import openai

    error = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    block = Reply(
        status=429,
        body=json.dumps(error).encode(),
        headers={"retry-after-ms": "500", "content-type": "application/json"},
    )
    dialect = "anthropic" if sdk == "anthropic" else "openai"
    api = LLMAPI(requests=1000, tokens=1_000_000, window=1.0, dialect=dialect)
    llm_server.route(API, behaviour=Script(block, then=api))
    # Backoff honours the wait without stepping the delay up, so the gaps are the wait's.
    honour = throttlekit.Backoff(headers_only=True)
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=2, delay=0, backoff=honour)
    )
    http_client = httpx2.AsyncClient(
        transport=httpx2_adapter.ThrottledTransport(
            limiter, httpx2.AsyncHTTPTransport(proxy=llm_server.proxy_url)
        )
    )
    answers: list[str] = []

    if sdk == "openai":
        oa = openai.AsyncOpenAI(
            api_key="sk-test", base_url=f"http://{API}/v1", max_retries=2, http_client=http_client
        )

        async def call(n: int) -> None:
            completion = await oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"hi {n}"}]
            )
            answers.append(completion.choices[0].message.content or "")

        closing: Any = oa
    else:
        an = anthropic.AsyncAnthropic(
            api_key="sk-ant-test", base_url=f"http://{API}", max_retries=2, http_client=http_client
        )

        async def call(n: int) -> None:
            message = await an.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": f"hi {n}"}]
            )
            answers.append("".join(b.text for b in message.content if b.type == "text"))

        closing = an
    with anyio.fail_after(30):
        async with closing, anyio.create_task_group() as tasks:
            for n in range(10):
                tasks.start_soon(call, n)
    assert answers == ["Hello!"] * 10
    hits = sorted(llm_server.hits(API), key=lambda hit: hit.arrived)
    statuses = [hit.status for hit in hits]
    # Two were sent at once (concurrency 2): the 429 and one answer; then the block.
    assert statuses.count(429) == 1, statuses
    assert statuses.count(200) == 10, statuses
    refused = next(hit for hit in hits if hit.status == 429)
    later = [hit.arrived - refused.arrived for hit in hits if hit.arrived > refused.arrived + 0.1]
    assert len(later) >= 8, describe_gaps(hits)
    assert 0.48 <= min(later) < 0.95, describe_gaps(hits)
    assert limiter.statistics().scopes[API].last_signal == "429"


def describe_gaps(hits: list[Any]) -> str:
    start = hits[0].arrived
    return ", ".join(f"{hit.status}@{hit.arrived - start:.3f}" for hit in hits)


GEMINI_429 = {
    "error": {
        "code": 429,
        "message": (
            "You exceeded your current quota, please check your plan and billing details. "
            "Please retry in 0.6s."
        ),
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.5s"},
        ],
    }
}


async def _two_calls(adapter: str, limiter: throttlekit.Limiter, proxy: str) -> list[int]:
    """Two calls in a row through one adapter; the statuses they got."""
    url = f"http://{API}/v1beta/models/gemini:generateContent"
    statuses = []
    if adapter == "aiohttp":
        throttle = aiohttp_adapter.middleware(limiter)
        async with aiohttp.ClientSession(proxy=proxy, middlewares=(throttle,)) as session:
            for _ in range(2):
                async with session.post(url, json={}) as response:
                    statuses.append(response.status)
                    await response.read()
        return statuses
    module, transport_module = (
        (httpx, httpx_adapter) if adapter == "httpx" else (httpx2, httpx2_adapter)
    )
    transport = transport_module.ThrottledTransport(limiter, module.AsyncHTTPTransport(proxy=proxy))
    async with module.AsyncClient(transport=transport) as client:
        for _ in range(2):
            response = await client.post(url, json={})
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.json() == GEMINI_429  # the body read is still the client's
    return statuses


@pytest.mark.parametrize("adapter", ["httpx2", "httpx", "aiohttp"])
@pytest.mark.parametrize("status", [429, 400])
def test_a_429_body_that_states_the_wait_blocks_the_scope(
    llm_server: LocalServer, adapter: str, status: int
) -> None:
    # Gemini sends no rate-limit header: its 429 says "retryDelay": "0.5s" and
    # "Please retry in 0.6s" in a small JSON body. Every adapter hands that body
    # to the limiter, which blocks the scope for the longer of the two. The
    # same body on a 400 is not read for a wait.
    refusal = Reply(
        status=status,
        body=json.dumps(GEMINI_429).encode(),
        headers={"content-type": "application/json; charset=UTF-8"},
    )
    llm_server.route(API, behaviour=Script(refusal, then=Reply()))
    honour = throttlekit.Backoff(headers_only=True)  # the wait, not a step of the delay
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=None, delay=0, backoff=honour)
    )
    statuses = asyncio.run(_two_calls(adapter, limiter, llm_server.proxy_url))
    assert statuses == [status, 200]
    first, second = llm_server.hits(API)
    gap = second.arrived - first.arrived
    if status == 429:
        assert 0.6 <= gap < 1.1, gap
    else:
        assert gap < 0.3, gap


class ChunkedJSON:
    """A JSON answer sent chunked and gzipped, with no Content-Length, as Gemini sends its 429."""

    def __init__(self, document: Any, status: int = 429) -> None:
        self.body = json.dumps(document).encode()
        self.status = status

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        response = web.StreamResponse(
            status=self.status, headers={"Content-Type": "application/json; charset=UTF-8"}
        )
        response.enable_compression(web.ContentCoding.gzip)
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(self.body)
        await response.write_eof()
        return response


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_a_chunked_gzipped_429_body_is_read_up_to_its_limit(
    llm_server: LocalServer, library: tuple[Any, Any]
) -> None:
    # Gemini's real 429 has no Content-Length (chunked, gzip): the transport
    # reads at most 16 KiB of it. A small one blocks the scope for the wait it
    # states; a larger one is given to the client whole, unread by the limiter.
    module, adapter = library
    noise = random.Random(1).randbytes(24_000).hex()  # 48 kB that gzip leaves above 16 KiB
    large = {"error": {"message": f"Please retry in 0.6s. {noise}"}}
    llm_server.route(API, "/small", Script(ChunkedJSON(GEMINI_429), then=Reply()))
    llm_server.route(API, "/large", Script(ChunkedJSON(large), then=Reply()))
    honour = throttlekit.Backoff(headers_only=True)
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=None, delay=0, backoff=honour)
    )
    transport = adapter.ThrottledTransport(
        limiter, module.AsyncHTTPTransport(proxy=llm_server.proxy_url)
    )
    async with module.AsyncClient(transport=transport) as client:
        first = await client.get(f"http://{API}/large")
        assert first.status_code == 429
        assert first.json() == large  # the whole body, though the limiter read only a part
        assert "content-length" not in first.headers
        stats = limiter.scope_statistics(API)
        assert stats is not None
        assert stats.blocked_until < anyio.current_time()  # not read for a wait
        second = await client.get(f"http://{API}/small")
        assert second.status_code == 429
        assert second.json() == GEMINI_429
        third = await client.get(f"http://{API}/small")
        assert third.status_code == 200
        assert limiter.statistics().in_flight == 0
    small = llm_server.hits(API, "/small")
    assert 0.6 <= small[1].arrived - small[0].arrived < 1.1


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_sync_sdk_clients_from_threads_keep_within_the_budget(
    llm_server: LocalServer, sdk: str
) -> None:
    # The SDKs' synchronous clients send through httpx2.Client: its
    # SyncThrottledTransport (the httpx one's shared code) with a SyncLimiter
    # keeps 12 calls from 4 threads within 3 requests per quarter second, every
    # call answered, none refused, each usage correcting its estimate.
    import concurrent.futures

    import anthropic
    import openai

    window = 0.25
    dialect = "anthropic" if sdk == "anthropic" else "openai"
    api = LLMAPI(requests=3, tokens=10_000, window=window, dialect=dialect)
    llm_server.route(API, behaviour=api)
    limiter = throttlekit.SyncLimiter(
        scopes={
            API: throttlekit.ScopePolicy(concurrency=None, delay=0, quota=3, window=window * 1.1),
            "tokens": throttlekit.ScopePolicy(concurrency=None, delay=0, quota=10_000),
        },
        default=throttlekit.ScopePolicy(concurrency=None, delay=0),
    )
    transport = httpx2_adapter.SyncThrottledTransport(
        limiter,
        httpx2.HTTPTransport(proxy=llm_server.proxy_url),
        consumed=token_usage("tokens"),
    )
    http_client = httpx2.Client(transport=transport)
    if sdk == "openai":
        oa = openai.OpenAI(
            api_key="sk-test", base_url=f"http://{API}/v1", max_retries=0, http_client=http_client
        )

        def call(n: int) -> str:
            with throttling(scopes={API: 1, "tokens": 150}):
                completion = oa.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"hi {n}"}]
                )
            return completion.choices[0].message.content or ""

    else:
        an = anthropic.Anthropic(
            api_key="sk-ant-test", base_url=f"http://{API}", max_retries=0, http_client=http_client
        )

        def call(n: int) -> str:
            with throttling(scopes={API: 1, "tokens": 150}):
                message = an.messages.create(
                    model="m", max_tokens=10, messages=[{"role": "user", "content": f"hi {n}"}]
                )
            return "".join(b.text for b in message.content if b.type == "text")

    with http_client, concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, range(12)))
    assert answers == ["Hello!"] * 12
    assert api.refusals() == 0, api.answers
    assert limiter.statistics().scopes["tokens"].quota_used == 12 * USED
    assert limiter.statistics().in_flight == 0
