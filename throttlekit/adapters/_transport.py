"""The throttling transports of httpx and of httpx2, written once against the library given.

httpx2 is a fork of httpx with the same API under another module name. Each
public adapter module (:mod:`throttlekit.adapters.httpx`,
:mod:`throttlekit.adapters.httpx2`) imports its own library, describes it
with :class:`Library` and subclasses :class:`AsyncThrottling` together with
that library's ``AsyncBaseTransport``; everything else lives here and never
imports either library, so each adapter works with its library alone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from types import ModuleType, TracebackType
from typing import Any, ClassVar, TypeVar

import anyio

from .._limiter import Limiter
from .._sync import SyncLimiter
from ._common import (
    ConsumedHook,
    HeldPermit,
    SyncHeldPermit,
    body_too_large,
    check_budgets,
    content_length,
    is_json,
    json_body,
    options,
    read_for_feedback,
)

__all__ = ["AsyncThrottling", "Library", "SyncThrottling", "make_client", "make_sync_client"]

_T = TypeVar("_T", bound="AsyncThrottling")
_S = TypeVar("_S", bound="SyncThrottling")

#: Keyword arguments of ``client()`` that configure the inner transport.
TRANSPORT_OPTIONS = ("verify", "cert", "trust_env", "http1", "http2", "limits", "proxy")


class _ReleasingStream:
    """A response body that gives its permit back when it is closed.

    :class:`Library` makes it a subclass of its module's ``AsyncByteStream``,
    which the client checks a response's stream against.
    """

    __slots__ = ("_held", "_stream")

    def __init__(self, stream: Any, held: HeldPermit) -> None:
        self._stream = stream
        self._held = held

    def __repr__(self) -> str:
        return f"<_ReleasingStream {self._held!r}>"

    def __aiter__(self) -> AsyncIterator[bytes]:
        # A plain iterator, not an async generator: nothing to finalize when
        # the reader stops early, so no extra "never exhausted" warnings.
        return _Chunks(self._stream.__aiter__(), self._held)

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            await self._held.release()


class _Chunks:
    """Iterates a response body; records a failure that ends it early."""

    __slots__ = ("_chunks", "_held")

    def __init__(self, chunks: AsyncIterator[bytes], held: HeldPermit) -> None:
        self._chunks = chunks
        self._held = held

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            if not self._held.released:
                self._held.permit.record(exception=exc, adjust_delay=False)
            raise


class _PrefixedStream:
    """A body whose first chunks were already read: gives them, then the rest.

    :class:`Library` makes it a subclass of its module's ``AsyncByteStream``.
    """

    __slots__ = ("_chunks", "_rest", "_stream")

    def __init__(self, chunks: list[bytes], rest: AsyncIterator[bytes], stream: Any) -> None:
        self._chunks = chunks
        self._rest = rest
        self._stream = stream

    def __repr__(self) -> str:
        return f"<_PrefixedStream {len(self._chunks)} chunks read of {self._stream!r}>"

    def __aiter__(self) -> AsyncIterator[bytes]:
        chunks, self._chunks = self._chunks, []
        return _PrefixedChunks(chunks, self._rest)

    async def aclose(self) -> None:
        closing = getattr(self._rest, "aclose", None)
        try:
            if closing is not None:
                await closing()
        finally:
            await self._stream.aclose()


class _PrefixedChunks:
    """Iterates the chunks already read, then the rest (a plain iterator, as :class:`_Chunks`)."""

    __slots__ = ("_chunks", "_rest")

    def __init__(self, chunks: list[bytes], rest: AsyncIterator[bytes]) -> None:
        self._chunks = chunks[::-1]
        self._rest = rest

    def __aiter__(self) -> _PrefixedChunks:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks:
            return self._chunks.pop()
        return await self._rest.__anext__()


class Library:
    """What the transport needs of httpx or httpx2: its module and its stream class.

    :param module: the imported ``httpx`` or ``httpx2`` module.
    """

    __slots__ = ("module", "name", "prefixed_stream", "releasing_stream", "sync_releasing_stream")

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name = module.__name__
        self.releasing_stream: type[Any] = type(
            "_ReleasingStream", (_ReleasingStream, module.AsyncByteStream), {"__slots__": ()}
        )
        self.prefixed_stream: type[Any] = type(
            "_PrefixedStream", (_PrefixedStream, module.AsyncByteStream), {"__slots__": ()}
        )
        self.sync_releasing_stream: type[Any] = type(
            "_SyncReleasingStream", (_SyncReleasingStream, module.SyncByteStream), {"__slots__": ()}
        )

    def __repr__(self) -> str:
        return f"<Library {self.name}>"

    async def read_body(self, response: Any, limit: int | None = None) -> bytes | None:
        """Read a body in the transport, decoded; the response keeps the same bytes to give on.

        With a ``limit``, at most that many bytes (and one chunk) are read:
        a longer body is given back to the response unread as a whole, and
        ``None`` returned.
        """
        module = self.module
        stream = response.stream
        if not isinstance(stream, module.AsyncByteStream):
            return None
        chunks: list[bytes] = []
        size = 0
        iterator = stream.__aiter__()
        try:
            while limit is None or size <= limit:
                try:
                    chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                chunks.append(chunk)
                size += len(chunk)
            else:
                response.stream = self.prefixed_stream(chunks, iterator, stream)
                return None
        except BaseException:
            await stream.aclose()
            raise
        await stream.aclose()
        raw = b"".join(chunks)
        response.stream = module.ByteStream(raw)
        # The raw bytes may be compressed: decode them as the client will.
        decoded = module.Response(
            response.status_code, headers=response.headers, stream=module.ByteStream(raw)
        ).read()
        return bytes(decoded)


def _read_sync_body(library: Library, response: Any) -> bytes | None:
    """Read a body in a sync transport, decoded; the response keeps the same bytes to give on.

    ``response.read()`` would close the response before the transport's
    releasing stream is in place, so its permit would never be given back.
    """
    module = library.module
    stream = response.stream
    if not isinstance(stream, module.SyncByteStream):
        return None
    try:
        raw = b"".join(stream)
    finally:
        stream.close()
    response.stream = module.ByteStream(raw)
    decoded = module.Response(
        response.status_code, headers=response.headers, stream=module.ByteStream(raw)
    ).read()
    return bytes(decoded)


class AsyncThrottling:
    """The async transport's work, shared by httpx and httpx2 (see the modules' classes).

    A subclass sets ``_library`` and also derives from that library's
    ``AsyncBaseTransport``.
    """

    _library: ClassVar[Library]

    def __init__(
        self,
        limiter: Limiter,
        transport: Any = None,
        *,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        module = self._library.module
        if not isinstance(limiter, Limiter):
            raise TypeError(f"limiter must be a throttlekit.Limiter, got {limiter!r}")
        if consumed is not None and not callable(consumed):
            raise TypeError(f"consumed must be callable or None, got {consumed!r}")
        self._budgets = check_budgets(budgets)
        self._consumed = consumed
        if transport is None:
            transport = module.AsyncHTTPTransport()
        elif not isinstance(transport, module.AsyncBaseTransport):
            raise TypeError(
                f"transport must be an {self._library.name}.AsyncBaseTransport, got {transport!r}"
            )
        self._limiter = limiter
        self._transport = transport

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._limiter!r} over {self._transport!r}>"

    @property
    def limiter(self) -> Limiter:
        """The limiter that throttles this transport's requests."""
        return self._limiter

    @property
    def transport(self) -> Any:
        """The wrapped transport that sends the requests."""
        return self._transport

    async def __aenter__(self: _T) -> _T:
        await self._transport.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._transport.__aexit__(exc_type, exc_value, traceback)

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._transport.aclose()

    async def handle_async_request(self, request: Any) -> Any:
        """Wait for a permit, send ``request`` through the inner transport, record how it went.

        The returned response's stream gives the permit back when it is closed.
        """
        settings = options()
        extensions = request.extensions
        priority = extensions.get("throttling_priority", settings.priority)
        scopes = None if "throttling_scopes" in extensions else settings.scopes
        held = await HeldPermit.acquire(self._limiter, request, priority=priority, scopes=scopes)
        try:
            permit = held.permit
            sent = anyio.current_time()
            try:
                response = await self._transport.handle_async_request(request)
            except Exception as exc:
                permit.record(
                    exception=exc,
                    latency=anyio.current_time() - sent,
                    adjust_delay=settings.adjust_delay,
                )
                raise
            latency = anyio.current_time() - sent
            consumed, body = await read_for_feedback(
                response,
                response.status_code,
                lambda limit: self._library.read_body(response, limit),
                self._consumed,
                permit,
            )
            permit.record(
                response,
                latency=latency,
                size=content_length(response.headers),
                adjust_delay=settings.adjust_delay,
                consumed=consumed,
                budgets=self._budgets,
                body=body,
            )
            stream = response.stream
            if not isinstance(stream, self._library.module.AsyncByteStream):
                raise TypeError(
                    f"the inner transport returned a response without an async stream: {stream!r}"
                )
            response.stream = self._library.releasing_stream(stream, held)
        except BaseException:
            await held.release()
            raise
        return response


