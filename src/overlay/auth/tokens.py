"""Client tokens: signed claims with roles and content scopes (SPEC §16).

Theory of operation — the rules this module keeps (no socket, no clock:
the caller passes ``now``, Unix seconds):

1. A token is a JWT (RFC 7519) signed with Ed25519 (``EdDSA``, RFC 8037).
   Nodes hold only public keys, so a node — or its config — that leaks
   cannot mint tokens; only the holder of the signing key can
   (``overlay token create``).  The header's ``kid`` names the key
   (``key_id``: the first 16 hex digits of the SHA-256 of its raw 32 bytes),
   so a cluster trusting several keys during a rotation picks the one that
   signed without trying each, and a token of another cluster's key is
   refused by name.  Only ``EdDSA`` is accepted: a token claiming ``none``
   or an HMAC algorithm never reaches a key (no algorithm confusion).
2. Claims (``Claims``): ``sub`` the client id the token is for, ``aud`` the
   cluster's name, ``iat``, ``exp``, optional ``nbf``, ``jti`` a random id
   for the logs, ``roles`` (a non-empty subset of ``publish``,
   ``subscribe``, ``admin``) and ``scope``: at most one expression per
   role, in the subscription language (SPEC §2.2), for ``publish`` and
   ``subscribe`` only.  Every claim is checked for type when decoded.
3. ``Verifier.verify`` refuses, each with its own exception and a message a
   user can act on: no token (``TokenError``), a malformed one, an unknown
   key, a bad signature, another cluster's (``aud``), one not valid yet
   (``nbf``) or expired (``TokenExpired``) — both with ``leeway`` seconds
   for clocks that disagree —, an unknown role (``UnknownRole``), a scope
   that does not parse against the cluster's schema or names a role the
   token lacks (``BadScope``, with the position).  What it returns is a
   ``Rights``.  A token verified before is found in a bounded cache (its
   text is what was signed, so the same text verifies the same way) and
   only its times are checked again: a storm of reconnects after a node
   restart costs a dictionary look-up per Hello, not a signature check.
4. ``Rights`` answers the three questions of the node (each a ``Forbidden``
   when the answer is no, naming the role and the scope):
   may this session publish this event (the role, and the event matches
   the publish scope — SPEC §2.2 matching); may it subscribe with this
   filter (the role, and the subscribe scope *includes* the filter —
   ``Expression.includes``, exact for the extended language (``or``,
   ``not``, ``exists`` … in the scope and in the subscription alike,
   ``overlay.channels.dnf`` rule 3): every event the subscription could
   match lies inside the scope); may it run
   an admin command (the ``admin`` role).  A role without a scope is
   unrestricted.
5. ``issue`` makes tokens with the same checks, so a bad role or scope
   fails when the token is created, with the expression's position, not
   at the first Hello.
6. An optional ``limits`` claim overrides the cluster's ``[limits]`` for
   the token's holder (``overlay.limits.settings`` rule 3): only the keys
   of ``CLIENT_KEYS``, each within its bounds, else the token is refused
   (``TokenError``) when verified — and when issued.  ``Rights.limits``
   carries it to the node's quotas (``overlay.limits.quotas``).
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Final

import jwt
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from overlay.channels.dnf import Expression
from overlay.channels.expressions import parse_expression
from overlay.channels.predicates import Filter, compile_filter
from overlay.channels.schema import Schema, Value
from overlay.errors import BadScope, ExpressionError, Forbidden, TokenError, TokenExpired, UnknownRole
from overlay.limits.settings import parse_client_limits

__all__ = [
    "ALGORITHM",
    "LEEWAY",
    "MAX_SCOPE_LENGTH",
    "MAX_TOKEN_LENGTH",
    "MAX_TTL",
    "SUBJECT",
    "Claims",
    "Rights",
    "Role",
    "Verifier",
    "issue",
    "key_id",
    "parse_roles",
    "unverified_subject",
]

# Rule 1: the one algorithm a token may use.
ALGORITHM: Final = "EdDSA"
# Seconds by which a node's clock and the issuer's may disagree on exp/nbf.
LEEWAY: Final = 5.0
# A token rides in every Hello: past this it is refused before any parsing
# (the Hello's own bound, ``messages.client``).
MAX_TOKEN_LENGTH: Final = 16 * 1024
# A scope is parsed on every Hello: a short expression, not a subscription list.
MAX_SCOPE_LENGTH: Final = 2048
# Tokens whose verification ``Verifier`` remembers (a few hundred bytes each).
CACHE_SIZE: Final = 4096
# The longest life ``issue`` gives a token: a year; anything longer is a typo
# (seconds for minutes) or a token that should be a key.
MAX_TTL: Final = 366 * 24 * 3600.0
# The client id a token may name (the node's ``CLIENT_ID``): it prefixes
# publisher-chosen event ids, so it must be plain.
SUBJECT: Final = re.compile(r"[!-~]{1,128}")


class Role(enum.StrEnum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    ADMIN = "admin"


# Roles that may carry a content scope (rule 2): admin commands have no content.
SCOPED: Final = frozenset({Role.PUBLISH, Role.SUBSCRIBE})


class Claims(msgspec.Struct, frozen=True):
    """A token's payload as decoded (rule 2); unknown claims are ignored."""

    sub: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    aud: str | list[str]
    exp: float
    roles: list[str]
    iat: float = 0.0
    nbf: float | None = None
    jti: str = ""
    scope: dict[str, str] = {}
    limits: dict[str, int | float] = {}  # rule 6


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Rule 1: the ``kid`` of a key (a private key's is its public half's)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def parse_roles(names: Iterable[str]) -> frozenset[Role]:
    """The roles named, or ``UnknownRole`` for the first that is not one."""
    roles: set[Role] = set()
    for name in names:
        try:
            roles.add(Role(name))
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise UnknownRole(f"unknown role {name!r}: roles are {known}", role=str(name)) from None
    return frozenset(roles)


