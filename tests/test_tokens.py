"""``overlay.auth.tokens`` and ``.keys``: issue, verify, and what a token allows
(rules 1–5 of the module), without a node or an event loop."""

from __future__ import annotations

import base64
import json
import os
import stat

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings

from conftest import LOCAL
from overlay.auth import generate_keys, load_public_key, load_signing_key, verifier_for
from overlay.auth.tokens import (
    CACHE_SIZE,
    LEEWAY,
    Claims,
    Rights,
    Role,
    Verifier,
    issue,
    key_id,
    unverified_subject,
)
from overlay.channels import Filter, parse_subscription
from overlay.channels.expressions import parse_expression
from overlay.config import config_from_dict
from overlay.errors import BadScope, ConfigError, Forbidden, TokenError, TokenExpired, UnknownRole
from strategies import SMALL, brute_matches, events, filters

pytestmark = pytest.mark.timeout(60)

NOW = 1_700_000_000.0
SCHEMA = LOCAL.schema
CLUSTER = LOCAL.cluster.name
KEY = Ed25519PrivateKey.generate()


def make(key: Ed25519PrivateKey = KEY, **kw) -> str:
    args = {
        "subject": "alice",
        "roles": ["publish", "subscribe"],
        "audience": CLUSTER,
        "ttl": 600.0,
        "now": NOW,
        "schema": SCHEMA,
    } | kw
    return issue(key, **args)


def verifier(*keys: Ed25519PrivateKey, schema=SCHEMA, audience: str = CLUSTER) -> Verifier:
    return Verifier([k.public_key() for k in keys or (KEY,)], audience=audience, schema=schema)


def forge(claims: dict, key: Ed25519PrivateKey = KEY, **headers) -> str:
    """A token signed by ``key`` with whatever claims (``issue`` would refuse them)."""
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": key_id(key)} | headers)


def good_claims(**kw) -> dict:
    return {"sub": "alice", "aud": CLUSTER, "exp": NOW + 600, "iat": NOW, "roles": ["publish"]} | kw


# -- issue and verify (rules 1, 2, 5) ---------------------------------------------------


def test_an_issued_token_verifies_with_its_roles_scopes_and_expiry() -> None:
    token = make(scopes={"subscribe": 'sym prefix "AB"', "publish": 'venue = "lse"'})
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "EdDSA" and header["kid"] == key_id(KEY) == key_id(KEY.public_key())
    rights = verifier().verify(token, NOW)
    assert rights.subject == "alice" and rights.roles == {Role.PUBLISH, Role.SUBSCRIBE}
    assert rights.scope_text == {Role.SUBSCRIBE: 'sym prefix "AB"', Role.PUBLISH: 'venue = "lse"'}
    assert rights.expires == NOW + 600 + LEEWAY and not rights.expired(NOW + 600)
    assert rights.expired(NOW + 600 + LEEWAY)
    assert unverified_subject(token) == "alice"
    assert unverified_subject("s3cret") is None and unverified_subject("") is None


