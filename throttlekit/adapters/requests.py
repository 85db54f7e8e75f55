"""Throttle a ``requests.Session`` with an adapter mounted on it.

:class:`ThrottledAdapter` is a ``requests.adapters.HTTPAdapter``: mount it on a
session and, for every request sent through it (each hop of a redirect and
each retry included), it

1. waits for a permit from a :class:`~throttlekit.SyncLimiter` (the prepared
   request is the request-like: its URL gives the scopes; the
   :func:`throttling` context manager overrides scopes and priority for the
   requests of a ``with`` block);
2. sends it through the inner adapter (a plain ``HTTPAdapter`` by default,
   or yours);
3. records the status, headers and latency (seconds until the response
   headers arrived), or the exception that ended the request, which is then
   re-raised unchanged;
4. gives the permit back once the body has been read (``stream=False``, the
   default) or, for ``stream=True``, when the response is closed.

Usage::

    import requests
    import throttlekit
    from throttlekit.adapters.requests import ThrottledAdapter

    limiter = throttlekit.SyncLimiter(default=throttlekit.ScopePolicy(concurrency=2, delay=0.5))
    session = requests.Session()
    adapter = ThrottledAdapter(limiter)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    response = session.get("https://example.com/")

One session (and one limiter) can be shared by many threads, e.g. the
workers of a ``ThreadPoolExecutor``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .._sync import SyncLimiter
from ._common import (
    ConsumedHook,
    SyncHeldPermit,
    body_too_large,
    check_budgets,
    is_json,
    json_body,
    missing_extra,
    throttling,
    token_usage,
)

try:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra("throttlekit.adapters.requests", "requests", "requests") from exc

__all__ = ["ThrottledAdapter", "session", "throttling", "token_usage"]


class ThrottledAdapter(HTTPAdapter):
    """A ``requests`` transport adapter that throttles every request through a limiter.

    :param limiter: decides when each request may be sent.
    :param adapter: the adapter that sends (yours, with its own pool and
        urllib3 ``Retry`` for connection errors); ``None`` makes an
        ``HTTPAdapter()``. It is closed with this one.
    :param retries: a urllib3 ``Retry`` whose status retries (``total``,
        ``status``, ``status_forcelist``, ``allowed_methods``,
        ``raise_on_status``) this adapter runs itself, each attempt
        throttled and recorded: a 429's ``Retry-After`` then holds back the
        retry *and* every other request of its scopes, and no thread sleeps
        for it outside the limiter (the ``Retry``'s own backoff sleep is not
        used: the scope's backoff spaces the attempts). ``None``: no retries
        here.
    :param budgets: ``{budget: scope}``, which scope tracks which budget the
        server reports (see :meth:`Permit.record <throttlekit.Permit.record>`).
    :param consumed: ``consumed(response, body)`` gives the real cost per
        scope (e.g. :func:`token_usage`); ``body`` is the parsed JSON body (up
        to 8 MiB), else ``None``.

    Status retries given to urllib3 (``HTTPAdapter(max_retries=Retry(...,
    status_forcelist=...))``) run inside one permit, unseen by the limiter:
    give them to ``retries=`` instead.

    A streamed response (``stream=True``) holds its permit until it is
    closed (``with session.get(url, stream=True) as response:``), as
    requests asks anyway.
    """

    def __init__(
        self,
        limiter: SyncLimiter,
        adapter: requests.adapters.BaseAdapter | None = None,
        *,
        retries: Retry | None = None,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        if not isinstance(limiter, SyncLimiter):
            raise TypeError(
                f"limiter must be a throttlekit.SyncLimiter (requests is synchronous), "
                f"got {limiter!r}"
            )
        if adapter is not None and not isinstance(adapter, requests.adapters.BaseAdapter):
            raise TypeError(f"adapter must be a requests BaseAdapter, got {adapter!r}")
        if retries is not None and not isinstance(retries, Retry):
            raise TypeError(f"retries must be a urllib3 Retry or None, got {retries!r}")
        if consumed is not None and not callable(consumed):
            raise TypeError(f"consumed must be callable or None, got {consumed!r}")
        super().__init__()
        self._limiter = limiter
        self._adapter = HTTPAdapter() if adapter is None else adapter
        self._retries = retries
        self._budgets = check_budgets(budgets)
        self._consumed = consumed

    def __repr__(self) -> str:
        return f"<ThrottledAdapter {self._limiter!r} over {self._adapter!r}>"

    @property
    def limiter(self) -> SyncLimiter:
        """The limiter that throttles this adapter's requests."""
        return self._limiter

    @property
    def adapter(self) -> requests.adapters.BaseAdapter:
        """The wrapped adapter that sends the requests."""
        return self._adapter

    def close(self) -> None:
        """Close the inner adapter (and this one's unused pool)."""
        self._adapter.close()
        super().close()

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, stream: bool = False, **kwargs: Any
    ) -> requests.Response:
        """Wait for a permit, send ``request``, record how it went; retry per ``retries``."""
        retries = self._retries
        while True:
            held = SyncHeldPermit.acquire(self._limiter, request)
            try:
                response = self._attempt(held, request, stream, kwargs)
            except BaseException:
                held.release()
                raise
            retry = retries is not None and retries.is_retry(
                request.method or "GET", response.status_code, "Retry-After" in response.headers
            )
            if retry:
                assert retries is not None
                try:
                    retries = retries.increment(request.method, request.url, response=response.raw)
                except Exception:  # exhausted: MaxRetryError
                    retry = False
                    if retries.raise_on_status:
                        _discard(response, held)
                        raise requests.exceptions.RetryError(
                            f"too many {response.status_code} responses for {request.url}",
                            request=request,
                            response=response,
                        ) from None
            if retry:
                _discard(response, held)  # the limiter now holds the scope back as told
                continue
            if stream:
                _release_on_close(response, held)
            else:
                _read(response, held)
            return response

    def _attempt(
        self,
        held: SyncHeldPermit,
        request: requests.PreparedRequest,
        stream: bool,
        kwargs: dict[str, Any],
    ) -> requests.Response:
        """One send through the inner adapter, recorded (headers only; the body streams)."""
        try:
            response = self._adapter.send(request, stream=True, **kwargs)
        except Exception as exc:
            held.failed(exc)
            raise
        latency = time.monotonic() - held.sent
        consumed = None
        if self._consumed is not None:
            body = None
            if is_json(response.headers) and not body_too_large(response.headers):
                _read(response, held, release=False)
                body = json_body(response.content)
            consumed = self._consumed(response, body)
        held.answered(
            response,
            status=response.status_code,
            headers=response.headers,
            latency=latency,
            consumed=consumed,
            budgets=self._budgets,
        )
        return response


