"""Authentication of node-agent RPCs.

Every RPC carries one metadata header, :data:`AUTH_HEADER`, whose value is
``"<scheme> <token>"``. The token proves who made the call and binds it to

* the full gRPC method name (``/rlsched.agent.v1.NodeAgent/Preempt``),
* the SHA-256 of the request message serialised deterministically,
* the name of the node whose agent it is for (``a``, the agent's ``--node``),
* a wall-clock timestamp (seconds) and a random nonce,

so a captured token cannot be replayed for another request, another method,
to another node's agent, or after :attr:`Authenticator.max_skew_s` seconds,
and not at all twice within that window: a per-process nonce cache keeps
every nonce until its token's timestamp is more than ``max_skew_s`` old (in
buckets of time, dropped whole once expired), however many there are. What
bounds that cache is a rate per authenticated caller (:attr:`Identity.caller`,
a token bucket: ``caller_burst`` at once, then ``caller_rate_per_s``); a
caller over it gets :class:`RateLimited` (the agent answers
RESOURCE_EXHAUSTED) and its token is not recorded. Only tokens whose signature
verified reach the cache. The agent verifies with ``node=<its own name>``: a token for another
node, or one bound to no node (``a`` empty or missing, e.g. from a client older
than this check), is refused -- except for ``Health`` (``unbound_ok``), which
changes nothing and tells a client the agent's node name.

**Replies** are authenticated the same way (the controller's transport is
plain gRPC, so whatever listens on an agent's port while the agent is down
could otherwise answer in its name). The agent signs every successful reply
(:meth:`Authenticator.sign_reply`) and sends the header value in the *trailing*
metadata :data:`REPLY_AUTH_HEADER`; its payload binds

* the method label ``<full method name>#reply`` (:data:`REPLY_SUFFIX`), so a
  request token never passes as a reply token and vice versa,
* the SHA-256 of the response message serialised deterministically,
* the agent's own node name (never empty),
* ``r``: the SHA-256 of the request's :data:`AUTH_HEADER` value, which names
  the request's method, body, node, time and nonce: a reply captured for one
  call cannot be passed off as the reply to another,
* a timestamp and a nonce (same skew limit and replay cache as requests).

:class:`~nodeagent.client.AgentClient` checks it with
:meth:`Authenticator.verify_reply` and additionally requires the signer to be
an agent (:meth:`Authenticator.is_agent_identity`: root or the SlurmUser, *not*
the extra ``allowed_uids``, who may call Preempt but are not agents). Error
statuses are not signed: a client never takes one as success.

Three schemes:

:class:`MungeAuthenticator`
    The way Slurm itself authenticates: the caller encodes the binding payload
    with ``munge -s PAYLOAD``; the verifier decodes it with ``unmunge``, which
    yields the caller's UID/GID as vouched for by the local ``munged`` (all
    nodes share the MUNGE key). Privileged RPCs additionally require the UID to
    be root, the SlurmUser, or one of the explicitly allowed UIDs; replies
    require root or the SlurmUser.
:class:`SharedKeyAuthenticator`
    HMAC-SHA256 with a key file that must be readable by its owner only
    (mode 0600 or stricter). Anyone who can read the key is trusted as the
    key file's owner UID (for replies too: a reply signed with the key counts
    as the agent's, since only the key's owner or root can read it, as the
    client itself did). On hosts without ``munged`` this *root key* stays
    with the agents and the controller; jobs get per-job keys.
:class:`JobKeyAuthenticator` (scheme :data:`JOB_SCHEME`)
    A job's per-job key, ``derive_job_key(root key, job id, uid)`` =
    HMAC-SHA256 of the job id and uid under the root key, written by the Slurm
    prolog (:func:`write_job_key`, ``rlsched agent-jobkey write``) to a file
    only the job's user can read. Its tokens name the job and uid (``j``,
    ``u``, under the MAC); the agent derives the key again from the root key to
    verify them and gets ``Identity(uid, -1, JOB_SCHEME, job=...)``: that job of
    that user, never privileged. The agent signs its replies to such a request
    with the same job key, which the job checks.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import math
import os
import pwd
import re
import secrets
import stat
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: gRPC metadata key that carries the token (lower case, as gRPC requires).
AUTH_HEADER = "x-rlsched-auth"
#: gRPC *trailing* metadata key that carries the agent's token for its reply.
REPLY_AUTH_HEADER = "x-rlsched-reply-auth"
#: appended to the method name in a reply token's payload (``m``): request and reply tokens never mix.
REPLY_SUFFIX = "#reply"


class AuthError(Exception):
    """A token is missing, malformed, expired, replayed or does not verify.

    ``unauthenticated`` is True when the caller could not be identified at all
    (maps to gRPC UNAUTHENTICATED); False when the caller was identified but is
    not allowed (PERMISSION_DENIED).
    """

    def __init__(self, message: str, *, unauthenticated: bool = True) -> None:
        super().__init__(message)
        self.unauthenticated = unauthenticated


@dataclass(frozen=True)
class Identity:
    """Who made a verified call: numeric UID/GID and the scheme that proved it.

    ``job``: the Slurm job id a per-job key is bound to (:data:`JOB_SCHEME`): the caller is that job of
    user ``uid`` and nothing more (never privileged, never an agent); "" for every other credential.
    """

    uid: int
    gid: int
    scheme: str
    job: str = ""

    @property
    def caller(self) -> str:
        """The key calls are counted under for rate limiting: one per uid, and one per job for job keys."""
        return f"uid {self.uid}" + (f" (slurm job {self.job})" if self.job else "")


def request_digest(request_bytes: bytes) -> str:
    """Hex SHA-256 of a serialised request (``msg.SerializeToString(deterministic=True)``)."""
    return hashlib.sha256(request_bytes).hexdigest()


def _binding_payload(method: str, request_bytes: bytes, ts: float | None = None, nonce: str | None = None,
                     node: str = "", reply_to: str | None = None, extra: dict | None = None) -> bytes:
    """The JSON a token covers. ``reply_to`` (replies only): :func:`reply_binding` of the request answered.
    ``extra``: more fields (a per-job key's ``j`` job id and ``u`` uid)."""
    body = {
        "m": method,
        "h": request_digest(request_bytes),
        "a": node,
        "t": round(time.time() if ts is None else ts, 3),
        "n": nonce or secrets.token_hex(12),
        **(extra or {}),
    }
    if reply_to is not None:
        body["r"] = reply_to
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def reply_binding(request_header: str) -> str:
    """What a reply token binds of its request: hex SHA-256 of the request's :data:`AUTH_HEADER` value
    (which covers the request's method, body, node, timestamp and nonce)."""
    return hashlib.sha256(request_header.encode()).hexdigest()


class RateLimited(AuthError):
    """An authenticated caller over its rate of calls (maps to gRPC RESOURCE_EXHAUSTED): the token was
    valid but is not accepted now, and its nonce is not recorded."""

    def __init__(self, message: str) -> None:
        super().__init__(message, unauthenticated=False)


class _NonceCache:
    """The nonces of accepted tokens, each kept for as long as its token could pass the skew check.

    A token with timestamp ``t`` is accepted while ``|now - t| <= ttl_s``, so its nonce must be
    remembered until ``now > t + ttl_s``, and no longer. Nonces are kept in buckets of ``bucket_s``
    seconds of ``t`` (at most ``2 * ttl_s / bucket_s + 2`` buckets); a bucket is dropped whole once the
    newest ``t`` it may hold is more than ``ttl_s`` old. A nonce is never dropped earlier, however many
    there are: the size is bounded by admitting each caller at most ``burst`` tokens at once and
    ``rate_per_s`` per second after that (a token bucket per caller), so a caller keeps at most
    ``burst + rate_per_s * (2 * ttl_s + bucket_s)`` nonces here. ``max_entries`` caps the total for
    callers that are not ``exempt`` (the privileged ones): past it their tokens are refused
    (:class:`RateLimited`), never by forgetting a live nonce. Thread-safe.
    """

    def __init__(self, ttl_s: float, *, rate_per_s: float = 100.0, burst: int = 500,
                 max_entries: int = 500_000, bucket_s: float | None = None, max_callers: int = 10_000) -> None:
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError(f"max_skew_s must be a finite number > 0, got {ttl_s}")
        if not (rate_per_s > 0):  # inf: no rate limit
            raise ValueError(f"caller rate must be > 0 calls/s, got {rate_per_s}")
        if burst < 1:
            raise ValueError(f"caller burst must be >= 1, got {burst}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.ttl_s = ttl_s
        self.bucket_s = bucket_s if bucket_s is not None else max(1.0, ttl_s / 12)
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_entries = max_entries
        self.max_callers = max_callers
        self._buckets: dict[int, set[str]] = {}
        self._size = 0
        self._swept = -math.inf
        self._callers: dict[str, tuple[float, float]] = {}  # caller -> (tokens left, when counted)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return self._size

    def _sweep(self, now: float) -> None:
        """Drop the buckets whose every token has expired. Lock held."""
        if now - self._swept < self.bucket_s / 4:
            return
        self._swept = now
        for b in [b for b in self._buckets if (b + 1) * self.bucket_s + self.ttl_s < now]:
            self._size -= len(self._buckets.pop(b))

    def _admit(self, caller: str, now: float) -> None:
        """Take one of ``caller``'s tokens or raise RateLimited. Lock held."""
        if math.isinf(self.rate_per_s):
            return
        tokens, then = self._callers.get(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - then) * self.rate_per_s)
        if tokens < 1.0:
            self._callers[caller] = (tokens, now)
            raise RateLimited(
                f"caller {caller} is over its rate of authenticated calls on this agent ({self.burst} at once, "
                f"then {self.rate_per_s:g} per second); retry in {(1.0 - tokens) / self.rate_per_s:.2f}s")
        self._callers[caller] = (tokens - 1.0, now)
        if len(self._callers) > self.max_callers:  # a full bucket is the same as none: forget those
            for c in [c for c, (t, w) in self._callers.items()
                      if t + max(0.0, now - w) * self.rate_per_s >= self.burst]:
                del self._callers[c]

    def check_and_add(self, nonce: str, t: float, now: float, caller: str = "", exempt: bool = False) -> bool:
        """True if ``nonce`` (of a token stamped ``t``, checked to be within the skew of ``now``) is fresh,
        and records it; False if it was seen (a replay). :class:`RateLimited` if ``caller`` is over its
        rate, or the cache is full and the caller is not ``exempt``."""
        b = math.floor(t / self.bucket_s)
        with self._lock:
            self._sweep(now)
            seen = self._buckets.get(b)
            if seen is not None and nonce in seen:
                return False
            if not exempt and self._size >= self.max_entries:
                raise RateLimited(f"this agent holds {self._size} live nonces (limit {self.max_entries}); "
                                  "retry later")
            self._admit(caller, now)
            if seen is None:
                seen = self._buckets[b] = set()
            seen.add(nonce)
            self._size += 1
            return True


class Authenticator(ABC):
    """Signs outgoing RPCs and verifies incoming ones.

    ``sign(method, request_bytes, node=...)`` returns the full header value
    (``"<scheme> <token>"``) for the agent of ``node``;
    ``verify(method, request_bytes, header, node=...)`` returns the caller's
    :class:`Identity` or raises :class:`AuthError`. ``is_privileged(identity)``
    decides who may call Preempt. Replies: the agent signs with
    ``sign_reply(method, request_header, response_bytes, node=<its name>)``,
    the client checks with ``verify_reply(...)`` and ``is_agent_identity``.

    ``allowed_uids``: extra UIDs that may call Preempt. ``agent_uids``: the
    UIDs whose replies are taken as an agent's: root and (munge) the SlurmUser;
    the ``allowed_uids`` are never among them unless also listed here.

    Replay protection (:class:`_NonceCache`): every request nonce is remembered
    until its token's timestamp is more than ``max_skew_s`` old, never fewer.
    What bounds that memory is a rate per caller (:attr:`Identity.caller`):
    ``caller_burst`` requests at once, then ``caller_rate_per_s`` per second
    (``math.inf``: unlimited); a caller over it gets :class:`RateLimited`
    (RESOURCE_EXHAUSTED). ``max_nonces`` caps the nonces of unprivileged
    callers together (privileged callers are limited by their rate only).
    Reply nonces are not rate limited: a client accepts only replies to its own
    requests. ``clock``: wall-clock seconds (default :func:`time.time`).
    """

    scheme: str = ""

    def __init__(self, *, max_skew_s: float = 120.0, allowed_uids: set[int] | None = None,
                 agent_uids: set[int] | None = None, caller_rate_per_s: float = 100.0, caller_burst: int = 500,
                 max_nonces: int = 500_000, clock: Callable[[], float] | None = None) -> None:
        self.max_skew_s = max_skew_s
        self.allowed_uids: set[int] = {0} | set(allowed_uids or ())
        self.agent_uids: set[int] = {0} | set(agent_uids or ())
        self._clock = clock
        self._nonces = _NonceCache(max_skew_s, rate_per_s=caller_rate_per_s, burst=caller_burst,
                                   max_entries=max_nonces)
        self._reply_nonces = _NonceCache(max_skew_s, rate_per_s=math.inf, burst=1, max_entries=1 << 62)

    def now(self) -> float:
        """Wall-clock seconds (the ``clock`` given, else :func:`time.time`)."""
        return self._clock() if self._clock is not None else time.time()

    @abstractmethod
    def _make_token(self, payload: bytes) -> str: ...

    @abstractmethod
    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        """Return (payload, identity) or raise AuthError."""

    def sign(self, method: str, request_bytes: bytes, node: str = "") -> str:
        """Header value for one call to the agent of ``node`` ("" = bound to no node: Health only)."""
        payload = _binding_payload(method, request_bytes, node=node, ts=self.now(), extra=self._claims())
        return f"{self.scheme} {self._make_token(payload)}"

    def _claims(self) -> dict:
        """Fields this signer adds to every token it makes (a per-job key's job id and uid)."""
        return {}

    def verify(self, method: str, request_bytes: bytes, header: str | None, *, node: str | None = None,
               unbound_ok: bool = False) -> Identity:
        """The caller's identity; AuthError unless the token is for this ``method``, body and ``node``.

        ``node``: the verifying agent's node name; the token must name it (``None``: no node check,
        for library use only). ``unbound_ok``: also accept a token bound to no node.
        A reply token (one with ``r``, method ``...#reply``) is never a request token.
        """
        return self._verify(method, request_bytes, header, node=node, unbound_ok=unbound_ok, reply_to=None)

    def sign_reply(self, method: str, request_header: str, response_bytes: bytes, node: str) -> str:
        """Header value (for :data:`REPLY_AUTH_HEADER`, trailing metadata) of the reply of the agent of
        ``node`` to the request that carried ``request_header`` (its :data:`AUTH_HEADER` value) on
        ``method`` (the full method name); ``response_bytes``: the response serialised deterministically."""
        if not node:
            raise AuthError("a reply must be bound to the agent's node name")
        payload = _binding_payload(method + REPLY_SUFFIX, response_bytes, node=node, ts=self.now(),
                                   reply_to=reply_binding(request_header), extra=self._claims())
        return f"{self.scheme} {self._make_token(payload)}"

    def verify_reply(self, method: str, request_header: str, response_bytes: bytes, header: str | None, *,
                     node: str) -> Identity:
        """The signer of a reply; AuthError unless ``header`` (the reply's :data:`REPLY_AUTH_HEADER`) is a
        reply token for ``method``, this response, the agent of ``node`` (non-empty) and the request that
        carried ``request_header``, fresh and not seen before. Whether the signer may speak for an agent is
        :meth:`is_agent_identity`'s to say."""
        if not node:
            raise AuthError("cannot verify a reply without the node name of its agent")
        return self._verify(method + REPLY_SUFFIX, response_bytes, header, node=node, unbound_ok=False,
                            reply_to=reply_binding(request_header))

    def _verify(self, method: str, request_bytes: bytes, header: str | None, *, node: str | None,
                unbound_ok: bool, reply_to: str | None) -> Identity:
        what = AUTH_HEADER if reply_to is None else f"{REPLY_AUTH_HEADER} (trailing)"
        if not header:
            raise AuthError(f"missing {what} metadata")
        scheme, _, token = header.strip().partition(" ")
        if not token:
            raise AuthError(f"expected auth scheme {self.scheme!r} and a token, got {scheme!r}")
        if scheme == self.scheme:
            payload, ident = self._open_token(token.strip())
        else:
            payload, ident = self._open_other(scheme, token.strip())
        try:
            body = json.loads(payload)
            m, h, t, n = body["m"], body["h"], float(body["t"]), str(body["n"])
            a = body.get("a", "")
            r = body.get("r")
            if not math.isfinite(t):  # NaN would pass the skew check below
                raise ValueError(f"timestamp {t} is not finite")
            if not isinstance(a, str):
                raise TypeError(f"node must be a string, not {type(a).__name__}")
            if r is not None and not isinstance(r, str):
                raise TypeError(f"request binding must be a string, not {type(r).__name__}")
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            raise AuthError(f"malformed auth payload: {type(exc).__name__}: {exc}") from None
        if m != method:
            raise AuthError(f"token was issued for {m!r}, not {method!r}")
        if reply_to is None:
            if r is not None or str(m).endswith(REPLY_SUFFIX):
                raise AuthError("a reply token is not a request credential")
        elif r is None:
            raise AuthError("token is not a reply token (it names no request)")
        elif not hmac.compare_digest(r, reply_to):
            raise AuthError("reply token was issued for another request (replayed reply?)")
        if not hmac.compare_digest(str(h), request_digest(request_bytes)):
            raise AuthError("token does not match the " + ("request" if reply_to is None else "response") + " body")
        if node is not None and a != node and not (unbound_ok and a == ""):
            if a == "":
                raise AuthError(f"token is not bound to a node (this is node {node!r}; client too old?)")
            raise AuthError(f"token was issued for node {a!r}, not {node!r}")
        now = self.now()
        if abs(now - t) > self.max_skew_s:
            raise AuthError(f"token timestamp is {now - t:+.0f}s off (limit {self.max_skew_s:.0f}s)")
        if reply_to is not None:
            fresh = self._reply_nonces.check_and_add(n, t, now, exempt=True)
        else:
            fresh = self._nonces.check_and_add(n, t, now, ident.caller, exempt=self.is_privileged(ident))
        if not fresh:
            raise AuthError("replayed token")
        return ident

    def _open_other(self, scheme: str, token: str) -> tuple[bytes, Identity]:
        """(payload, identity) of a token of another scheme than :attr:`scheme` (none is accepted here)."""
        raise AuthError(f"expected auth scheme {self.scheme!r}, got {scheme!r}")

    def live_nonces(self) -> int:
        """Request nonces remembered now (each until its token expires)."""
        return len(self._nonces)

    def is_privileged(self, ident: Identity) -> bool:
        """May call Preempt (and report on any job): root, the SlurmUser (munge) or an ``allowed_uids`` uid;
        never a per-job key."""
        return not ident.job and ident.uid in self.allowed_uids

    def is_agent_identity(self, ident: Identity) -> bool:
        """May sign an agent's replies: root or the SlurmUser (munge), never a mere ``allowed_uids`` caller
        nor a per-job key."""
        return not ident.job and ident.uid in self.agent_uids

    def describe(self) -> str:
        return self.scheme


# ---------------------------------------------------------------- shared key

#: Scheme of tokens made with a per-job key (:func:`derive_job_key`, :class:`JobKeyAuthenticator`).
JOB_SCHEME = "hmac-sha256-job"
#: Largest uid: uid_t is 32 bits and (uid_t)-1 = 2**32 - 1 means "no uid".
MAX_UID = 2**32 - 2
_JOB_ID_RE = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?")


def _check_job(job_id: object, uid: object) -> tuple[str, int]:
    """(job_id, uid) if they can name a per-job key, else AuthError (one line)."""
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise AuthError(f"bad slurm job id {job_id!r} for a per-job key (need digits, e.g. 1234 or 1234_5)")
    if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid <= MAX_UID:
        raise AuthError(f"bad uid {uid!r} for a per-job key (need an integer in 0..{MAX_UID})")
    return job_id, uid


def derive_job_key(root_key: bytes, job_id: str, uid: int) -> bytes:
    """The key of Slurm job ``job_id`` of user ``uid``: hex HMAC-SHA256(root key, ``rlsched-job-key\\0<job>\\0<uid>``).

    Whoever holds it can authenticate as that job of that user only (:data:`JOB_SCHEME`); the agent,
    holding the root key, derives it again to verify. Nothing about another job follows from it.
    """
    job_id, uid = _check_job(job_id, uid)
    return hmac.new(root_key, f"rlsched-job-key\0{job_id}\0{uid}".encode(), hashlib.sha256).hexdigest().encode()


def _hmac_token(key: bytes, payload: bytes) -> str:
    return base64.urlsafe_b64encode(payload).decode() + "." + hmac.new(key, payload, hashlib.sha256).hexdigest()


def _token_payload(token: str) -> tuple[bytes, str]:
    """(payload, mac) of an HMAC token, not yet verified."""
    b64, _, mac = token.partition(".")
    try:
        return base64.urlsafe_b64decode(b64.encode()), mac
    except (ValueError, TypeError):
        raise AuthError("malformed hmac token") from None


def _check_mac(key: bytes, payload: bytes, mac: str) -> None:
    if not hmac.compare_digest(hmac.new(key, payload, hashlib.sha256).hexdigest(), mac):
        raise AuthError("bad hmac credential")


def _job_claims(payload: bytes) -> tuple[str, int]:
    """The (job id, uid) a per-job token claims (``j``, ``u``), read before its MAC can be checked."""
    try:
        body = json.loads(payload)
        claims = (body["j"], body["u"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise AuthError(f"malformed per-job token: {type(exc).__name__}: {exc}") from None
    return _check_job(*claims)


def _read_key_file(path: Path, what: str) -> tuple[bytes, os.stat_result]:
    """The stripped bytes of a key file, which must be a regular file no group/other may access."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise AuthError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise AuthError(f"{what} file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise AuthError(f"{what} {path} is not a regular file")
    if st.st_mode & 0o077:
        raise AuthError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}; must not be accessible "
                        "by group/others (chmod 600)")
    try:
        return path.read_bytes().strip(), st
    except OSError as exc:
        raise AuthError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


class SharedKeyAuthenticator(Authenticator):
    """HMAC-SHA256 over the binding payload with a secret key file (the *root key*).

    The key file must be a regular file not readable/writable by group or
    others (``chmod 600``) and hold at least 16 bytes. The verified identity is
    the key file owner's UID (root for the intended deployment), so only holders
    of a root-owned key can preempt: the controller and the agents, never jobs.

    It also verifies tokens of per-job keys (:data:`JOB_SCHEME`): a token
    claiming job ``j`` of uid ``u`` verifies only with
    ``derive_job_key(root key, j, u)``, which the Slurm prolog gave that job
    alone (:func:`write_job_key`); its identity is ``Identity(u, -1,
    JOB_SCHEME, job=j)``, never privileged. The agent signs its replies to such
    a request with the same job key (the job cannot verify the root key's).
    """

    scheme = "hmac-sha256"

    def __init__(self, key_path: str | os.PathLike[str], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.key_path = Path(key_path)
        key, st = _read_key_file(self.key_path, "shared key")
        if len(key) < 16:
            raise AuthError(f"shared key {self.key_path} is too short ({len(key)} bytes, need >= 16)")
        self._key = key
        self._owner = Identity(uid=st.st_uid, gid=st.st_gid, scheme=self.scheme)
        # replies signed with this key come from its owner or root (mode 0600), and this process read the
        # key itself: its owner is trusted as the agent, as root is (a non-root test or one-user set-up)
        self.agent_uids.add(st.st_uid)

    @staticmethod
    def generate(path: str | os.PathLike[str]) -> Path:
        """Create a new random key file with mode 0600 (fails if it exists)."""
        p = Path(path)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        return p

    def job_key(self, job_id: str, uid: int) -> bytes:
        """:func:`derive_job_key` with this root key."""
        return derive_job_key(self._key, job_id, uid)

    def _make_token(self, payload: bytes) -> str:
        return _hmac_token(self._key, payload)

    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        payload, mac = _token_payload(token)
        _check_mac(self._key, payload, mac)
        return payload, self._owner

    def _open_job_token(self, token: str) -> tuple[bytes, Identity]:
        payload, mac = _token_payload(token)
        job, uid = _job_claims(payload)
        _check_mac(self.job_key(job, uid), payload, mac)
        return payload, Identity(uid=uid, gid=-1, scheme=JOB_SCHEME, job=job)

    def _open_other(self, scheme: str, token: str) -> tuple[bytes, Identity]:
        if scheme != JOB_SCHEME:
            return super()._open_other(scheme, token)
        return self._open_job_token(token)

    def sign_reply(self, method: str, request_header: str, response_bytes: bytes, node: str) -> str:
        """As :meth:`Authenticator.sign_reply`; a reply to a per-job key's request is signed with that key."""
        scheme, _, token = (request_header or "").strip().partition(" ")
        if scheme != JOB_SCHEME:
            return super().sign_reply(method, request_header, response_bytes, node)
        if not node:
            raise AuthError("a reply must be bound to the agent's node name")
        _, ident = self._open_job_token(token.strip())  # the handler verified it; its MAC is checked again
        payload = _binding_payload(method + REPLY_SUFFIX, response_bytes, node=node, ts=self.now(),
                                   reply_to=reply_binding(request_header), extra={"j": ident.job, "u": ident.uid})
        return f"{JOB_SCHEME} {_hmac_token(self.job_key(ident.job, ident.uid), payload)}"

    def describe(self) -> str:
        return f"sharedkey:{self.key_path}"


class JobKeyAuthenticator(Authenticator):
    """A job's side of a per-job key (:data:`JOB_SCHEME`): signs as Slurm job ``job_id`` of ``uid``.

    ``key_path``: the job's key file as :func:`write_job_key` writes it, JSON ``{"job", "uid", "key"}``,
    mode 0400 or 0600, owned by the job's user. Every token it makes names the job and uid (``j``,
    ``u``, covered by the MAC); the agent derives the same key from its root key to verify it. A reply
    counts as the agent's (:meth:`is_agent_identity`) when it verifies with this key and names this
    job: only the agent (from the root key) and this job hold the key.
    """

    scheme = JOB_SCHEME

    def __init__(self, key_path: str | os.PathLike[str], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.key_path = Path(key_path)
        raw, _ = _read_key_file(self.key_path, "per-job key")
        try:
            meta = json.loads(raw)
            job, uid, key = meta["job"], meta["uid"], meta["key"]
        except (ValueError, KeyError, TypeError) as exc:
            raise AuthError(f"per-job key {self.key_path} is not a job key file ({type(exc).__name__}: {exc}); "
                            "write it with: rlsched agent-jobkey write") from None
        self.job_id, self.uid = _check_job(job, uid)
        if not isinstance(key, str) or len(key) < 32:
            raise AuthError(f"per-job key {self.key_path} holds no usable key")
        self._key = key.encode()

    def _claims(self) -> dict:
        return {"j": self.job_id, "u": self.uid}

    def _make_token(self, payload: bytes) -> str:
        return _hmac_token(self._key, payload)

    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        payload, mac = _token_payload(token)
        _check_mac(self._key, payload, mac)
        job, uid = _job_claims(payload)
        if (job, uid) != (self.job_id, self.uid):
            raise AuthError(f"token names slurm job {job} of uid {uid}, not this job's key")
        return payload, Identity(uid=uid, gid=-1, scheme=JOB_SCHEME, job=job)

    def is_agent_identity(self, ident: Identity) -> bool:
        """A reply made with this job's key (by the agent, which derives it): see the class doc."""
        return ident.scheme == JOB_SCHEME and (ident.job, ident.uid) == (self.job_id, self.uid)

    def describe(self) -> str:
        return f"jobkey:{self.key_path}"


def job_key_path(directory: str | os.PathLike[str], job_id: str) -> Path:
    """Where :func:`write_job_key` puts the key of ``job_id`` in ``directory``: ``<directory>/<job_id>.key``."""
    _check_job(job_id, 0)
    return Path(directory) / f"{job_id}.key"


def write_job_key(root_key_path: str | os.PathLike[str], directory: str | os.PathLike[str], job_id: str,
                  uid: int, gid: int | None = None) -> Path:
    """Write Slurm job ``job_id``'s key (of user ``uid``) to ``<directory>/<job_id>.key``, mode 0400,
    owned by ``uid`` (and ``gid``): readable by the job's user (and root) only. Run by the Slurm
    prolog as root (``rlsched agent-jobkey write``). ``directory`` is created (0755) if missing and
    must be a directory no group/other may write (else AuthError: another user could swap the file).
    Atomic: the file appears complete or not at all. Returns its path."""
    job_id, uid = _check_job(job_id, uid)
    root = SharedKeyAuthenticator(root_key_path)
    d = Path(directory)
    try:
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError as exc:
        raise AuthError(f"per-job key directory {d}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise AuthError(f"per-job key directory {d} is not a directory")
    if st.st_mode & 0o022 or st.st_uid != os.geteuid():
        raise AuthError(f"per-job key directory {d} must belong to uid {os.geteuid()} and not be writable by "
                        f"group/others (it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    body = json.dumps({"job": job_id, "uid": uid, "key": root.job_key(job_id, uid).decode()}).encode()
    final = job_key_path(d, job_id)
    tmp = d / f".{final.name}.tmp-{secrets.token_hex(8)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        try:
            os.write(fd, body + b"\n")
            os.fsync(fd)
            if (uid, gid) != (os.geteuid(), None):
                os.fchown(fd, uid, -1 if gid is None else gid)
            os.fchmod(fd, 0o400)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise AuthError(f"cannot write the key of slurm job {job_id} to {final}: {exc.strerror or exc}") from None
    return final


def remove_job_key(directory: str | os.PathLike[str], job_id: str) -> bool:
    """Remove ``job_id``'s key from ``directory`` (the Slurm epilog); False if there was none."""
    try:
        job_key_path(directory, job_id).unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise AuthError(f"cannot remove the key of slurm job {job_id} in {directory}: {exc.strerror or exc}") from None
    return True


# --------------------------------------------------------------------- munge

_UID_RE = re.compile(r"^UID:\s*\S*?\s*\(?(\d+)\)?\s*$", re.M)
_GID_RE = re.compile(r"^GID:\s*\S*?\s*\(?(\d+)\)?\s*$", re.M)
_STATUS_RE = re.compile(r"^STATUS:\s*(.*)$", re.M)
#: munge_err_t values (munge.h) worth naming in error messages.
_MUNGE_ERRORS = {
    8: "bad credential", 11: "bad MAC", 13: "bad realm", 14: "invalid credential", 15: "expired credential",
    16: "rewound credential (clock skew)", 17: "replayed credential", 18: "unauthorized credential",
}


def slurm_user_uid(slurm_conf: str | os.PathLike[str] = "/etc/slurm/slurm.conf") -> int | None:
    """UID of ``SlurmUser=`` in slurm.conf (None if unreadable/unset/unknown user)."""
    try:
        text = Path(slurm_conf).read_text()
    except OSError:
        return None
    m = re.search(r"^\s*SlurmUser\s*=\s*(\S+)", text, re.M | re.I)
    if not m:
        return None
    try:
        return pwd.getpwnam(m.group(1)).pw_uid
    except KeyError:
        return None


class MungeAuthenticator(Authenticator):
    """MUNGE credentials, as used by Slurm itself.

    Signing runs ``munge [-S socket] -s PAYLOAD`` (the credential carries the
    calling process's UID/GID, certified by munged). Verification runs
    ``unmunge [-S socket] -N`` and parses STATUS/UID/GID and the payload.
    munged itself also rejects a credential decoded twice (replay) and
    expired ones (TTL, default 300 s).
    """

    scheme = "munge"

    def __init__(
        self,
        socket: str | None = None,
        *,
        slurm_conf: str | os.PathLike[str] | None = None,
        munge_bin: str = "munge",
        unmunge_bin: str = "unmunge",
        timeout_s: float = 10.0,
        **kw: object,
    ) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.socket = socket
        self.munge_bin = munge_bin
        self.unmunge_bin = unmunge_bin
        self.timeout_s = timeout_s
        # None: $SLURM_CONF (set in jobs, which verify their agent's replies too) or the default path
        su = slurm_user_uid(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
        if su is not None:
            self.allowed_uids.add(su)
            self.agent_uids.add(su)

    def _sock_args(self) -> list[str]:
        return ["-S", self.socket] if self.socket else []

    def _make_token(self, payload: bytes) -> str:
        try:
            r = subprocess.run(
                [self.munge_bin, *self._sock_args(), "-s", payload.decode()],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AuthError(f"cannot run {self.munge_bin}: {exc}") from None
        if r.returncode != 0:
            raise AuthError(f"munge failed (rc={r.returncode}): {r.stderr.strip()}")
        return r.stdout.strip()

    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        if not token.startswith("MUNGE:") or any(c.isspace() for c in token):
            raise AuthError("malformed munge credential")
        try:
            r = subprocess.run(
                [self.unmunge_bin, *self._sock_args(), "-N"],
                input=token.encode(),
                capture_output=True,
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AuthError(f"cannot run {self.unmunge_bin}: {exc}") from None
        out = r.stdout.decode(errors="replace")
        head, sep, payload = out.partition("\n\n")
        status = _STATUS_RE.search(head)
        ok = status is not None and status.group(1).strip() in ("0", "Success (0)")
        if r.returncode != 0 or not sep or not ok:
            code = status.group(1).strip() if status else ""
            why = _MUNGE_ERRORS.get(int(code), f"status {code}") if code.isdigit() else (
                r.stderr.decode(errors="replace").strip() or f"rc={r.returncode}")
            raise AuthError(f"munge credential rejected: {why}")
        uid, gid = _UID_RE.search(head), _GID_RE.search(head)
        if not uid or not gid:
            raise AuthError("unmunge output lacks UID/GID")
        return payload.encode(), Identity(uid=int(uid.group(1)), gid=int(gid.group(1)), scheme=self.scheme)

    def describe(self) -> str:
        return f"munge:{self.socket}" if self.socket else "munge"


def make_authenticator(spec: str, **kw: object) -> Authenticator:
    """Build an authenticator from a CLI/env spec.

    ``munge`` | ``munge:/path/to/socket`` | ``sharedkey:/path/to/key`` (the root key: agents and the
    controller) | ``jobkey:/path`` (a job's per-job key: the file, or the directory holding
    ``<SLURM_JOB_ID>.key``, with ``$SLURM_JOB_ID`` from the environment).
    Raises ValueError for an unknown spec, AuthError for an unusable key.
    """
    spec = spec.strip()
    if spec.startswith("jobkey:"):
        path = Path(spec[len("jobkey:"):])
        if path.is_dir():
            job = os.environ.get("SLURM_JOB_ID", "")
            if not job:
                raise AuthError(f"auth spec {spec!r} names a directory of per-job keys but SLURM_JOB_ID is not set")
            path = job_key_path(path, job)
        return JobKeyAuthenticator(path, **kw)
    if spec == "munge":
        return MungeAuthenticator(**kw)  # type: ignore[arg-type]
    if spec.startswith("munge:"):
        return MungeAuthenticator(socket=spec[len("munge:"):], **kw)  # type: ignore[arg-type]
    if spec.startswith("sharedkey:"):
        return SharedKeyAuthenticator(spec[len("sharedkey:"):], **kw)
    raise ValueError(f"unknown auth spec {spec!r}: expected 'munge', 'munge:SOCKET', 'sharedkey:/path/key' or "
                     "'jobkey:/path'")
