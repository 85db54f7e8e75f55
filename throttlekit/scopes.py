"""Scope resolvers: which scopes a request belongs to, and what it costs of each.

A resolver takes a request-like (a URL string, or any object with ``.url``)
and returns its scopes as a string, a set of strings, or a mapping
``{scope: cost}``; :func:`as_scope_costs` turns any of those into the
canonical ``dict[str, float]``. Resolvers may be plain functions or
coroutine functions.

Built-in resolvers:

* :func:`by_host` (the default): the URL's host, lower-cased, with the port
  when it is explicit. Every subdomain is its own scope.
* :func:`by_registrable_domain`: the registrable domain (``books.toscrape.com``
  → ``toscrape.com``), from the Public Suffix List snapshot bundled with
  tldextract; never fetched from the network.
* :func:`by_domain_hierarchy`: the registrable domain *and* every subdomain
  level under it, so a limit on ``toscrape.com`` caps all its subdomains
  together while each subdomain keeps its own limits too.
* :func:`by_endpoint`: host plus path (no query string).

Hosts are normalized: lower-cased, without a trailing dot, and
internationalized names in their ASCII (IDNA, ``xn--``) form, the one sent
on the wire, so ``https://münchen.de/`` and ``https://xn--mnchen-3ya.de/``
are one scope, ``xn--mnchen-3ya.de``: name such a host that way in policies
(``Limiter(scopes=...)``, ``THROTTLING_SCOPES``), since scope names given
there are used as written.

A request that carries ``throttling_scopes`` (in Scrapy's ``request.meta``,
in httpx's ``request.extensions``, or as ``acquire(scopes=...)``) uses those
scopes *instead of* the resolver's. A valid URL whose scheme has no host
(``file:///x``, ``mailto:a@example.com``, ``data:,x``) gets the scope
:data:`FALLBACK_SCOPE`. Anything else that is not an absolute URL with a host
(``"example.com/path"``, which lacks its scheme, ``"not a url"``, ``""``,
``"https://"``, a port above 65535) raises :class:`ValueError` naming it.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

__all__ = [
    "FALLBACK_SCOPE",
    "Resolver",
    "ScopeCosts",
    "ScopesLike",
    "add_scope",
    "as_scope_costs",
    "by_domain_hierarchy",
    "by_endpoint",
    "by_host",
    "by_registrable_domain",
    "request_scopes",
    "request_url",
    "scope_cache",
]

#: The scope of a request whose URL has no host.
FALLBACK_SCOPE = "(no host)"

#: Scopes with their costs, ``{scope: cost}``: what :func:`as_scope_costs` returns.
ScopeCosts = dict[str, float]
#: What a resolver may return: one scope, several, or scopes with costs.
ScopesLike = str | Iterable[str] | Mapping[str, float]
#: A resolver: takes a request-like, returns (or awaits to) its scopes.
Resolver = Callable[[Any], ScopesLike | Awaitable[ScopesLike]]

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def as_scope_costs(value: ScopesLike) -> ScopeCosts:
    """Normalize a resolver's result to ``{scope: cost}``.

    A string is one scope of cost 1.0; an iterable of strings is several
    scopes of cost 1.0; a mapping gives each scope's cost (a finite number
    >= 0). Raises :class:`TypeError` or :class:`ValueError` otherwise.
    """
    if isinstance(value, str):
        return {value: 1.0}
    if isinstance(value, Mapping):
        result: ScopeCosts = {}
        for scope, cost in value.items():
            if not isinstance(scope, str):
                raise TypeError(f"scope names must be str, got {scope!r}")
            if isinstance(cost, bool) or not isinstance(cost, (int, float)):
                raise TypeError(f"cost of scope {scope!r} must be a number, got {cost!r}")
            if not (math.isfinite(cost) and cost >= 0):
                raise ValueError(f"cost of scope {scope!r} must be finite and >= 0, got {cost!r}")
            result[scope] = float(cost)
        if not result:
            raise ValueError("a request must belong to at least one scope")
        return result
    if isinstance(value, (bytes, bytearray)):
        raise TypeError(f"scopes must be str, not bytes: {value!r}")
    if isinstance(value, Iterable):
        result = {}
        for scope in value:
            if not isinstance(scope, str):
                raise TypeError(f"scope names must be str, got {scope!r}")
            result[scope] = 1.0
        if not result:
            raise ValueError("a request must belong to at least one scope")
        return result
    raise TypeError(
        f"scopes must be a str, an iterable of str or a mapping of str to cost, got {value!r}"
    )


def add_scope(scopes: ScopesLike, scope: str, cost: float = 1.0) -> ScopeCosts:
    """Return ``scopes`` with ``scope`` added at ``cost`` (replacing its cost if present).

    Use it in a resolver that extends the default scopes::

        def resolver(request):
            return add_scope(by_host(request), "api-budget", 2.5)
    """
    result = as_scope_costs(scopes)
    result.update(as_scope_costs({scope: cost}))
    return result


def request_url(request: Any) -> str:
    """The URL of a request-like as a string (``str``, ``.url``, httpx's ``URL``)."""
    if isinstance(request, str):
        return request
    url = getattr(request, "url", None)
    if url is None:
        raise TypeError(f"a request must be a URL string or have a .url, got {request!r}")
    return url if isinstance(url, str) else str(url)


def request_scopes(request: Any) -> ScopesLike | None:
    """The ``throttling_scopes`` a request carries in ``.meta`` or ``.extensions``, if any."""
    if isinstance(request, str):
        return None
    for attribute in ("meta", "extensions"):
        container = getattr(request, attribute, None)
        if container:
            try:
                value = container.get("throttling_scopes")
            except (AttributeError, TypeError):
                continue
            if value is not None:
                return value  # type: ignore[no-any-return]
    return None


# "host:port/..." parsed as scheme "host" and path "port/...": a forgotten scheme.
_PORT_AFTER_COLON = re.compile(r"[0-9]+(?:[/?#]|$)")


def _ascii_host(host: str) -> str:
    """An internationalized host name in its ASCII (IDNA) form; others unchanged."""
    if host.isascii():
        return host
    import idna  # a dependency of anyio

    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError:
        pass
    try:
        return host.encode("idna").decode("ascii")  # IDNA 2003, more lenient
    except UnicodeError:
        return host  # no ASCII spelling exists: the host names itself


@functools.lru_cache(maxsize=4096)
def _host_of(url: str) -> str:
    text = url.strip()
    try:
        parts = urlsplit(text)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if not scheme or (not parts.netloc and _PORT_AFTER_COLON.match(parts.path)):
        raise ValueError(f"{url!r} is not an absolute URL: it has no scheme (such as 'https://')")
    host = (host or "").rstrip(".")
    if not host:
        if scheme in _DEFAULT_PORTS:
            raise ValueError(f"{url!r} has no host")
        return FALLBACK_SCOPE  # a URL scheme without hosts: file:, mailto:, data:
    host = f"[{host}]" if ":" in host else _ascii_host(host)  # an IPv6 literal in brackets
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        return f"{host}:{port}"
    return host


_NETLOC = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#]*)")
_ODD_NETLOC = re.compile(r"[@\[\] %\\\tA-Z]")


def _fast_host(url: str) -> str | None:
    """The host of a plain ``scheme://host[:port]/...`` URL, or None for the odd cases."""
    match = _NETLOC.match(url)
    if match is None:
        return None
    netloc = match[2]
    if not netloc or netloc[-1] == "." or not netloc.isascii() or _ODD_NETLOC.search(netloc):
        return None
    if ":" in netloc:
        host, _, port = netloc.partition(":")
        if not host or not port.isdigit() or not port.isascii() or len(port) > 5:
            return None
        number = int(port)
        if number > 65535:
            return None
        if number == _DEFAULT_PORTS.get(match[1].lower()):
            return host
        return f"{host}:{number}"
    return netloc


# Host of each recently seen origin prefix (``https://example.com``): the text of an
# http(s) URL up to the first "/" after the scheme holds its whole authority, so it
# determines the host. Bounded; cleared when full (a miss only costs a re-parse).
_ORIGINS: dict[str, str] = {}
_ORIGINS_MAX = 4096


def _host_uncached(url: str) -> str:
    host = _fast_host(url)
    return host if host is not None else _host_of(url)


def by_host(request: Any) -> str:
    """The request's host, lower-cased; the port is kept when it is not the default.

    ``https://Books.toscrape.com/x`` → ``books.toscrape.com``;
    ``http://127.0.0.1:8080/`` → ``127.0.0.1:8080``; ``https://münchen.de/`` →
    ``xn--mnchen-3ya.de`` (the IDNA form); a valid URL of a scheme without
    hosts (``file:``, ``mailto:``, ``data:``) → :data:`FALLBACK_SCOPE`.

    :raises ValueError: if the request's URL is not an absolute URL with a
        host (no scheme, an ``http(s)`` URL without a host, a bad port), naming it.
    """
    url = request if type(request) is str else request_url(request)
    if url.startswith(("https://", "http://")):
        end = url.find("/", 8)
        origin = url if end < 0 else url[:end]
        host = _ORIGINS.get(origin)
        if host is None:
            host = _host_uncached(url)
            if len(_ORIGINS) >= _ORIGINS_MAX:
                _ORIGINS.clear()
            _ORIGINS[origin] = host
        return host
    return _host_uncached(url)


_EXTRACT: Any = None


def _extract(host: str) -> tuple[str, str]:
    """(subdomain, registrable domain) of ``host`` from the bundled suffix list."""
    global _EXTRACT
    if _EXTRACT is None:
        import tldextract

        _EXTRACT = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    name, _, port = host.partition(":") if not host.startswith("[") else (host, "", "")
    result = _EXTRACT(name)
    if not (result.domain and result.suffix):
        return "", host
    domain = f"{result.domain}.{result.suffix}"
    if port:
        domain = f"{domain}:{port}"
    return result.subdomain, domain


@functools.lru_cache(maxsize=4096)
def _registrable(host: str) -> str:
    return _extract(host)[1]


@functools.lru_cache(maxsize=4096)
def _hierarchy(host: str) -> frozenset[str]:
    subdomain, domain = _extract(host)
    scopes = {domain}
    if subdomain:
        labels = subdomain.split(".")
        for index in range(len(labels)):
            scopes.add(".".join([*labels[index:], domain]))
    return frozenset(scopes)


def by_registrable_domain(request: Any) -> str:
    """The registrable domain of the request's host (``books.toscrape.com`` → ``toscrape.com``).

    Uses tldextract's bundled Public Suffix List snapshot only (no network).
    IP addresses, ``localhost`` and other hosts without a public suffix are
    returned whole.
    """
    host = by_host(request)
    return host if host == FALLBACK_SCOPE else _registrable(host)


def by_domain_hierarchy(request: Any) -> frozenset[str]:
    """The registrable domain plus every subdomain level below it.

    ``a.b.toscrape.com`` → ``{"toscrape.com", "b.toscrape.com", "a.b.toscrape.com"}``,
    so a policy on ``toscrape.com`` caps all of its subdomains together.
    """
    host = by_host(request)
    return frozenset((host,)) if host == FALLBACK_SCOPE else _hierarchy(host)


def by_endpoint(request: Any) -> str:
    """Host plus path, without query or fragment (``api.example.com/v1/search``)."""
    url = request_url(request)
    host = by_host(url)
    if host == FALLBACK_SCOPE:
        return host
    try:
        path = urlsplit(url.strip()).path
    except ValueError:
        path = ""
    return f"{host}{path or '/'}"


_F = TypeVar("_F", bound=Callable[..., Any])


def scope_cache(resolver: _F | None = None, *, maxsize: int = 10_000) -> Any:
    """Cache a resolver's result per host (for resolvers that depend only on the host).

    Works on plain and coroutine functions, and on methods (the request is the
    last positional argument). Requests carrying their own
    ``throttling_scopes`` bypass the cache. Use it bare or with ``maxsize``::

        @scope_cache
        def resolver(request): ...

        @scope_cache(maxsize=1000)
        async def resolver(request): ...
    """
    if resolver is None:
        return functools.partial(scope_cache, maxsize=maxsize)
    if not callable(resolver):
        raise TypeError(f"scope_cache needs a callable, got {resolver!r}")
    if maxsize < 1:
        raise ValueError(f"maxsize must be >= 1, got {maxsize!r}")
    cache: OrderedDict[Any, ScopeCosts] = OrderedDict()

    def remember(key: Any, value: ScopesLike) -> ScopeCosts:
        costs = as_scope_costs(value)
        cache[key] = costs
        if len(cache) > maxsize:
            cache.popitem(last=False)
        return dict(costs)

    def key_of(args: tuple[Any, ...]) -> Any:
        request = args[-1]
        if request_scopes(request) is not None:
            return None
        return (args[:-1], by_host(request))

    if inspect.iscoroutinefunction(resolver):

        @functools.wraps(resolver)
        async def async_wrapper(*args: Any) -> ScopeCosts:
            key = key_of(args)
            if key is not None and key in cache:
                cache.move_to_end(key)
                return dict(cache[key])
            value = await resolver(*args)
            return remember(key, value) if key is not None else as_scope_costs(value)

        async_wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
        return async_wrapper

    @functools.wraps(resolver)
    def wrapper(*args: Any) -> ScopeCosts:
        key = key_of(args)
        if key is not None and key in cache:
            cache.move_to_end(key)
            return dict(cache[key])
        value = resolver(*args)
        return remember(key, value) if key is not None else as_scope_costs(value)

    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    return wrapper