def _read(response: requests.Response, held: SyncHeldPermit, *, release: bool = True) -> None:
    """Read the body now (what ``stream=False`` asks), then give the permit back."""
    try:
        response.content  # noqa: B018 - reads and keeps the body
    except Exception as exc:
        held.body_failed(exc)
        raise
    finally:
        if release:
            held.release()


def _discard(response: requests.Response, held: SyncHeldPermit) -> None:
    """Drop a response that will be retried: its connection back to the pool, its permit freed."""
    try:
        response.close()
    finally:
        held.release()


def _release_on_close(response: requests.Response, held: SyncHeldPermit) -> None:
    """A streamed response gives its permit back when it is closed."""
    close = response.close

    def close_and_release() -> None:
        try:
            close()
        finally:
            held.release()

    response.close = close_and_release  # type: ignore[method-assign]


def session(
    limiter: SyncLimiter | None = None,
    *,
    retries: Retry | None = None,
    budgets: Mapping[str, str] | None = None,
    consumed: ConsumedHook | None = None,
) -> requests.Session:
    """A ``requests.Session`` with a :class:`ThrottledAdapter` mounted for http and https.

    :param limiter: the limiter to use; ``None`` makes a new
        :class:`~throttlekit.SyncLimiter` with its defaults (one request at a
        time per host, 1 s apart).
    :param retries: status retries, each attempt throttled (see :class:`ThrottledAdapter`).

    Usage::

        with throttlekit.adapters.requests.session(limiter) as session:
            response = session.get("https://example.com/")
    """
    adapter = ThrottledAdapter(
        SyncLimiter() if limiter is None else limiter,
        retries=retries,
        budgets=budgets,
        consumed=consumed,
    )
    result = requests.Session()
    result.mount("http://", adapter)
    result.mount("https://", adapter)
    return result
