"""The uncontended grant of both drivers, in one place: the hot path of every limiter.

Most requests need one scope, cost 1, with room now. :class:`FastLane` grants
those inline (no ticket, no queue) and gives them back the same way; anything
else goes to the scheduler. The async :class:`~throttlekit.Limiter` and the
:class:`~throttlekit.SyncLimiter` both call it: they differ only in how they
wait, and (the sync one) in holding a lock around each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import scopes as _scopes
from ._ledger import UNLISTED, ScopeLedger

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["FastLane"]

_by_host = _scopes.by_host
#: Most URL strings whose scope (host) a lane remembers: more than the
#: default ``max_scopes``, so a round-robin over that many hosts stays cached.
_HOSTS_MAX = 131_072


class FastLane:
    """Grants a request of one existing *plain* scope of cost 1 with room now, inline.

    A request qualifies as ``scopes="name"``, or as a URL string with the
    default resolver (the lane remembers the scope of recent URLs: its host
    name, then, once granted, its ledger). A scope is plain while no
    controller, quota, slot delay or jitter is in force
    (:attr:`ScopeLedger.plain <throttlekit._ledger.ScopeLedger.plain>`); it
    must have room now in its concurrency, its delay and the global cap, with
    nobody waiting for either. :meth:`take` returns ``None`` for anything else,
    and the driver takes the general path.

    It also keeps what the drivers' permits share about nesting: ``holds``,
    the permits held in ``with`` blocks (``None``, the permit held alone, or a
    dict by task or thread), and ``owner``, the event loop that uses the
    async limiter (``None`` before its first grant).
    """

    __slots__ = ("gate", "holds", "hosts", "ledgers", "owner", "resolver")

    def __init__(self, core: Scheduler, resolver: _scopes.Resolver) -> None:
        self.ledgers = core.scopes
        self.gate = core.gate
        self.resolver = resolver
        # The scope of each URL string seen lately (default resolver only):
        # its name, or (once granted) its ledger.
        self.hosts: dict[str, Any] = {}
        self.holds: Any = None
        self.owner: object = None

    def __repr__(self) -> str:
        return f"<FastLane urls={len(self.hosts)} holds={self.holds!r} owner={self.owner!r}>"

    def set_resolver(self, resolver: _scopes.Resolver) -> None:
        """Use ``resolver`` from now on; forget the scopes the old one gave."""
        self.resolver = resolver
        self.hosts.clear()

    def host_of(self, url: str) -> str:
        """``by_host(url)``, remembered (bounded: cleared when full)."""
        host = self.hosts.get(url)
        if type(host) is not str:
            if host is not None:  # the scope's ledger, once granted
                return host.name  # type: ignore[no-any-return]
            host = _by_host(url)
            hosts = self.hosts
            if len(hosts) >= _HOSTS_MAX:
                hosts.clear()
            hosts[url] = host
        return host

    def remember(self, url: str, ledger: ScopeLedger) -> None:
        """After a grant on the general path: the URL's ledger, if the lane resolved it."""
        hosts = self.hosts
        if url in hosts:  # resolved by the default resolver: one scope, cost 1
            hosts[url] = ledger

    def take(self, request: Any, scopes: Any, now: float, owner: object) -> ScopeLedger | None:
        """Grant the request now if it qualifies (see the class); its ledger, else ``None``.

        ``owner`` is the event loop asking (``None`` for the sync driver): a
        grant here needs the lane's owner to be that loop.
        """
        if scopes is None:
            if type(request) is not str:
                return None
            ledger = self.hosts.get(request)
            if ledger is None:
                ledger = self._ledger_of_new_url(request)
        elif type(scopes) is str:
            ledger = self.ledgers.get(scopes)
        else:
            return None
        if type(ledger) is not ScopeLedger or not ledger.plain or ledger.in_line:
            return None
        gate = self.gate
        limit = gate.limit
        concurrency = ledger.concurrency
        if (
            (limit is None or (gate.in_flight < limit and not gate.queue))
            and (concurrency is None or ledger.in_flight < concurrency)
            and ledger.next_send_at <= now
            and self.owner is owner
        ):
            ledger.in_flight += 1
            ledger.factor = 1.0
            delay = ledger.delay
            ledger.next_send_at = now + delay if delay else now
            gate.in_flight += 1
            return ledger
        return None

    def give_back(self, ledger: ScopeLedger) -> bool:
        """Release a grant of :meth:`take` inline, if that frees nothing anybody waits for
        and the scope stays listed among the idle ones; ``False``: the scheduler must."""
        gate = self.gate
        if (
            ledger.plain
            and not ledger.in_line
            and not gate.queue
            # (the listing first: a scope once idle stays listed while used again)
            and (ledger.listed_at is not UNLISTED or ledger.in_flight > 1)
        ):
            ledger.in_flight -= 1
            gate.in_flight -= 1
            return True
        return False

    def _ledger_of_new_url(self, url: str) -> ScopeLedger | None:
        """The ledger of the scope of a URL not remembered yet, if that scope exists
        (the default resolver's host); remembered from now on."""
        if self.resolver is not _by_host:
            return None
        ledger = self.ledgers.get(self.host_of(url))
        if ledger is not None:
            self.hosts[url] = ledger
        return ledger