def make_client(
    cls: type[AsyncThrottling],
    limiter: Limiter | None,
    budgets: Mapping[str, str] | None,
    consumed: ConsumedHook | None,
    kwargs: dict[str, Any],
) -> Any:
    """An ``AsyncClient`` of ``cls``'s library sending through a new ``cls`` transport."""
    module = cls._library.module
    _check_no_transport("client", cls, "AsyncClient", kwargs)
    inner = module.AsyncHTTPTransport(**_transport_options(kwargs))
    limiter = Limiter() if limiter is None else limiter
    transport = cls(limiter, inner, budgets=budgets, consumed=consumed)
    return module.AsyncClient(transport=transport, **kwargs)


def _check_no_transport(
    builder: str,
    cls: type[AsyncThrottling] | type[SyncThrottling],
    client: str,
    kwargs: dict[str, Any],
) -> None:
    """A client builder makes its own transport: say how to pass one's own instead."""
    if "transport" in kwargs:
        raise TypeError(
            f"{builder}() builds its own transport; pass "
            f"{cls.__name__}(limiter, your_transport) to {cls._library.name}.{client} instead"
        )


def _transport_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the inner transport's options out of a client's ``kwargs`` (``trust_env`` stays too)."""
    options = {name: kwargs.pop(name) for name in TRANSPORT_OPTIONS if name in kwargs}
    if "trust_env" in options:
        kwargs["trust_env"] = options["trust_env"]
    return options


# -- the synchronous client ------------------------------------------------------------


class _SyncReleasingStream:
    """A response body that gives its permit back when it is closed; records a failure.

    :class:`Library` makes it a subclass of its module's ``SyncByteStream``.
    """

    __slots__ = ("_held", "_stream")

    def __init__(self, stream: Any, held: SyncHeldPermit) -> None:
        self._stream = stream
        self._held = held

    def __repr__(self) -> str:
        return f"<_SyncReleasingStream {self._held!r}>"

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except Exception as exc:
            self._held.body_failed(exc)
            raise

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._held.release()


class SyncThrottling:
    """The sync transport's work, shared by httpx and httpx2 (see the modules' classes).

    A subclass sets ``_library`` and also derives from that library's
    ``BaseTransport``.
    """

    _library: ClassVar[Library]

    def __init__(
        self,
        limiter: SyncLimiter,
        transport: Any = None,
        *,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        module = self._library.module
        if not isinstance(limiter, SyncLimiter):
            raise TypeError(
                f"limiter must be a throttlekit.SyncLimiter ({self._library.name}.Client is "
                f"synchronous), got {limiter!r}"
            )
        if consumed is not None and not callable(consumed):
            raise TypeError(f"consumed must be callable or None, got {consumed!r}")
        if transport is None:
            transport = module.HTTPTransport()
        elif not isinstance(transport, module.BaseTransport):
            raise TypeError(
                f"transport must be an {self._library.name}.BaseTransport, got {transport!r}"
            )
        self._limiter = limiter
        self._transport = transport
        self._budgets = check_budgets(budgets)
        self._consumed = consumed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._limiter!r} over {self._transport!r}>"

    @property
    def limiter(self) -> SyncLimiter:
        """The limiter that throttles this transport's requests."""
        return self._limiter

    @property
    def transport(self) -> Any:
        """The wrapped transport that sends the requests."""
        return self._transport

    def __enter__(self: _S) -> _S:
        self._transport.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._transport.__exit__(exc_type, exc_value, traceback)

    def close(self) -> None:
        """Close the inner transport."""
        self._transport.close()

    def handle_request(self, request: Any) -> Any:
        """Wait for a permit, send ``request`` through the inner transport, record how it went.

        The returned response's stream gives the permit back when it is closed.
        """
        module = self._library.module
        held = SyncHeldPermit.acquire(self._limiter, request)
        try:
            try:
                response = self._transport.handle_request(request)
            except Exception as exc:
                held.failed(exc)
                raise
            latency = time.monotonic() - held.sent
            consumed = None
            if self._consumed is not None:
                body = None
                if is_json(response.headers) and not body_too_large(response.headers):
                    try:
                        raw = _read_sync_body(self._library, response)
                    except Exception as exc:
                        held.body_failed(exc)
                        raise
                    body = None if raw is None else json_body(raw)
                consumed = self._consumed(response, body)
            held.answered(
                response,
                status=response.status_code,
                headers=response.headers,
                latency=latency,
                consumed=consumed,
                budgets=self._budgets,
            )
            stream = response.stream
            if not isinstance(stream, module.SyncByteStream):
                raise TypeError(
                    f"the inner transport returned a response without a sync stream: {stream!r}"
                )
            response.stream = self._library.sync_releasing_stream(stream, held)
        except BaseException:
            held.release()
            raise
        return response


def make_sync_client(
    cls: type[SyncThrottling],
    limiter: SyncLimiter | None,
    budgets: Mapping[str, str] | None,
    consumed: ConsumedHook | None,
    kwargs: dict[str, Any],
) -> Any:
    """A ``Client`` of ``cls``'s library sending through a new ``cls`` transport."""
    module = cls._library.module
    _check_no_transport("sync_client", cls, "Client", kwargs)
    inner = module.HTTPTransport(**_transport_options(kwargs))
    limiter = SyncLimiter() if limiter is None else limiter
    transport = cls(limiter, inner, budgets=budgets, consumed=consumed)
    return module.Client(transport=transport, **kwargs)