@pytest.mark.parametrize(
    "kw, error, words",
    [
        ({"roles": ["publish", "root"]}, UnknownRole, "unknown role 'root'"),
        ({"roles": []}, UnknownRole, "at least one role"),
        ({"subject": "has space"}, TokenError, "subject"),
        ({"ttl": 0}, TokenError, "ttl"),
        ({"ttl": 10 * 366 * 86400.0}, TokenError, "ttl"),
        ({"ttl": float("nan")}, TokenError, "ttl"),
        ({"scopes": {"publish": "venue = lse"}}, BadScope, "at position 8"),
        ({"scopes": {"publish": 'colour = "red"'}}, BadScope, "colour"),
        ({"scopes": {"admin": 'sym = "A"'}, "roles": ["admin"]}, BadScope, "takes no content scope"),
        ({"scopes": {"subscribe": 'sym = "A"'}, "roles": ["publish"]}, BadScope, "needs the subscribe role"),
        ({"scopes": {"owner": 'sym = "A"'}}, UnknownRole, "unknown role 'owner'"),
        ({"limits": {"queue_budget": 1}}, TokenError, "unknown limit 'queue_budget'"),
        ({"limits": {"max_subscriptions": -1}}, TokenError, "bad limit"),
    ],
)
def test_issue_refuses_what_no_node_would_accept(kw: dict, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(")):
        make(**kw)


def test_a_limits_claim_rides_in_the_rights() -> None:
    """Rule 6: the claim overrides [limits] for the holder (overlay.limits.quotas)."""
    rights = verifier().verify(make(limits={"max_subscriptions": 50_000, "publish_rate": 10}), NOW)
    assert rights.limits == {"max_subscriptions": 50_000, "publish_rate": 10.0}
    assert verifier().verify(make(), NOW).limits == {}


def test_a_bad_scope_names_its_position() -> None:
    with pytest.raises(BadScope) as info:
        make(scopes={"subscribe": 'sym prefix "AB" and price < "x"'})
    assert info.value.role == "subscribe" and info.value.position == 28 and info.value.text.startswith("sym")


# -- every refusal its own error (rule 3) -------------------------------------------------


def test_no_token_is_refused_saying_how_to_get_one() -> None:
    with pytest.raises(TokenError, match=r"needs a signed token.*overlay token create"):
        verifier().verify("", NOW)


@pytest.mark.parametrize("text", ["garbage", "a.b.c", "x" * 20_000, "eyJhbGciOiJub25lIn0.e30."])
def test_malformed_tokens_are_refused(text: str) -> None:
    with pytest.raises(TokenError):
        verifier().verify(text, NOW)


def test_an_expired_token_is_refused_after_the_leeway_only() -> None:
    token = make(ttl=60)
    verifier().verify(token, NOW + 60 + LEEWAY - 0.5)  # clocks may disagree by the leeway
    with pytest.raises(TokenExpired, match="expired 6s ago") as info:
        verifier().verify(token, NOW + 66)
    assert info.value.expired_at == NOW + 60


def test_the_cache_checks_the_time_on_every_use() -> None:
    v, token = verifier(), make(ttl=60)
    assert v.verify(token, NOW) is v.verify(token, NOW + 1)  # the second from the cache
    with pytest.raises(TokenExpired):
        v.verify(token, NOW + 3600)
    for i in range(CACHE_SIZE + 10):  # bounded
        v.verify(make(subject=f"c{i}"), NOW)
    assert len(v._cache) == CACHE_SIZE


def test_a_token_of_another_key_is_refused_by_name() -> None:
    other = Ed25519PrivateKey.generate()
    with pytest.raises(TokenError, match=f"signed by key '{key_id(other)}'.*does not trust.*{key_id(KEY)}"):
        verifier().verify(make(other), NOW)


def test_a_token_signed_by_another_key_under_a_trusted_kid_fails_the_signature() -> None:
    token = forge(good_claims(), Ed25519PrivateKey.generate(), kid=key_id(KEY))
    with pytest.raises(TokenError, match="signature does not verify"):
        verifier().verify(token, NOW)


def test_an_altered_payload_fails_the_signature() -> None:
    header, payload, sig = make().split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["roles"] = ["publish", "subscribe", "admin"]
    altered = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="signature does not verify"):
        verifier().verify(f"{header}.{altered}.{sig}", NOW)


def test_only_eddsa_is_accepted() -> None:
    hs = jwt.encode(good_claims(), "secret-key-of-at-least-32-bytes!!", algorithm="HS256", headers={"kid": key_id(KEY)})
    with pytest.raises(TokenError, match=r"'HS256'.*EdDSA"):
        verifier().verify(hs, NOW)


def test_a_token_for_another_cluster_is_refused() -> None:
    with pytest.raises(TokenError, match="for cluster 'elsewhere', not"):
        verifier().verify(make(audience="elsewhere"), NOW)
    assert verifier().verify(forge(good_claims(aud=["elsewhere", CLUSTER])), NOW).subject == "alice"


@pytest.mark.parametrize(
    "claims, error, words",
    [
        (good_claims(roles=["publish", "root"]), UnknownRole, "root"),
        (good_claims(roles=[]), TokenError, "no role"),
        (good_claims(nbf=NOW + 3600), TokenError, "not valid for another"),
        (good_claims(sub="two words"), TokenError, "subject"),
        (good_claims(scope={"publish": "price <"}), BadScope, "position"),
        (good_claims(scope={"subscribe": 'sym = "A"'}), BadScope, "needs the subscribe role"),
        ({k: v for k, v in good_claims().items() if k != "exp"}, TokenError, "malformed"),
        (good_claims(roles="publish"), TokenError, "malformed"),
        (good_claims(exp="tomorrow"), TokenError, "malformed"),
        (good_claims(limits={"max_clients": 5}), TokenError, "unknown limit 'max_clients'"),
        (good_claims(limits={"publish_rate": -1}), TokenError, "bad limit"),
        (good_claims(limits={"publish_rate": "fast"}), TokenError, "malformed"),
    ],
)
def test_bad_claims_are_refused_with_their_own_error(claims: dict, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        verifier().verify(forge(claims), NOW)


def test_a_scope_of_another_schema_is_refused() -> None:
    token = make(scopes={"subscribe": 'sym prefix "AB"'})
    with pytest.raises(BadScope, match="sym"):
        verifier(schema=SMALL).verify(token, NOW)


def test_a_rotation_trusts_both_keys() -> None:
    new = Ed25519PrivateKey.generate()
    both = verifier(new, KEY)
    assert both.verify(make(KEY), NOW).subject == both.verify(make(new), NOW).subject == "alice"


# -- what a token allows (rule 4) ---------------------------------------------------------


def rights_of(roles: list[str], scopes: dict[str, str] | None = None) -> Rights:
    return verifier().verify(make(roles=roles, scopes=scopes or {}), NOW)


def sub(text: str) -> Filter:
    return parse_subscription(text, SCHEMA)


def test_a_missing_role_is_forbidden_by_name() -> None:
    r = rights_of(["subscribe"])
    with pytest.raises(Forbidden, match="publishing needs a token with the publish role") as info:
        r.check_publish({"price": 1.0, "sym": "A"})
    assert info.value.role == "publish" and info.value.scope == ""
    with pytest.raises(Forbidden, match=r"'split' changes the cluster and needs .* admin role"):
        r.check_admin("split")
    rights_of(["admin"]).check_admin("split")
    with pytest.raises(Forbidden, match="subscribing"):
        rights_of(["publish"]).check_subscribe(sub('sym = "A"'))


def test_scopes_bound_subscriptions_and_events() -> None:
    r = rights_of(["publish", "subscribe"], {"subscribe": 'sym prefix "AB"', "publish": 'venue = "lse"'})
    r.check_subscribe(sub('sym prefix "ABC" and price < 10'))
    r.check_subscribe(sub('sym in {"ABX", "AB"}'))
    with pytest.raises(Forbidden, match='not covered by your subscribe scope `sym prefix "AB"`') as info:
        r.check_subscribe(sub("price < 10"))
    assert info.value.scope == 'sym prefix "AB"'
    with pytest.raises(Forbidden):
        r.check_subscribe(sub('sym in {"ABX", "B"}'))
    r.check_publish({"price": 1.0, "sym": "ZZ", "venue": "lse"})
    with pytest.raises(Forbidden, match='event not inside your publish scope `venue = "lse"`'):
        r.check_publish({"price": 1.0, "sym": "ZZ", "venue": "nyse"})
    with pytest.raises(Forbidden):
        r.check_publish({"price": 1.0, "sym": "ZZ"})  # no venue: not inside


def test_anonymous_rights_publish_and_subscribe_but_never_operate() -> None:
    r = Rights.anonymous(SCHEMA)
    r.check_publish({"price": 1.0, "sym": "A"})
    r.check_subscribe(sub("price < 1"))
    assert not r.expired(NOW * 10)
    with pytest.raises(Forbidden, match="no token"):
        r.check_admin("drain")


@settings(max_examples=200, deadline=None)
@given(scope=filters(SMALL, 3), f=filters(SMALL, 3), event=events(SMALL))
def test_a_scope_check_agrees_with_matching(scope: Filter, f: Filter, event: dict) -> None:
    """An event inside the publish scope is accepted and one outside refused;
    an accepted subscription never matches an event outside the subscribe scope."""
    r = Rights("p", frozenset(Role), {Role.PUBLISH: scope, Role.SUBSCRIBE: scope}, SMALL)
    try:
        r.check_publish(event)
        accepted = True
    except Forbidden:
        accepted = False
    assert accepted == brute_matches(scope, event)
    try:
        r.check_subscribe(f)
    except Forbidden:
        return
    if brute_matches(f, event):
        assert brute_matches(scope, event)


def test_claims_ignore_unknown_fields() -> None:
    assert Claims(sub="a", aud="x", exp=1.0, roles=["admin"]).scope == {}
    assert verifier().verify(forge(good_claims(team="blue")), NOW).subject == "alice"


# -- key files (overlay.auth.keys) ----------------------------------------------------------


def test_generated_keys_load_and_sign(tmp_path) -> None:
    private, public = generate_keys(tmp_path / "keys")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    key = load_signing_key(private)
    assert key_id(load_public_key(public)) == key_id(key)
    with pytest.raises(ConfigError, match="exists already"):
        generate_keys(tmp_path / "keys")


def test_key_files_that_are_missing_or_wrong_say_so(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*overlay token keys"):
        load_signing_key(tmp_path / "nope.key")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        load_signing_key(tmp_path / "junk.pem")
    with pytest.raises(ConfigError, match="not a PEM public key"):
        load_public_key(tmp_path / "junk.pem")
    private, _ = generate_keys(tmp_path)
    with pytest.raises(ConfigError, match="not a PEM public key"):
        load_public_key(private)


def auth_doc(tmp_path, **auth) -> dict:
    doc = {
        "cluster": {"name": "c1"},
        "nodes": [{"id": 0}],
        "schema": {"distinguishing": ["price"], "attributes": [{"name": "price", "type": "float", "min": 0, "max": 9}]},
    }
    if auth:
        doc["auth"] = auth
    return doc


def test_the_auth_table_resolves_paths_next_to_the_config(tmp_path) -> None:
    generate_keys(tmp_path / "k")
    cfg = config_from_dict(
        auth_doc(tmp_path, public_keys=["k/auth.pub"], signing_key="k/auth.key"), str(tmp_path / "c.toml")
    )
    assert cfg.auth.enabled and cfg.auth.required and cfg.auth.public_keys == (str(tmp_path / "k/auth.pub"),)
    v = verifier_for(cfg)
    assert v is not None and v.audience == "c1" and list(v.keys) == [key_id(load_signing_key(cfg.auth.signing_key))]
    assert verifier_for(config_from_dict(auth_doc(tmp_path))) is None


@pytest.mark.parametrize(
    "auth, cluster, words",
    [
        ({"signing_key": "k"}, {}, "public_keys: list at least one"),
        ({"public_keys": ["k.pub"], "requird": True}, {}, "did you mean 'required'"),
        ({"public_keys": ["k.pub"], "leeway": -1}, {}, "leeway"),
        ({"public_keys": ["k.pub"]}, {"admin_token": "s3cret"}, "cannot both be set"),
    ],
)
def test_the_auth_table_is_checked(tmp_path, auth: dict, cluster: dict, words: str) -> None:
    doc = auth_doc(tmp_path, **auth)
    doc["cluster"] |= cluster
    with pytest.raises(ConfigError, match=words):
        config_from_dict(doc)


def test_a_subscription_too_intricate_to_check_against_the_scope_is_forbidden_not_an_error() -> None:
    # 32 alternatives of wildcard patterns, inside the parser's budget; against
    # the scope each is a search of its own: SchemaError escaped the node's
    # Subscribe handling (a traceback, and the client waited for its timeout).
    pairs = [(chr(97 + 2 * i), chr(98 + 2 * i)) for i in range(5)]
    text = " and ".join(f'(venue like "*{a}*{b}*" or venue like "*{b}*{a}*")' for a, b in pairs)
    r = rights_of(["subscribe"], {"subscribe": 'not venue like "*z*y*"'})
    with pytest.raises(Forbidden, match="not covered by your subscribe scope"):
        r.check_subscribe(parse_expression(text, SCHEMA))
