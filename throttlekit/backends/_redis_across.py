"""A request whose scopes live in several slots of a Redis Cluster: reserve, then send.

One Lua call is atomic only over the keys of one slot, so such a request is
asked of each slot in turn (in the order of the slots), every part granted
at one exact send time ``T``: the first part at ``T = now + margin`` on its
node's clock (``margin`` covers the calls still to come), the next parts at
that ``T`` or not at all. The request is sent at ``T``, and every scope
records ``T`` as its send, as one atomic grant would.

When a part refuses (a scope is full, not due yet, or ``T`` has passed on
its node), the parts granted so far are handed back unsent: their quota is
refunded, their lease slots freed, and the pacing they moved (next and last
send) restored when no send came since (the scripts keep what a part
changed). The request then waits as any refused request does, holding
nothing. So no scope ever admits more than its policy (each part is checked
atomically on the node that holds its scopes), and no two requests wait for
each other (a request never waits while holding a part).

It costs one round trip per slot, and the send waits ``margin``; a request
whose scopes share a slot (``colocate``) stays one atomic call.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import anyio

from ._redis_leases import RedisLease

if TYPE_CHECKING:
    from .._policy import ScopePolicy
    from .._scheduler import Ticket
    from ._redis_calls import Closed, ScriptCalls

__all__ = ["AcrossSlots"]

INF: Final = math.inf
#: The least margin (ms) between the first part's call and the send time.
_MIN_MARGIN_MS: Final = 2.0
#: The margin in round trips per later part; doubled (up to :data:`_MOST_SLACK`)
#: each time a part finds the send time passed, halved back on each grant.
_SLACK: Final = 3.0
_MOST_SLACK: Final = 48.0


class AcrossSlots:
    """Grants of requests across the slots of a cluster, one part per slot, on ``calls``."""

    __slots__ = ("_calls", "_slack")

    def __init__(self, calls: ScriptCalls) -> None:
        self._calls = calls
        self._slack = _SLACK

    def __repr__(self) -> str:
        return f"<AcrossSlots slack={self._slack:g}>"

    def margin_ms(self, parts: int) -> float:
        """How far ahead of the first part's call the send time is put (ms)."""
        calls = self._calls
        if calls.clock is not None:  # (virtual time: every part sees the same instant)
            return 0.0
        return max(_MIN_MARGIN_MS, self._slack * (parts - 1) * calls.round_trip * 1000.0)

    async def attempt(
        self,
        costs: dict[str, float],
        policies: list[ScopePolicy],
        extra: list[int] | None,
        gate: Ticket,
        turn: Any,
        deadline: float,
        lease_id: bytes,
        groups: list[list[int]],
    ) -> RedisLease | tuple[int, float, bool, Any, Closed | None]:
        """Ask every part in turn (see :meth:`ScriptCalls.attempt`; ``groups``: indices by slot)."""
        calls = self._calls
        names = list(costs)
        parts: list[RedisLease] = []
        at = b"+%r" % self.margin_ms(len(groups))
        try:
            for indices in groups:
                result = await calls.ask(
                    lease_id,
                    {names[i]: costs[names[i]] for i in indices},
                    [policies[i] for i in indices],
                    None if extra is None else [extra[i] for i in indices],
                    gate,
                    turn,
                    deadline,
                    at,
                )
                if not isinstance(result, RedisLease):
                    await self._hand_back(parts)
                    index, wait, full, turn, closed = result
                    if wait == 0.0 and not full and parts:  # (the send time had passed)
                        self._slack = min(_MOST_SLACK, self._slack * 2.0)
                    return indices[index], wait, full, turn, closed
                parts.append(result)
                at = repr(result.send_at_ms).encode()
        except BaseException:
            await self._hand_back(parts)
            raise
        self._slack = max(_SLACK, self._slack / 2.0)
        lease = RedisLease.across(lease_id, costs, parts, gate)
        if any(part.due is not None for part in parts):
            await calls.run_due(lease, deadline)
        return lease

    async def _hand_back(self, parts: list[RedisLease]) -> None:
        """Give back the parts granted so far, unsent (or leave them to the orphans)."""
        calls = self._calls
        with anyio.CancelScope(shield=True):
            while parts:
                part = parts.pop()
                if not await calls.releases.release(part, None, None, used=False, quiet=True):
                    calls.orphans.append(part)
