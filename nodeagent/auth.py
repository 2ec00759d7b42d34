"""Authentication of node-agent RPCs.

Every RPC carries one metadata header, :data:`AUTH_HEADER`, whose value is
``"<scheme> <token>"``. The token proves who made the call and binds it to

* the full gRPC method name (``/rlsched.agent.v1.NodeAgent/Preempt``),
* the SHA-256 of the request message serialised deterministically,
* the name of the node whose agent it is for (``a``, the agent's ``--node``),
* a wall-clock timestamp (seconds) and a random nonce,

so a captured token cannot be replayed for another request, another method,
to another node's agent, or after :attr:`Authenticator.max_skew_s` seconds,
and not at all twice within that window (a per-process nonce cache rejects
repeats). The agent verifies with ``node=<its own name>``: a token for another
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

Two schemes:

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
    client itself did); meant for tests and hosts without ``munged``.
"""

from __future__ import annotations

import base64
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
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

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
    """Who made a verified call: numeric UID/GID and the scheme that proved it."""

    uid: int
    gid: int
    scheme: str


def request_digest(request_bytes: bytes) -> str:
    """Hex SHA-256 of a serialised request (``msg.SerializeToString(deterministic=True)``)."""
    return hashlib.sha256(request_bytes).hexdigest()


def _binding_payload(method: str, request_bytes: bytes, ts: float | None = None, nonce: str | None = None,
                     node: str = "", reply_to: str | None = None) -> bytes:
    """The JSON a token covers. ``reply_to`` (replies only): :func:`reply_binding` of the request answered."""
    body = {
        "m": method,
        "h": request_digest(request_bytes),
        "a": node,
        "t": round(time.time() if ts is None else ts, 3),
        "n": nonce or secrets.token_hex(12),
    }
    if reply_to is not None:
        body["r"] = reply_to
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def reply_binding(request_header: str) -> str:
    """What a reply token binds of its request: hex SHA-256 of the request's :data:`AUTH_HEADER` value
    (which covers the request's method, body, node, timestamp and nonce)."""
    return hashlib.sha256(request_header.encode()).hexdigest()


class _NonceCache:
    """Remembers nonces seen within the skew window (bounded, thread-safe)."""

    def __init__(self, ttl_s: float, max_entries: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def check_and_add(self, nonce: str, now: float) -> bool:
        """True if ``nonce`` is fresh (and records it); False if replayed."""
        with self._lock:
            while self._seen:
                k, t = next(iter(self._seen.items()))
                if now - t > 2 * self.ttl_s or len(self._seen) > self.max_entries:
                    self._seen.popitem(last=False)
                else:
                    break
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
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
    """

    scheme: str = ""

    def __init__(self, *, max_skew_s: float = 120.0, allowed_uids: set[int] | None = None,
                 agent_uids: set[int] | None = None) -> None:
        self.max_skew_s = max_skew_s
        self.allowed_uids: set[int] = {0} | set(allowed_uids or ())
        self.agent_uids: set[int] = {0} | set(agent_uids or ())
        self._nonces = _NonceCache(max_skew_s)

    @abstractmethod
    def _make_token(self, payload: bytes) -> str: ...

    @abstractmethod
    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        """Return (payload, identity) or raise AuthError."""

    def sign(self, method: str, request_bytes: bytes, node: str = "") -> str:
        """Header value for one call to the agent of ``node`` ("" = bound to no node: Health only)."""
        return f"{self.scheme} {self._make_token(_binding_payload(method, request_bytes, node=node))}"

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
        payload = _binding_payload(method + REPLY_SUFFIX, response_bytes, node=node,
                                   reply_to=reply_binding(request_header))
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
        if scheme != self.scheme or not token:
            raise AuthError(f"expected auth scheme {self.scheme!r}, got {scheme!r}")
        payload, ident = self._open_token(token.strip())
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
        now = time.time()
        if abs(now - t) > self.max_skew_s:
            raise AuthError(f"token timestamp is {now - t:+.0f}s off (limit {self.max_skew_s:.0f}s)")
        if not self._nonces.check_and_add(n, now):
            raise AuthError("replayed token")
        return ident

    def is_privileged(self, ident: Identity) -> bool:
        """May call Preempt (and report on any job): root, the SlurmUser (munge) or an ``allowed_uids`` uid."""
        return ident.uid in self.allowed_uids

    def is_agent_identity(self, ident: Identity) -> bool:
        """May sign an agent's replies: root or the SlurmUser (munge), never a mere ``allowed_uids`` caller."""
        return ident.uid in self.agent_uids

    def describe(self) -> str:
        return self.scheme


# ---------------------------------------------------------------- shared key


class SharedKeyAuthenticator(Authenticator):
    """HMAC-SHA256 over the binding payload with a secret key file.

    The key file must be a regular file not readable/writable by group or
    others (``chmod 600``) and hold at least 16 bytes. The verified identity is
    the key file owner's UID (root for the intended deployment), so only holders
    of a root-owned key can preempt.
    """

    scheme = "hmac-sha256"

    def __init__(self, key_path: str | os.PathLike[str], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.key_path = Path(key_path)
        try:
            st = self.key_path.stat()
        except FileNotFoundError:
            raise AuthError(f"shared key file {self.key_path} does not exist") from None
        if not stat.S_ISREG(st.st_mode):
            raise AuthError(f"shared key {self.key_path} is not a regular file")
        if st.st_mode & 0o077:
            raise AuthError(
                f"shared key {self.key_path} has mode {stat.S_IMODE(st.st_mode):04o}; must not be accessible "
                "by group/others (chmod 600)"
            )
        key = self.key_path.read_bytes().strip()
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

    def _make_token(self, payload: bytes) -> str:
        mac = hmac.new(self._key, payload, hashlib.sha256).hexdigest()
        return base64.urlsafe_b64encode(payload).decode() + "." + mac

    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        b64, _, mac = token.partition(".")
        try:
            payload = base64.urlsafe_b64decode(b64.encode())
        except (ValueError, TypeError):
            raise AuthError("malformed hmac token") from None
        want = hmac.new(self._key, payload, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, mac):
            raise AuthError("bad hmac credential")
        return payload, self._owner

    def describe(self) -> str:
        return f"sharedkey:{self.key_path}"


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

    ``munge`` | ``munge:/path/to/socket`` | ``sharedkey:/path/to/key``.
    Raises ValueError for an unknown spec, AuthError for an unusable key.
    """
    spec = spec.strip()
    if spec == "munge":
        return MungeAuthenticator(**kw)  # type: ignore[arg-type]
    if spec.startswith("munge:"):
        return MungeAuthenticator(socket=spec[len("munge:"):], **kw)  # type: ignore[arg-type]
    if spec.startswith("sharedkey:"):
        return SharedKeyAuthenticator(spec[len("sharedkey:"):], **kw)
    raise ValueError(f"unknown auth spec {spec!r}: expected 'munge', 'munge:SOCKET' or 'sharedkey:/path/key'")
