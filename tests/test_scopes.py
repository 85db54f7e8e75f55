"""Tests for :mod:`throttlekit.scopes`: resolvers, scope normalization and the scope cache."""

from __future__ import annotations

import math
import re
import socket
from typing import Any
from urllib.parse import urlsplit

import anyio
import attrs
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throttlekit import scopes
from throttlekit.scopes import (
    FALLBACK_SCOPE,
    add_scope,
    as_scope_costs,
    by_domain_hierarchy,
    by_endpoint,
    by_host,
    by_registrable_domain,
    request_scopes,
    request_url,
    scope_cache,
)


@attrs.define
class Request:
    url: Any
    meta: Any = None
    extensions: Any = None


# -- by_host -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://books.toscrape.com/catalogue/page-1.html", "books.toscrape.com"),
        ("https://Books.ToScrape.COM/x", "books.toscrape.com"),
        ("HTTPS://EXAMPLE.COM", "example.com"),
        ("https://example.com./x", "example.com"),
        # Internationalized names: the IDNA (ASCII) form, whatever the spelling.
        ("https://bücher.example/", "xn--bcher-kva.example"),
        ("https://BÜCHER.example/", "xn--bcher-kva.example"),
        ("https://bÜcher.example/", "xn--bcher-kva.example"),
        ("https://xn--bcher-kva.example/", "xn--bcher-kva.example"),
        ("https://XN--BCHER-KVA.example/", "xn--bcher-kva.example"),
        ("https://bücher.example:8443/", "xn--bcher-kva.example:8443"),
        ("https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/", "example.com"),  # full-width
        # Default ports are dropped, others kept.
        ("http://example.com:80/", "example.com"),
        ("https://example.com:443/", "example.com"),
        ("http://example.com:443/", "example.com:443"),
        ("https://example.com:8443/", "example.com:8443"),
        ("http://example.com:080/", "example.com"),
        ("ws://example.com:80/socket", "example.com"),
        ("wss://example.com:443/socket", "example.com"),
        ("ftp://example.com:21/file", "example.com:21"),
        ("https://example.com:/x", "example.com"),
        # IP addresses.
        ("http://127.0.0.1:8080/", "127.0.0.1:8080"),
        ("http://[::1]:8080/", "[::1]:8080"),
        ("https://[::1]:443/", "[::1]"),
        ("http://[2001:DB8::1]/path", "[2001:db8::1]"),
        # User info is not part of the scope.
        ("https://user:secret@Example.com:8443/x", "example.com:8443"),
        ("https://user@example.com/", "example.com"),
        # Query or fragment right after the host.
        ("https://example.com?page=2", "example.com"),
        ("https://example.com#top", "example.com"),
        ("  https://example.com/padded  ", "example.com"),
        # Valid URLs of schemes without hosts: the documented fallback scope.
        ("mailto:someone@example.com", FALLBACK_SCOPE),
        ("file:///etc/hosts", FALLBACK_SCOPE),
        ("data:,hello", FALLBACK_SCOPE),
        ("about:blank", FALLBACK_SCOPE),
    ],
)
def test_by_host(url: str, expected: str) -> None:
    assert by_host(url) == expected
    assert by_host(url) == expected  # and again, from the cache
    assert by_host(Request(url)) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("example.com/path", "no scheme"),
        ("example.com", "no scheme"),
        ("localhost:8080/x", "no scheme"),
        ("example.com:8080", "no scheme"),
        ("/relative/path", "no scheme"),
        ("not a url", "no scheme"),
        ("", "no scheme"),
        ("   ", "no scheme"),
        ("http://", "no host"),
        ("https://", "no host"),
        ("http:///path", "no host"),
        ("https://:8443/", "no host"),
        ("http://[::1", "not a valid URL"),
        ("http://example.com:99999/", "not a valid URL"),
        ("http://example.com:port/", "not a valid URL"),
    ],
)
def test_by_host_rejects_what_is_not_a_url_with_a_host(url: str, reason: str) -> None:
    """Misuse is an error naming the value, not a silent shared ``(no host)`` scope."""
    for attempt in range(2):  # the second time from any cache
        with pytest.raises(ValueError, match=re.escape(repr(url))) as error:
            by_host(url if attempt == 0 else Request(url))
        assert reason in str(error.value)
    for resolver in (by_registrable_domain, by_domain_hierarchy, by_endpoint):
        with pytest.raises(ValueError, match=re.escape(repr(url))):
            resolver(url)