def _expression(f: Filter | Expression) -> Expression:
    return f if isinstance(f, Expression) else Expression((f,))


def _compile(scope: Expression) -> Callable[[Mapping[str, Value]], bool]:
    """A scope's match as a closure: one conjunct's compiled test, or any of them."""
    tests = tuple(compile_filter(f) for f in scope.conjuncts)
    if len(tests) == 1:
        return tests[0]
    return lambda values: any(t(values) for t in tests)


def _parse_scopes(scopes: Mapping[str, str], roles: frozenset[Role], schema: Schema) -> dict[Role, Expression]:
    """Rule 2 for the scopes: one parsed expression per scoped role the token has."""
    out: dict[Role, Expression] = {}
    for name, text in scopes.items():
        (role,) = parse_roles([name])
        if role not in SCOPED:
            raise BadScope(f"the {role} role takes no content scope (only publish and subscribe do)", role=role)
        if role not in roles:
            raise BadScope(f"a {role} scope needs the {role} role, which the token does not have", role=role)
        if len(text) > MAX_SCOPE_LENGTH:
            raise BadScope(
                f"the {role} scope must be an expression of at most {MAX_SCOPE_LENGTH} characters", role=role
            )
        try:
            out[role] = parse_expression(text, schema)
        except ExpressionError as exc:
            raise BadScope(
                f"the {role} scope {text!r} is not an expression of this cluster: {exc.reason} at position {exc.position}",
                role=role,
                text=text,
                position=exc.position,
            ) from exc
    return out


