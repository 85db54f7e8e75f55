"""A network (or a busy client) between the limiter and a server model: sends arrive late."""

from __future__ import annotations

import random

import attrs

from .._checks import non_negative
from .._clock import wall_ahead
from ._model import SimRequest, SimResponse
from ._servers import Responder, ServerModel, server_model

__all__ = ["Jittered"]


@attrs.frozen(kw_only=True)
class Jittered:
    """``server`` behind a path that delays each send by up to ``jitter`` seconds, in order.

    A busy client (an event loop late to run the send), a proxy or a
    network moves the instant a request reaches the server by a few or a
    few tens of ms, while the limiter paces the instants it grants. Each
    send here reaches ``server`` a delay drawn evenly from ``[0, jitter]``
    after it left, but never before the send ahead of it (a connection
    keeps order); its answer's latency includes that delay, and a model that
    states its resets on the wall clock reads it as the send arrives.

    A leaky bucket without burst (nginx's ``limit_req``) refuses a request
    sooner than its interval *T* after the last one it accepted, so sends
    paced *T* apart arrive up to ``jitter`` closer and some are refused: no
    client is refusal-free there faster than ``1 / (T + jitter)``.

    :param server: the server model the sends reach.
    :param jitter: the longest delay of a send, in seconds.

    Usage::

        Jittered(server=NginxLimitReq(rate=10, status=429), jitter=0.02)
    """

    server: ServerModel = attrs.field(validator=server_model)
    jitter: float = attrs.field(default=0.01, validator=non_negative)

    def start(self, rng: random.Random) -> Responder:
        respond = self.server.start(random.Random(rng.getrandbits(64)))
        delays = random.Random(rng.getrandbits(64))
        last = -float("inf")  # when the send ahead reached the server

        def arrive(request: SimRequest, now: float) -> SimResponse:
            nonlocal last
            last = max(last, now + delays.uniform(0.0, self.jitter))
            with wall_ahead(last - now):  # (a server reads its clock as the send arrives)
                response = respond(request, last)
            return attrs.evolve(response, latency=response.latency + (last - now))

        return arrive