def test_unicode_and_punycode_spellings_are_one_scope() -> None:
    spellings = [
        "https://münchen.example/a",
        "https://MÜNCHEN.example/b",
        "https://xn--mnchen-3ya.example/c",
        httpx.Request("GET", "https://münchen.example/d"),  # httpx sends the ASCII form
    ]
    assert {by_host(url) for url in spellings} == {"xn--mnchen-3ya.example"}
    assert {by_registrable_domain(url) for url in spellings} == {"xn--mnchen-3ya.example"}
    assert by_domain_hierarchy("https://shop.münchen.de/") == {
        "xn--mnchen-3ya.de",
        "shop.xn--mnchen-3ya.de",
    }
    assert by_registrable_domain("https://shop.xn--mnchen-3ya.de/") == "xn--mnchen-3ya.de"
    assert by_registrable_domain("https://shop.пример.рф/") == "xn--e1afmkfd.xn--p1ai"
    assert by_endpoint("https://münchen.example/v1?x") == "xn--mnchen-3ya.example/v1"


def test_by_host_reads_request_likes() -> None:
    request = httpx.Request("GET", "https://API.example.com:8443/v1")
    assert by_host(request) == "api.example.com:8443"
    with pytest.raises(TypeError, match=r"URL string or have a \.url"):
        by_host(42)


_SCHEMES = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": None}
_labels = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1)


@settings(deadline=None, max_examples=300)
@given(
    scheme=st.sampled_from(sorted(_SCHEMES)),
    labels=st.lists(_labels.filter(lambda s: not s.startswith("-")), min_size=1, max_size=4),
    port=st.one_of(st.none(), st.integers(0, 65535)),
    userinfo=st.sampled_from(["", "user@", "user:pw@"]),
    rest=st.sampled_from(["", "/", "/a/b?c=d", "?q", "#f", "/x:y@z"]),
)
def test_by_host_matches_the_standard_parser(
    scheme: str, labels: list[str], port: int | None, userinfo: str, rest: str
) -> None:
    """The fast path and the fallback agree with ``urllib.parse`` on every plain URL."""
    host = ".".join(labels)
    url = f"{scheme}://{userinfo}{host}{'' if port is None else f':{port}'}{rest}"
    parts = urlsplit(url)
    expected = parts.hostname
    assert expected is not None
    if parts.port is not None and parts.port != _SCHEMES[scheme]:
        expected = f"{expected}:{parts.port}"
    assert by_host(url) == expected
    assert by_host(url.upper().replace(scheme.upper(), scheme, 1)) == expected.lower()