class Rights:
    """What a verified token allows (rule 4).

    Invariant: ``scopes`` has a filter only for a role in ``roles``; a role
    without one is unrestricted.  ``expires`` is ``math.inf`` for the rights
    of a session without a token (``anonymous``)."""

    __slots__ = (
        "_in_publish_scope",
        "expires",
        "limits",
        "roles",
        "schema",
        "scope_text",
        "scopes",
        "subject",
        "token_id",
    )

    def __init__(
        self,
        subject: str,
        roles: frozenset[Role],
        scopes: Mapping[Role, Filter | Expression],
        schema: Schema,
        *,
        expires: float = math.inf,
        token_id: str = "",
        limits: Mapping[str, float] | None = None,
    ) -> None:
        self.subject = subject
        self.roles = roles
        self.scopes = {role: _expression(f) for role, f in scopes.items()}
        self.schema = schema
        self.expires = expires
        self.token_id = token_id
        self.limits: dict[str, float] = dict(limits or {})  # rule 6: overrides of [limits]
        self.scope_text = {role: f.text(schema) for role, f in self.scopes.items()}
        # The publish check runs on every event: the compiled closure (~1 µs).
        scope = self.scopes.get(Role.PUBLISH)
        self._in_publish_scope: Callable[[Mapping[str, Value]], bool] | None = (
            _compile(scope) if scope is not None else None
        )

    @classmethod
    def anonymous(cls, schema: Schema) -> Rights:
        """A session without a token where tokens are optional: publish and
        subscribe, unscoped; never admin."""
        return cls("", frozenset({Role.PUBLISH, Role.SUBSCRIBE}), {}, schema)

    def expired(self, now: float) -> bool:
        return now >= self.expires

    def describe(self) -> str:
        """``subject 'alice' (roles publish, subscribe)`` for messages and logs."""
        who = f"subject {self.subject!r}" if self.subject else "no token"
        return f"{who} (roles {', '.join(sorted(self.roles)) or 'none'})"

    def need(self, role: Role, what: str) -> None:
        """``Forbidden`` unless the token has ``role`` (``what`` needs it)."""
        if role not in self.roles:
            raise Forbidden(f"{what} needs a token with the {role} role; yours has {self.describe()}", role=role)

    def check_publish(self, values: Mapping[str, Value]) -> None:
        self.need(Role.PUBLISH, "publishing")
        test = self._in_publish_scope
        if test is not None and not test(values):
            scope = self.scope_text[Role.PUBLISH]
            raise Forbidden(f"event not inside your publish scope `{scope}`", role=Role.PUBLISH, scope=scope)

    def check_subscribe(self, f: Filter | Expression) -> None:
        self.need(Role.SUBSCRIBE, "subscribing")
        scope = self.scopes.get(Role.SUBSCRIBE)
        if scope is not None and not scope.includes(_expression(f), self.schema):
            text = self.scope_text[Role.SUBSCRIBE]
            stext = f"({text})" if len(scope.conjuncts) > 1 else text
            ftext = f.text(self.schema)
            if isinstance(f, Expression) and len(f.conjuncts) > 1:
                ftext = f"({ftext})"
            raise Forbidden(
                f"subscription not covered by your subscribe scope `{text}`: narrow it to lie inside the scope "
                f"(e.g. `{ftext} and {stext}`)",
                role=Role.SUBSCRIBE,
                scope=text,
            )

    def check_admin(self, command: str) -> None:
        self.need(Role.ADMIN, f"{command!r} changes the cluster and")


