"""What the Redis backend's scripts are called with: the scripts, the scopes' keys, their arguments.

Shared by the acquire side (:mod:`._redis_calls`) and the release side
(:mod:`._redis_releases`): the :class:`~._redis_link.Script` objects, the
arguments encoded once (:func:`~._redis_link.bulk`) and kept, and
:class:`CallArgs`, the per-backend caches of each scope's keys and each
policy's arguments.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from . import _redis_scripts as scripts
from ._redis_line import RELEASE_RECHECK
from ._redis_link import Script, bulk, bulk_of
from ._redis_state import PolicyArgs

if TYPE_CHECKING:
    from .._policy import ScopePolicy
    from ._redis_leases import RedisLease

__all__ = [
    "ACQUIRE",
    "AS_DECLARED",
    "INF",
    "NOT_WANTED",
    "NO_POLICY",
    "NO_WRITE",
    "ONE",
    "PLAIN_RELEASE",
    "RELEASE",
    "RENEW",
    "STATE",
    "SUFFIXES",
    "SYNC",
    "UNUSED",
    "USED",
    "USED_EARLY",
    "WANTED",
    "WRITE_TRIES",
    "ZERO",
    "CallArgs",
    "ms",
]

INF: Final = math.inf
#: The keys of a scope, by suffix: leases, state, slots, quota log, quota costs, waiters.
SUFFIXES: Final = ("L", "S", "T", "Q", "C", "W")
#: Tries of a version-checked write before the feedback is kept for the next (a busy scope).
WRITE_TRIES: Final = 8

ZERO: Final = b"0"
ONE: Final = bulk(b"1.0")
USED: Final = bulk(b"1")
#: Sent, and its feedback announces no limit: the slot may be freed before the write stands.
USED_EARLY: Final = bulk(b"2")
UNUSED: Final = bulk(b"0")
NOT_WANTED: Final = bulk(b"0")
WANTED: Final = bulk(b"1")
AS_DECLARED: Final = bulk(b"-1")
NO_WRITE: Final = bulk(b"") * 4
NO_POLICY: Final = bulk(b"")

ACQUIRE = Script(scripts.ACQUIRE)
SYNC = Script(scripts.SYNC)
RELEASE = Script(scripts.RELEASE)
PLAIN_RELEASE = Script(scripts.PLAIN_RELEASE)
RENEW = Script(scripts.RENEW)
STATE = Script(scripts.STATE)

#: Policies and scopes whose arguments are kept at most (then cleared).
_CACHED: Final = 4096


def ms(seconds: float) -> bytes:
    """Seconds as the milliseconds the scripts read."""
    return repr(seconds * 1000.0).encode()


class CallArgs:
    """The arguments of one backend's script calls that are encoded once and kept.

    ``colocate`` maps a scope to the group whose hash tag its keys carry
    (None: the scope's own), so that a Redis Cluster keeps a group's scopes
    in one slot.
    """

    __slots__ = (
        "_keys",
        "_policies",
        "_reserve_ahead",
        "_settings_parts",
        "channel",
        "channel_arg",
        "colocate",
        "prefix",
        "release_base",
        "settings",
        "token",
        "ttl",
    )

    def __init__(
        self,
        *,
        prefix: str,
        colocate: Callable[[str], str] | None,
        lease_time: float,
        reserve_ahead: float,
        state_ttl: float,
    ) -> None:
        self.prefix = prefix
        self.colocate = colocate
        #: The release channel (pub/sub).
        self.channel = f"{prefix}:released".encode()
        self.channel_arg = bulk(self.channel)
        #: This backend's place in the lines of processes that wait for a
        #: full scope (a release wakes the first two in line).
        self.token = secrets.token_hex(8)
        #: The acquire's five settings.
        self._settings_parts = [
            *(bulk(ms(value)) for value in (lease_time, reserve_ahead, state_ttl, RELEASE_RECHECK)),
            bulk(self.token.encode()),
        ]
        self.settings = b"".join(self._settings_parts)
        self._reserve_ahead = reserve_ahead
        self.ttl = ms(state_ttl)
        #: The release's arguments before the scopes' (after its clock, lease id, send time).
        self.release_base = self.channel_arg + bulk(self.ttl)
        self._policies: dict[int, PolicyArgs] = {}
        #: Per scope: its keys, them encoded, its name encoded.
        self._keys: dict[str, tuple[list[bytes], bytes, bytes]] = {}

    def __repr__(self) -> str:
        return f"<CallArgs {self.prefix!r} scopes={len(self._keys)}>"

    def settings_within(self, seconds: float) -> bytes:
        """The acquire's settings for a caller who can wait ``seconds`` more at most.

        A grant is then reserved no further ahead than that: its send must
        come before the caller's timeout.
        """
        if seconds >= self._reserve_ahead:
            return self.settings
        parts = list(self._settings_parts)
        parts[1] = bulk(ms(max(0.0, seconds)))
        return b"".join(parts)

    def policy(self, policy: ScopePolicy) -> PolicyArgs:
        """``policy`` as the scripts read it (cached per policy object)."""
        cached = self._policies.get(id(policy))
        if cached is not None and cached.policy is policy:
            return cached
        if len(self._policies) > _CACHED:
            self._policies.clear()
        args = self._policies[id(policy)] = PolicyArgs.of(policy)
        return args

    def scope(self, scope: str) -> tuple[list[bytes], bytes, bytes]:
        """The keys of ``scope``, them and its name encoded for a command (cached)."""
        cached = self._keys.get(scope)
        if cached is None:
            if len(self._keys) > _CACHED:
                self._keys.clear()
            if self.colocate is None:
                tag = ("{" + self.prefix + ":" + scope + "}:").encode()
            else:
                group = self.colocate(scope)
                if not isinstance(group, str):
                    raise TypeError(f"colocate({scope!r}) must return a str, got {group!r}")
                tag = ("{" + self.prefix + ":" + group + "}:" + scope + ":").encode()
            keys = [tag + suffix.encode() for suffix in SUFFIXES]
            encoded = b"".join(map(bulk, keys))
            cached = self._keys[scope] = (keys, encoded, bulk(scope.encode()))
        return cached

    # -- releases ----------------------------------------------------------------------

    def release(self, lease: RedisLease, clock: bytes, used: bytes, scopes: list[bytes]) -> bytes:
        """The :data:`RELEASE` of ``lease``: ``used`` (:data:`USED`, :data:`USED_EARLY`
        or :data:`UNUSED`), and per scope :meth:`release_scope` and its write."""
        head = [lease.encoded_keys, bulk(clock), bulk(lease.id), bulk_of(lease.send_at_ms)]
        # (number of keys, keys, clock, lease id, send time, used, channel, ttl, 8 per scope)
        count = 1 + len(lease.keys) + 6 + 8 * len(lease.scopes)
        return RELEASE.frame(count, [*head, used, self.release_base, *scopes])

    def release_scope(
        self,
        scope: str,
        policy_args: PolicyArgs,
        want: bytes,
        consumed: Mapping[str, float] | None,
    ) -> bytes:
        """A scope's arguments of a release but the controllers' write."""
        amount = AS_DECLARED
        if consumed is not None and scope in consumed:
            amount = bulk_of(max(0.0, float(consumed[scope])))
        policy = policy_args.encoded
        if want is NOT_WANTED and not policy_args.booked:
            policy = NO_POLICY  # (the script has nothing to read it for)
        return self.scope(scope)[2] + amount + want + policy

    def unwanted_release(
        self, lease: RedisLease, clock: bytes, used: bytes, consumed: Mapping[str, float] | None
    ) -> bytes:
        """The :data:`RELEASE` of ``lease`` without feedback."""
        scopes = [
            self.release_scope(scope, policy_args, NOT_WANTED, consumed) + NO_WRITE
            for scope, policy_args in zip(lease.scopes, lease.policies, strict=True)
        ]
        return self.release(lease, clock, used, scopes)

    def plain_release(self, lease: RedisLease, clock: bytes) -> bytes | None:
        """The :data:`PLAIN_RELEASE` of a sent ``lease`` without feedback, if it applies.

        It does when no scope has a slot delay or quota (whose books a release
        keeps); ``None`` otherwise.
        """
        names = []
        for scope, policy_args in zip(lease.scopes, lease.policies, strict=True):
            if policy_args.booked:
                return None
            names.append(self.scope(scope)[2])
        # (number of keys, keys, clock, lease id, channel, a name per scope)
        count = 1 + len(lease.keys) + 3 + len(names)
        head = [lease.encoded_keys, bulk(clock), bulk(lease.id), self.channel_arg]
        return PLAIN_RELEASE.frame(count, [*head, *names])
