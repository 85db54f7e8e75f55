"""Adapters that plug a limiter into HTTP clients and crawlers.

Each adapter lives in its own module and imports its framework only when
that module is imported, so ``import throttlekit`` never needs them:

* :mod:`throttlekit.adapters.httpx` -- ``ThrottledTransport`` for
  ``httpx.AsyncClient`` (``pip install "throttlekit-http[httpx]"``);
* :mod:`throttlekit.adapters.httpx2` -- the same for ``httpx2.AsyncClient``,
  which the OpenAI and Anthropic SDKs send through
  (``pip install "throttlekit-http[httpx2]"``);
* :mod:`throttlekit.adapters.aiohttp` -- a client middleware for
  ``aiohttp.ClientSession`` (``pip install "throttlekit-http[aiohttp]"``);
* :mod:`throttlekit.adapters.requests` -- ``ThrottledAdapter`` for
  ``requests.Session``, with a :class:`~throttlekit.SyncLimiter`
  (``pip install "throttlekit-http[requests]"``); the httpx module also has
  ``SyncThrottledTransport`` for ``httpx.Client``;
* :mod:`throttlekit.adapters.scrapy` -- a Scrapy downloader middleware
  (``pip install "throttlekit-http[scrapy]"``).

Adapters use only the public API: they turn a framework's request into a
request-like, hold a :class:`~throttlekit.Permit` while it is in flight and
report its response or exception with :meth:`~throttlekit.Permit.record`.
"""