class Verifier:
    """Rules 1–3 against a set of trusted public keys, for one cluster.

    Invariant: ``keys`` maps each trusted key's ``key_id`` to it."""

    def __init__(
        self, keys: Iterable[Ed25519PublicKey], *, audience: str, schema: Schema, leeway: float = LEEWAY
    ) -> None:
        self.keys = {key_id(k): k for k in keys}
        if not self.keys:
            raise ValueError("a Verifier needs at least one public key")
        self.audience = audience
        self.schema = schema
        self.leeway = leeway
        self._jws = jwt.PyJWS(algorithms=[ALGORITHM])
        self._cache: OrderedDict[str, tuple[Claims, Rights]] = OrderedDict()  # rule 3: least recently used first

    def verify(self, token: str, now: float) -> Rights:
        hit = self._cache.get(token)
        if hit is not None:
            self._cache.move_to_end(token)
            self._check_times(hit[0], now)
            return hit[1]
        claims = self._verified_claims(token)
        rights = self.rights(claims, now)
        self._cache[token] = (claims, rights)
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return rights

    def _verified_claims(self, token: str) -> Claims:
        if not token:
            raise TokenError(
                "this cluster needs a signed token: connect with Client(token=...), `overlay … --token T` "
                "or OVERLAY_TOKEN (`overlay token create` makes one)"
            )
        if len(token) > MAX_TOKEN_LENGTH:
            raise TokenError(f"the token is longer than {MAX_TOKEN_LENGTH} characters")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenError(f"the token is not a JWT ({exc}); `overlay token create` makes one") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg != ALGORITHM:
            raise TokenError(f"the token is signed with {alg!r}; this cluster accepts {ALGORITHM} (Ed25519) only")
        key = self.keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise TokenError(
                f"the token is signed by key {kid!r}, which this cluster does not trust "
                f"(it trusts {', '.join(sorted(self.keys))}): a token of another cluster, or of a key rotated out"
            )
        try:
            signed = self._jws.decode_complete(token, key=key, algorithms=[ALGORITHM])
        except jwt.InvalidSignatureError:
            raise TokenError(
                f"the token's signature does not verify with key {kid}: it was altered after signing"
            ) from None
        except jwt.PyJWTError as exc:
            raise TokenError(f"the token cannot be read: {exc}") from None
        try:
            return msgspec.json.decode(signed["payload"], type=Claims)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise TokenError(f"the token's claims are malformed: {exc}") from None

    def _check_times(self, claims: Claims, now: float) -> None:
        if not math.isfinite(claims.exp) or now >= claims.exp + self.leeway:
            raise TokenExpired(
                f"the token expired {_ago(now - claims.exp)} ago; ask for a new one", expired_at=claims.exp
            )
        if claims.nbf is not None and now < claims.nbf - self.leeway:
            raise TokenError(f"the token is not valid for another {_ago(claims.nbf - now)}")

    def rights(self, claims: Claims, now: float) -> Rights:
        """Rules 2–3 for claims whose signature verified."""
        auds = [claims.aud] if isinstance(claims.aud, str) else claims.aud
        if self.audience not in auds:
            raise TokenError(f"the token is for cluster {', '.join(map(repr, auds))}, not {self.audience!r}")
        self._check_times(claims, now)
        if not SUBJECT.fullmatch(claims.sub):
            raise TokenError(f"the token's subject {claims.sub!r} is not a plain client id")
        roles = parse_roles(claims.roles)
        if not roles:
            raise TokenError("the token grants no role")
        scopes = _parse_scopes(claims.scope, roles, self.schema)
        limits = _parse_limits(claims.limits)
        return Rights(
            claims.sub,
            roles,
            scopes,
            self.schema,
            expires=claims.exp + self.leeway,
            token_id=claims.jti,
            limits=limits,
        )


def _parse_limits(claim: Mapping[str, int | float]) -> dict[str, float]:
    """Rule 6."""
    try:
        return parse_client_limits(claim)
    except ValueError as exc:
        raise TokenError(f"the token's limits claim is refused: {exc}") from None


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def issue(
    key: Ed25519PrivateKey,
    *,
    subject: str,
    roles: Iterable[str],
    audience: str,
    ttl: float,
    now: float,
    schema: Schema,
    scopes: Mapping[str, str] | None = None,
    max_ttl: float = MAX_TTL,
    limits: Mapping[str, float] | None = None,
) -> str:
    """A signed token (rule 5): the same checks as ``Verifier.verify``, so what
    is issued verifies on every node of the cluster until ``now + ttl``."""
    role_set = parse_roles(roles)
    if not role_set:
        raise UnknownRole("a token needs at least one role: publish, subscribe or admin", role="")
    if not SUBJECT.fullmatch(subject):
        raise TokenError(f"subject {subject!r} must be 1-128 printable characters without spaces (a client id)")
    if not (math.isfinite(ttl) and 0 < ttl <= max_ttl):
        raise TokenError(f"ttl must be more than 0 and at most {max_ttl:.0f} seconds, got {ttl}")
    scope_texts = dict(scopes or {})
    _parse_scopes(scope_texts, role_set, schema)  # rule 5: fail now, with the position
    claims: dict[str, Any] = {
        "sub": subject,
        "aud": audience,
        "iat": int(now),
        "exp": int(now + ttl),
        "jti": secrets.token_hex(8),
        "roles": sorted(role_set),
    }
    if scope_texts:
        claims["scope"] = {str(Role(r)): text for r, text in sorted(scope_texts.items())}
    if limits:
        claims["limits"] = dict(sorted(_parse_limits(limits).items()))  # rule 6: fail now
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"kid": key_id(key)})


def unverified_subject(token: str) -> str | None:
    """The ``sub`` a token names, read without checking anything — for a client
    choosing its client id (the node checks the token).  None for a string
    that is not a JWT (e.g. a legacy ``[cluster] admin_token``)."""
    try:
        payload = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    sub = payload.get("sub")
    return sub if isinstance(sub, str) and sub else None