# -- registrable domain and hierarchy ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "domain", "hierarchy"),
    [
        (
            "https://books.toscrape.com/",
            "toscrape.com",
            {"toscrape.com", "books.toscrape.com"},
        ),
        ("https://toscrape.com/", "toscrape.com", {"toscrape.com"}),
        (
            "https://a.b.Example.co.uk/x",
            "example.co.uk",
            {"example.co.uk", "b.example.co.uk", "a.b.example.co.uk"},
        ),
        (
            "https://www.example.com.au:8443/",
            "example.com.au:8443",
            {"example.com.au:8443", "www.example.com.au:8443"},
        ),
        ("https://city.kawasaki.jp/", "city.kawasaki.jp", {"city.kawasaki.jp"}),
        ("https://co.uk/", "co.uk", {"co.uk"}),  # a bare public suffix is kept whole
        ("http://127.0.0.1:8080/", "127.0.0.1:8080", {"127.0.0.1:8080"}),
        ("http://[::1]:8080/", "[::1]:8080", {"[::1]:8080"}),
        ("http://localhost:8000/", "localhost:8000", {"localhost:8000"}),
        ("http://intranet/", "intranet", {"intranet"}),
        ("mailto:x@example.com", FALLBACK_SCOPE, {FALLBACK_SCOPE}),
    ],
)
def test_registrable_domain_and_hierarchy(url: str, domain: str, hierarchy: set[str]) -> None:
    assert by_registrable_domain(url) == domain
    assert by_domain_hierarchy(url) == hierarchy
    assert by_domain_hierarchy(Request(url)) == hierarchy


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Fail (and record) any attempt to resolve a name or open a connection."""
    attempts: list[tuple[Any, ...]] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("network access in a test that must stay offline")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_public_suffix_list_is_the_bundled_snapshot(
    monkeypatch: pytest.MonkeyPatch, no_network: list[tuple[Any, ...]]
) -> None:
    # Start from scratch: a new extractor and empty caches, all while offline.
    monkeypatch.setattr(scopes, "_EXTRACT", None)
    scopes._registrable.cache_clear()
    scopes._hierarchy.cache_clear()
    assert by_registrable_domain("https://shop.example.co.uk/") == "example.co.uk"
    assert by_domain_hierarchy("https://a.b.example.org/") == {
        "example.org",
        "b.example.org",
        "a.b.example.org",
    }
    assert no_network == []
    extractor = scopes._EXTRACT
    assert extractor is not None
    assert tuple(extractor.suffix_list_urls) == ()
    assert not extractor._cache.enabled, "no cache directory may be written"
    scopes._registrable.cache_clear()
    scopes._hierarchy.cache_clear()


# -- by_endpoint -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.example.com/v1/search?q=cats#x", "api.example.com/v1/search"),
        ("https://API.example.com:8443/v1/items/", "api.example.com:8443/v1/items/"),
        ("https://api.example.com", "api.example.com/"),
        ("https://api.example.com?q=1", "api.example.com/"),
        ("file:///etc/hosts", FALLBACK_SCOPE),
    ],
)
def test_by_endpoint(url: str, expected: str) -> None:
    assert by_endpoint(url) == expected
    assert by_endpoint(Request(url)) == expected


# -- normalization -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a", {"a": 1.0}),
        ({"a", "b"}, {"a": 1.0, "b": 1.0}),
        (frozenset({"a"}), {"a": 1.0}),
        (["a", "b", "a"], {"a": 1.0, "b": 1.0}),
        ((name for name in ("x", "y")), {"x": 1.0, "y": 1.0}),
        ({"a": 2, "b": 0.5, "free": 0}, {"a": 2.0, "b": 0.5, "free": 0.0}),
    ],
)
def test_as_scope_costs(value: Any, expected: dict[str, float]) -> None:
    result = as_scope_costs(value)
    assert result == expected
    assert all(type(cost) is float for cost in result.values())


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ({1: 1.0}, TypeError, "scope names must be str"),
        ([b"a"], TypeError, "scope names must be str"),
        (b"a", TypeError, "not bytes"),
        (bytearray(b"a"), TypeError, "not bytes"),
        (42, TypeError, "scopes must be a str"),
        (None, TypeError, "scopes must be a str"),
        ({"a": "1"}, TypeError, "cost of scope 'a' must be a number"),
        ({"a": None}, TypeError, "cost of scope 'a' must be a number"),
        ({"a": False}, TypeError, "cost of scope 'a' must be a number"),
        ({"a": -0.5}, ValueError, "cost of scope 'a' must be finite and >= 0"),
        ({"a": math.inf}, ValueError, "finite"),
        ({"a": math.nan}, ValueError, "finite"),
        ({}, ValueError, "at least one scope"),
        ([], ValueError, "at least one scope"),
    ],
)
def test_as_scope_costs_rejects_bad_values(value: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        as_scope_costs(value)


def test_add_scope() -> None:
    assert add_scope("a.example", "budget", 2.5) == {"a.example": 1.0, "budget": 2.5}
    assert add_scope({"x", "y"}, "x", 3) == {"x": 3.0, "y": 1.0}
    assert add_scope(by_domain_hierarchy("https://a.example.com/"), "pool") == {
        "example.com": 1.0,
        "a.example.com": 1.0,
        "pool": 1.0,
    }
    original = {"a": 1.0}
    add_scope(original, "b")
    assert original == {"a": 1.0}, "add_scope must not modify its argument"
    with pytest.raises(ValueError, match="finite and >= 0"):
        add_scope("a", "b", -1)
    with pytest.raises(TypeError, match="scope names must be str"):
        add_scope("a", 3, 1.0)  # type: ignore[arg-type]


def test_request_url_and_request_scopes() -> None:
    assert request_url("https://a/") == "https://a/"
    assert request_url(Request("https://b/")) == "https://b/"
    assert request_url(httpx.Request("GET", "https://c/x")) == "https://c/x"
    with pytest.raises(TypeError):
        request_url(object())
    assert request_scopes("https://a/") is None
    assert request_scopes(Request("https://a/")) is None
    assert request_scopes(Request("https://a/", meta={})) is None
    assert request_scopes(Request("https://a/", meta={"other": 1})) is None
    assert request_scopes(Request("https://a/", meta=["not", "a", "mapping"])) is None
    assert request_scopes(Request("https://a/", meta={"throttling_scopes": "s"})) == "s"
    assert request_scopes(Request("https://a/", extensions={"throttling_scopes": {"e"}})) == {"e"}
    both = Request(
        "https://a/", meta={"throttling_scopes": "m"}, extensions={"throttling_scopes": "e"}
    )
    assert request_scopes(both) == "m"
    httpx_request = httpx.Request("GET", "https://a/", extensions={"throttling_scopes": {"k": 2}})
    assert request_scopes(httpx_request) == {"k": 2}


# -- scope_cache -------------------------------------------------------------------------------


def test_scope_cache_on_a_sync_resolver() -> None:
    calls: list[str] = []

    @scope_cache(maxsize=2)
    def resolver(request: Any) -> Any:
        calls.append(request_url(request))
        return {by_host(request), "pool"}

    assert resolver("https://a.example/1") == {"a.example": 1.0, "pool": 1.0}
    assert resolver("https://A.example/2") == {"a.example": 1.0, "pool": 1.0}
    assert resolver(Request("https://a.example/3")) == {"a.example": 1.0, "pool": 1.0}
    assert calls == ["https://a.example/1"], "one call per host"
    resolver("https://a.example/").clear()  # callers get copies
    assert resolver("https://a.example/") == {"a.example": 1.0, "pool": 1.0}
    resolver("https://b.example/")
    resolver("https://a.example/")  # a is now the most recently used
    resolver("https://c.example/")  # evicts b
    resolver("https://a.example/")
    resolver("https://b.example/")
    assert calls == [
        "https://a.example/1",
        "https://b.example/",
        "https://c.example/",
        "https://b.example/",
    ]
    # Requests that carry their own scopes are not cached under their host.
    carried = Request("https://a.example/", meta={"throttling_scopes": "x"})
    resolver(carried)
    resolver(carried)
    assert calls[-2:] == ["https://a.example/", "https://a.example/"]
    resolver.cache_clear()
    resolver("https://a.example/")
    assert calls[-1] == "https://a.example/"
    assert resolver.__name__ == "resolver"


def test_scope_cache_bare_decorator_and_bad_arguments() -> None:
    @scope_cache
    def resolver(request: Any) -> str:
        return "s"

    assert resolver("https://a/") == {"s": 1.0}
    with pytest.raises(ValueError, match="maxsize must be >= 1"):
        scope_cache(maxsize=0)(resolver)
    with pytest.raises(TypeError, match="needs a callable"):
        scope_cache(42)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_scope_cache_on_an_async_resolver() -> None:
    calls: list[str] = []

    @scope_cache
    async def resolver(request: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        calls.append(request)
        return {by_host(request): 2.0}

    assert await resolver("https://a.example/1") == {"a.example": 2.0}
    assert await resolver("https://a.example/2") == {"a.example": 2.0}
    assert await resolver("https://b.example/") == {"b.example": 2.0}
    assert calls == ["https://a.example/1", "https://b.example/"]


def test_scope_cache_on_methods_is_per_instance() -> None:
    class Tenant:
        def __init__(self, name: str) -> None:
            self.name = name
            self.calls = 0

        @scope_cache
        def resolve(self, request: Any) -> dict[str, float]:
            self.calls += 1
            return {f"{self.name}:{by_host(request)}": 1.0}

    first, second = Tenant("one"), Tenant("two")
    assert first.resolve("https://a.example/x") == {"one:a.example": 1.0}
    assert first.resolve("https://a.example/y") == {"one:a.example": 1.0}
    assert second.resolve("https://a.example/x") == {"two:a.example": 1.0}
    assert (first.calls, second.calls) == (1, 1)


@pytest.mark.anyio
async def test_cached_resolvers_drive_a_limiter() -> None:
    from throttlekit import Limiter, ScopePolicy

    calls = 0

    @scope_cache
    async def resolver(request: Any) -> Any:
        nonlocal calls
        calls += 1
        return add_scope(by_registrable_domain(request), "everything")

    limiter = Limiter(
        default=ScopePolicy(concurrency=None, delay=0, slot_delay=0), resolver=resolver
    )
    for url in ("https://a.example.com/", "https://a.example.com/2", "https://b.example.com/"):
        async with limiter.acquire(url) as permit:
            assert permit.scopes == {"example.com": 1.0, "everything": 1.0}
    assert calls == 2
