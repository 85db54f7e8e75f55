"""Many concurrent OpenAI SDK calls within a requests budget and a tokens budget.

The SDK sends through httpx2, its own HTTP library (``pip install openai
"throttlekit-http[httpx2]"``); ThrottledTransport throttles every request it
sends on two scopes: the API host (requests) and "openai-tokens" (tokens).
Each call declares the tokens it expects; the response's ``usage`` corrects
them, and the ``x-ratelimit-*`` headers pace each scope by its own budget.
"""

from __future__ import annotations

import anyio
import httpx2
import openai

import throttlekit
from throttlekit.adapters.httpx2 import ThrottledTransport, throttling, token_usage

HOST = "api.openai.com"
TOKENS = "openai-tokens"
#: Our window is a little longer than the server's: sends that leave together
#: may arrive a few milliseconds apart.
MARGIN = 1.05


def build_limiter(*, requests: int, tokens: int, window: float) -> throttlekit.Limiter:
    """A limiter that keeps within ``requests`` and ``tokens`` per ``window`` seconds."""
    free = throttlekit.ScopePolicy(concurrency=None, delay=0)
    return throttlekit.Limiter(
        scopes={
            HOST: throttlekit.ScopePolicy(
                concurrency=None, delay=0, quota=requests, window=window * MARGIN
            ),
            TOKENS: throttlekit.ScopePolicy(
                concurrency=None, delay=0, quota=tokens, window=window * MARGIN
            ),
        },
        default=free,
        concurrency=64,
    )


def build_client(
    limiter: throttlekit.Limiter,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> openai.AsyncOpenAI:
    """The SDK on a throttled httpx2 client; the limiter paces, so the SDK never retries.

    ``api_key=None`` reads ``OPENAI_API_KEY``; ``transport`` is the one that
    sends (``None``: httpx2's default).
    """
    throttled = ThrottledTransport(
        limiter,
        transport,
        budgets={"tokens": TOKENS},  # x-ratelimit-*-tokens pace the token scope
        consumed=token_usage(TOKENS),  # the response's usage corrects the estimate
    )
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=throttled),
    )


def expected_tokens(prompt: str, max_tokens: int) -> int:
    """A cheap estimate of a call's tokens: about 4 characters a token, plus the answer."""
    return len(prompt) // 4 + max_tokens


async def ask(client: openai.AsyncOpenAI, prompt: str, max_tokens: int = 50) -> str:
    """One chat completion, declared as 1 request and its expected tokens."""
    with throttling(scopes={HOST: 1, TOKENS: expected_tokens(prompt, max_tokens)}):
        completion = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
        )
    return completion.choices[0].message.content or ""


async def ask_all(client: openai.AsyncOpenAI, prompts: list[str]) -> list[str]:
    """All prompts at once; the limiter sends them as fast as the budgets allow."""
    answers = [""] * len(prompts)

    async def one(index: int) -> None:
        answers[index] = await ask(client, prompts[index])

    async with client, anyio.create_task_group() as tasks:
        for index in range(len(prompts)):
            tasks.start_soon(one, index)
    return answers


if __name__ == "__main__":
    # With a real key: OPENAI_API_KEY in the environment, your tier's limits here.
    limiter = build_limiter(requests=500, tokens=200_000, window=60.0)
    prompts = [f"Say hello number {n}" for n in range(50)]
    print(anyio.run(ask_all, build_client(limiter), prompts))
