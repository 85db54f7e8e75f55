"""Many concurrent Anthropic SDK calls within a requests budget and a tokens budget.

The same recipe as ``cookbook_openai.py`` for ``anthropic.AsyncAnthropic``,
which also sends through httpx2. Anthropic reports four budgets in its
``anthropic-ratelimit-*`` headers; the token scope tracks ``tokens`` (input
and output together), and a message's ``usage`` (``input_tokens +
output_tokens``) corrects each call's estimate.
"""

from __future__ import annotations

import anthropic
import anyio
import httpx2

import throttlekit
from throttlekit.adapters.httpx2 import ThrottledTransport, throttling, token_usage

HOST = "api.anthropic.com"
TOKENS = "anthropic-tokens"
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
) -> anthropic.AsyncAnthropic:
    """The SDK on a throttled httpx2 client (``api_key=None`` reads ``ANTHROPIC_API_KEY``)."""
    throttled = ThrottledTransport(
        limiter,
        transport,
        budgets={"tokens": TOKENS},  # anthropic-ratelimit-tokens-* pace the token scope
        consumed=token_usage(TOKENS),  # input_tokens + output_tokens correct the estimate
    )
    return anthropic.AsyncAnthropic(
        api_key=api_key,
        base_url=base_url,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=throttled),
    )


async def ask(client: anthropic.AsyncAnthropic, prompt: str, max_tokens: int = 50) -> str:
    """One message, declared as 1 request and its expected tokens (4 characters a token)."""
    with throttling(scopes={HOST: 1, TOKENS: len(prompt) // 4 + max_tokens}):
        message = await client.messages.create(
            model="claude-sonnet-5",
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": prompt}],
        )
    return "".join(block.text for block in message.content if block.type == "text")


async def ask_all(client: anthropic.AsyncAnthropic, prompts: list[str]) -> list[str]:
    """All prompts at once; the limiter sends them as fast as the budgets allow."""
    answers = [""] * len(prompts)

    async def one(index: int) -> None:
        answers[index] = await ask(client, prompts[index])

    async with client, anyio.create_task_group() as tasks:
        for index in range(len(prompts)):
            tasks.start_soon(one, index)
    return answers


if __name__ == "__main__":
    # With a real key: ANTHROPIC_API_KEY in the environment, your tier's limits here.
    limiter = build_limiter(requests=50, tokens=30_000, window=60.0)
    prompts = [f"Say hello number {n}" for n in range(20)]
    print(anyio.run(ask_all, build_client(limiter), prompts))
