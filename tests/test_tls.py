"""TLS on every port and authenticated peers, on real nodes (SPEC §16; issue 17 items 1 and 2).

What a user and an attacker see from outside: a TLS cluster delivers end to
end and serves its admin endpoint over HTTPS; a client without the CA, a
plain client on a TLS port and a TLS client on a plain one fail with an
error saying what to configure; a stranger's peer link — a self-signed
certificate, a client's certificate, a valid certificate claiming another
node's id, no proof or a wrong one of the cluster secret, another cluster's
name, an id whose live link is open already, a peer message on a client
connection — is refused, counted (``overlay_peer_refused_total`` /
``overlay_tls_refused_total``), logged with the remote address, and changes
nothing: the routing table, the peers and the links are what they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from conftest import LOCAL
from overlay.client import AgentClient, Client
from overlay.errors import RequestError, TlsError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, client_reader, encode_frame, peer_reader
from overlay.messages.handshake import MAX_OPENING_FRAME
from overlay.net.node import CLIENT_MAGIC, PEER_MAGIC
from overlay.security import client_context, node_security, stats_key
from overlay.security import peer_auth as pa
from overlay.security.certs import make_dev_certs
from overlay.security.refusals import Refusal
from overlay.testing import WAIT, LoopbackCluster, dev_tls, dial_peer, wait_until

pytestmark = pytest.mark.timeout(60)

EVENT = {"price": 42.5, "sym": "IBM", "qty": 10}


def refused(cl: LoopbackCluster, reason: Refusal, node: int = 0) -> int:
    return int(cl.nodes[node].core.stats.get(stats_key(reason), 0))


def snapshot(cl: LoopbackCluster) -> dict[int, Any]:
    """What a stranger must not change: every node's table, peers and links."""
    return {
        i: (dict(n.core.routing.items()), sorted(n.core.peers), sorted(n.links), n.core.stats.get("peers_joined", 0))
        for i, n in cl.nodes.items()
    }


def stranger_context(cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A TLS client that trusts any node and shows ``cert`` (if any): what an attacker brings."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while data := await asyncio.wait_for(reader.read(65536), WAIT):
            out += data
    return out


@pytest.fixture
async def tls_cluster():
    async with LoopbackCluster(LOCAL, 3, tls=True, admin=True, balancing=False) as cl:
        yield cl


@pytest.fixture
async def plain_cluster():
    async with LoopbackCluster(LOCAL, 3, admin=True, balancing=False) as cl:
        yield cl


# -- TLS end to end -------------------------------------------------------------------------------


async def test_a_tls_cluster_delivers_end_to_end(tls_cluster: LoopbackCluster) -> None:
    cl = tls_cluster
    assert all(not n.security.insecure for n in cl.nodes.values())
    sub = await (await cl.client(2)).subscribe('price < 100 and sym = "IBM"')
    await (await cl.client(0)).publish(EVENT)
    note = await sub.next(WAIT)
    assert note.event == EVENT
    agent = await cl.agent(0, 1, 2)
    asub = await agent.subscribe("price > 500")
    await agent.publish({"price": 600.0, "sym": "X"})
    assert (await asub.next(WAIT)).event["price"] == 600.0
    # Every link between the nodes is mutual TLS, and nobody was refused on the way.
    for node in cl.nodes.values():
        assert all(link.connected.is_set() for link in node.links.values())
        assert node.links[next(iter(node.links))]._transport.get_extra_info("ssl_object") is not None
    assert sum(refused(cl, r, i) for r in Refusal for i in cl.nodes) == 0


async def test_the_admin_endpoint_speaks_https_verified_against_the_cluster_ca(tls_cluster: LoopbackCluster) -> None:
    cl = tls_cluster
    url = cl.url(1)
    assert url.startswith("https://")
    connector = aiohttp.TCPConnector(ssl=cl.client_ssl)
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.get(f"{url}/status") as resp:
            status = await resp.json()
        assert status["security"] == {
            "tls": True,
            "peers": "mutual TLS",
            "client_certificates": "optional",
            "warning": "",
        }
        # The page's whole-cluster view: node 1 fetched the others' endpoints over HTTPS.
        async with http.get(f"{url}/cluster") as resp:
            view = await resp.json()
        assert [n["reachable"] for n in view["nodes"]] == [True, True, True]
        assert all(n["admin"].startswith("https://") for n in view["nodes"])
        assert view["insecure_nodes"] == []
        async with http.get(f"{url}/metrics") as resp:
            metrics = await resp.text()
    assert 'overlay_peer_refused_total{node="1",reason="bad_proof"} 0.0' in metrics
    assert 'overlay_tls_refused_total{node="1",reason="not_tls"} 0.0' in metrics
    # Plain HTTP on the HTTPS port gets nowhere; nor does a client without the CA.
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(url.replace("https://", "http://") + "/status") as resp:
                await resp.read()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with http.get(f"{url}/status") as resp:
                await resp.read()


async def test_an_insecure_cluster_says_so_on_its_admin_page(plain_cluster: LoopbackCluster) -> None:
    cl = plain_cluster
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{cl.url(0)}/status") as resp:
            status = await resp.json()
        async with http.get(f"{cl.url(0)}/cluster") as resp:
            view = await resp.json()
    assert status["security"]["tls"] is False and "insecure = true" in status["security"]["warning"]
    assert view["insecure_nodes"] == [0, 1, 2]


async def test_an_insecure_node_warns_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="overlay.net")
    async with LoopbackCluster(LOCAL, 1, balancing=False):
        pass
    assert "node 0: [tls] insecure = true: plain TCP, nothing encrypted" in caplog.text
    caplog.clear()
    async with LoopbackCluster(LOCAL, 1, balancing=False, tls=True):
        pass
    assert "insecure" not in caplog.text


# -- clients that cannot talk to the node ---------------------------------------------------------


async def test_a_client_without_the_cluster_ca_fails_at_once_with_what_to_do(
    tls_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    cl = tls_cluster
    make_dev_certs(tmp_path, [])  # another CA: not the cluster's
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(TlsError, match=r"does not verify.*cluster's CA"):
        await Client([cl.addr(0)], ssl=client_context(tmp_path / "ca.pem")).connect(timeout=WAIT)
    with pytest.raises(TlsError, match="does not verify"):
        await AgentClient([cl.addr(0), cl.addr(1)], ssl=ssl.create_default_context()).connect(timeout=WAIT)
    assert asyncio.get_running_loop().time() - t0 < WAIT / 2  # no waiting out the timeout
    # The node saw a handshake its client gave up on: counted, and it serves on.
    await wait_until(lambda: refused(cl, Refusal.TLS_HANDSHAKE) >= 1, what="the failed handshake counted")
    assert (await cl.client(0)).ready


async def test_a_plain_client_on_a_tls_port_is_told_to_use_tls(
    tls_cluster: LoopbackCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cl = tls_cluster
    caplog.set_level(logging.WARNING, logger="overlay.net")
    with pytest.raises(RequestError, match="this node requires TLS"):
        await Client([cl.addr(0)]).connect(timeout=WAIT)
    assert refused(cl, Refusal.NOT_TLS) == 1
    assert "refused not_tls from 127.0.0.1:" in caplog.text
    # Bytes that are neither TLS nor our protocol: refused too, the node unmoved.
    _, writer = await asyncio.open_connection(*cl.addr(0))
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    await wait_until(lambda: refused(cl, Refusal.NOT_TLS) == 2, what="the second refusal")
    writer.close()
    assert (await cl.client(0)).ready


async def test_a_tls_client_on_a_plain_port_is_told_the_node_does_not_speak_tls(
    plain_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    cl = plain_cluster
    make_dev_certs(tmp_path, [])
    with pytest.raises(TlsError, match="does not speak TLS"):
        await Client([cl.addr(1)], ssl=client_context(tmp_path / "ca.pem")).connect(timeout=WAIT)
    assert refused(cl, Refusal.TLS_ON_PLAIN_PORT, 1) == 1


async def test_verify_clients_asks_every_client_for_a_certificate() -> None:
    config = msgspec.structs.replace(LOCAL, tls=msgspec.structs.replace(dev_tls(range(2)), verify_clients=True))
    async with LoopbackCluster(config, 2, tls=None, balancing=False) as cl:
        assert cl.client_ssl is not None
        assert (await cl.client(0)).ready  # the harness's client shows the config's client certificate
        ca_only = client_context(config.tls.ca)
        with pytest.raises(RequestError, match="requires a client certificate"):
            await Client([cl.addr(0)], ssl=ca_only).connect(timeout=WAIT)
        assert refused(cl, Refusal.NO_CLIENT_CERTIFICATE) == 1
        assert (await cl.client(1)).ready


# -- strangers on the peer port, with TLS ---------------------------------------------------------


async def _peer_attempt(
    cl: LoopbackCluster, ctx: ssl.SSLContext | None, hello: pm.PeerHello, node: int = 0
) -> list[pm.PeerMessage]:
    """Open a peer link to ``node`` with ``ctx`` and say ``hello``; what comes back until it closes."""
    try:
        reader, writer = await asyncio.open_connection(*cl.addr(node), ssl=ctx)
    except (ssl.SSLError, ConnectionError):
        return []
    writer.write(PEER_MAGIC + encode_frame(hello))
    data = await read_to_end(reader)
    writer.close()
    return peer_reader().feed(data)


async def test_a_stranger_with_a_self_signed_certificate_is_refused_and_changes_nothing(
    tls_cluster: LoopbackCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cl = tls_cluster
    caplog.set_level(logging.WARNING, logger="overlay.net")
    make_dev_certs(tmp_path, [])
    before = snapshot(cl)
    hello = pm.PeerHello(9, "local", host="127.0.0.1", port=cl.ports[0] + 1, capacity=1.0)
    got = await _peer_attempt(cl, stranger_context(tmp_path / "ca.pem", tmp_path / "ca.key"), hello)
    assert got == []  # refused in the handshake: not a byte of the protocol back
    await wait_until(lambda: refused(cl, Refusal.BAD_CERTIFICATE) == 1, what="the refusal counted")
    assert "refused bad_certificate from 127.0.0.1:" in caplog.text
    assert snapshot(cl) == before
    assert 9 not in cl.nodes[0].links and 9 not in cl.nodes[0].core.peers  # no dial back to it


async def test_a_peer_link_without_a_node_certificate_is_refused(tls_cluster: LoopbackCluster) -> None:
    cl = tls_cluster
    before = snapshot(cl)
    hello = pm.PeerHello(9, "local", host="127.0.0.1", port=1, capacity=1.0)
    # No certificate at all, then the cluster's own *client* certificate: neither is a node's.
    client_cert = Path(cl.config.tls.client_cert), Path(cl.config.tls.client_key)
    for ctx in (stranger_context(), stranger_context(*client_cert)):
        (err,) = await _peer_attempt(cl, ctx, hello)
        assert isinstance(err, pm.PeerError) and err.code == "not_a_node", err
    assert refused(cl, Refusal.NOT_A_NODE) == 2
    assert snapshot(cl) == before


async def test_a_valid_certificate_claiming_another_node_id_is_refused(tls_cluster: LoopbackCluster) -> None:
    cl = tls_cluster
    before = snapshot(cl)
    tls = cl.config.tls
    node2 = stranger_context(Path(tls.cert.replace("{id}", "2")), Path(tls.key.replace("{id}", "2")))
    (err,) = await _peer_attempt(cl, node2, pm.PeerHello(1, "local", incarnation=7))
    assert isinstance(err, pm.PeerError) and err.code == "identity_mismatch" and "node 2" in err.message
    assert refused(cl, Refusal.IDENTITY_MISMATCH) == 1
    assert snapshot(cl) == before
    assert cl.nodes[0].peer_runs.get(1) != 7  # the forged incarnation discarded nothing


async def test_node_ids_claimed_twice_and_other_clusters_are_refused(tls_cluster: LoopbackCluster) -> None:
    cl = tls_cluster
    before = snapshot(cl)
    tls = cl.config.tls
    node2 = stranger_context(Path(tls.cert.replace("{id}", "2")), Path(tls.key.replace("{id}", "2")))
    # Node 2's certificate, node 2's id, while node 2's own link to node 0 is up and talking.
    (err,) = await _peer_attempt(cl, node2, pm.PeerHello(2, "local", incarnation=99))
    assert isinstance(err, pm.PeerError) and err.code == "duplicate_id", err
    (err,) = await _peer_attempt(cl, node2, pm.PeerHello(2, "elsewhere"))
    assert isinstance(err, pm.PeerError) and err.code == "wrong_cluster", err
    assert (refused(cl, Refusal.DUPLICATE_ID), refused(cl, Refusal.WRONG_CLUSTER)) == (1, 1)
    assert snapshot(cl) == before
    assert cl.nodes[0].links[2].connected.is_set() and cl.nodes[0].peer_runs[2] != 99


async def test_a_dialled_peer_must_be_the_node_dialled() -> None:
    # Node 1's address answers with a certificate of the cluster CA — node 5's.
    cl = LoopbackCluster(LOCAL, 2, tls=True, placeholders=[1], balancing=False)
    await cl.start(ready=False)
    try:
        impostor = node_security(msgspec.structs.replace(cl.config, tls=dev_tls([5])), 5)
        cl.socks[1].listen(8)

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_to_end(reader)
            writer.close()

        server = await asyncio.start_server(answer, sock=cl.socks[1], ssl=impostor.server)
        async with server:
            await wait_until(lambda: refused(cl, Refusal.IDENTITY_MISMATCH) >= 1, what="the dial refused")
            assert not cl.nodes[0].links[1].connected.is_set()
    finally:
        await cl.stop()


async def test_a_node_with_a_certificate_of_the_cluster_ca_joins(tls_cluster: LoopbackCluster) -> None:
    cl = tls_cluster
    node = await cl.join(capacity=1.0)
    await wait_until(lambda: all(node.id in n.core.peers for n in cl.nodes.values() if n is not node), what="joined")
    await cl.wait_ready()
    sub = await (await cl.client(node.id)).subscribe("price < 1")
    await (await cl.client(0)).publish({"price": 0.5, "sym": "J"})
    assert (await sub.next(WAIT)).event["sym"] == "J"


# -- strangers on the peer port, without TLS (the cluster secret) ---------------------------------


async def test_a_peer_hello_without_the_challenge_is_refused_and_no_one_dials_back(
    plain_cluster: LoopbackCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 17: a stranger's hello claiming node 9 made the node dial it back.
    cl = plain_cluster
    caplog.set_level(logging.WARNING, logger="overlay.net")
    before = snapshot(cl)
    (err,) = await _peer_attempt(cl, None, pm.PeerHello(9, "local", host="127.0.0.1", port=9, capacity=5.0))
    assert isinstance(err, pm.PeerError) and err.code == "unauthenticated"
    assert refused(cl, Refusal.UNAUTHENTICATED) == 1
    assert "refused unauthenticated from 127.0.0.1:" in caplog.text
    assert snapshot(cl) == before and 9 not in cl.nodes[0].links


async def test_a_wrong_secret_is_refused_and_never_on_the_wire(plain_cluster: LoopbackCluster) -> None:
    cl = plain_cluster
    before = snapshot(cl)
    secret = cl.config.tls.secret.encode()
    reader, writer = await asyncio.open_connection(*cl.addr(0))
    nonce = b"n" * pa.NONCE_BYTES
    writer.write(PEER_MAGIC + encode_frame(pm.PeerAuth(1, "local", nonce)))
    frames = peer_reader()
    wire = b""
    msgs: list[pm.PeerMessage] = []
    while not msgs:
        data = await asyncio.wait_for(reader.read(65536), WAIT)
        wire += data
        msgs = frames.feed(data)
    (challenge,) = msgs
    assert isinstance(challenge, pm.PeerChallenge) and challenge.node_id == 0
    assert secret not in wire  # the node proved itself without showing the secret
    # A proof made with a wrong secret (a stranger's best guess).
    wrong = pa.proof(b"a guess at the secret", "caller", "local", 1, 0, nonce, challenge.nonce)
    writer.write(encode_frame(pm.PeerProof(wrong)))
    (err,) = peer_reader().feed(await read_to_end(reader))
    writer.close()
    assert isinstance(err, pm.PeerError) and err.code == "bad_proof"
    assert refused(cl, Refusal.BAD_PROOF) == 1
    assert snapshot(cl) == before


async def test_the_secret_holder_of_another_cluster_name_is_refused(plain_cluster: LoopbackCluster) -> None:
    cl = plain_cluster
    reader, writer = await asyncio.open_connection(*cl.addr(0))
    writer.write(PEER_MAGIC + encode_frame(pm.PeerAuth(1, "elsewhere", b"n" * pa.NONCE_BYTES)))
    (err,) = peer_reader().feed(await read_to_end(reader))
    writer.close()
    assert isinstance(err, pm.PeerError) and err.code == "wrong_cluster"
    assert refused(cl, Refusal.WRONG_CLUSTER) == 1


async def test_a_member_proving_the_secret_is_admitted_under_the_id_it_proved(plain_cluster: LoopbackCluster) -> None:
    cl = plain_cluster
    reader, writer = await dial_peer(cl.config, 9, 0)  # the secret, proved as node 9
    try:
        writer.write(encode_frame(pm.PeerHello(3, "local")))  # … then a hello claiming node 3
        (err,) = peer_reader().feed(await read_to_end(reader))
        assert isinstance(err, pm.PeerError) and err.code == "identity_mismatch"
    finally:
        writer.close()
    reader, writer = await dial_peer(cl.config, 9, 0)
    try:
        writer.write(encode_frame(pm.PeerHello(9, "local", incarnation=5)))
        (answer,) = peer_reader().feed(await asyncio.wait_for(reader.read(65536), WAIT))
        assert isinstance(answer, pm.PeerHello) and answer.node_id == 0
    finally:
        writer.close()


async def test_a_peer_link_that_never_finishes_its_opening_is_closed_after_peer_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Found by the second outside audit: past the 4-byte preamble nothing bounded
    # a peer link's opening, and a stranger without the secret held 100 such
    # connections (a task and a descriptor each) on a node for as long as it liked.
    caplog.set_level(logging.WARNING, logger="overlay.net")
    async with LoopbackCluster(LOCAL, 3, balancing=False, peer_timeout=1.0) as cl:
        before = snapshot(cl)
        openings = [
            PEER_MAGIC,  # the preamble, then silence
            PEER_MAGIC + encode_frame(pm.PeerAuth(1, "local", b"n" * pa.NONCE_BYTES)),  # no proof follows
            PEER_MAGIC + encode_frame(pm.PeerAuth(1, "local", b"n" * pa.NONCE_BYTES))[:7],  # half a frame
        ]
        conns = []
        for opening in openings:
            reader, writer = await asyncio.open_connection(*cl.addr(0))
            writer.write(opening)
            conns.append((reader, writer))
        for reader, writer in conns:
            msgs = peer_reader().feed(await read_to_end(reader))  # closed by the node: read_to_end returns
            writer.close()
            assert isinstance(msgs[-1], pm.PeerError) and msgs[-1].code == "opening_timeout", msgs
            assert "peer_timeout" in msgs[-1].message
        assert refused(cl, Refusal.OPENING_TIMEOUT) == 3
        # Each counted; the first logged, the others within LOG_EVERY only counted (RefusalLog).
        assert caplog.text.count("refused opening_timeout from 127.0.0.1:") == 1
        assert snapshot(cl) == before
        # The members' own links opened within the same bound and still carry events.
        sub = await (await cl.client(2)).subscribe("price < 100")
        await (await cl.client(0)).publish(EVENT)
        assert (await sub.next(WAIT)).event == EVENT


async def test_a_peer_opening_frame_longer_than_any_opening_message_is_refused_at_its_header() -> None:
    # Found by the second outside audit: a stranger's first peer frame declaring
    # 1 MiB was buffered whole before anything was proved (200 connections: +223 MB).
    async with LoopbackCluster(LOCAL, 3, balancing=False, peer_timeout=60.0, max_payload=200_000) as cl:
        before = snapshot(cl)
        reader, writer = await asyncio.open_connection(*cl.addr(0))
        writer.write(PEER_MAGIC + HEADER.pack(1 << 20) + b"x" * 1000)
        msgs = peer_reader().feed(await read_to_end(reader))  # refused at once, not after peer_timeout
        writer.close()
        assert isinstance(msgs[-1], pm.PeerError) and msgs[-1].code == "protocol_error", msgs
        assert f"over the limit of {MAX_OPENING_FRAME}" in msgs[-1].message
        assert cl.nodes[0].core.stats["rejected_peer_protocol"] == 1
        assert snapshot(cl) == before
        # The members' links, whose frames past the opening may be as long as max_frame_size, carry a big event.
        sub = await (await cl.client(2)).subscribe("price < 100")
        await (await cl.client(0)).publish(EVENT, payload=b"p" * (MAX_OPENING_FRAME + 1))
        assert len((await sub.next(WAIT)).payload) == MAX_OPENING_FRAME + 1


async def test_a_stranger_refused_again_and_again_is_counted_each_time_and_logged_within_a_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Found by the second outside audit: each refusal was a WARNING line, and one
    # stranger's process wrote 800 a second (2000 connections: 2000 lines, 150-430 kB).
    caplog.set_level(logging.WARNING, logger="overlay.net")
    async with LoopbackCluster(LOCAL, 1, balancing=False) as cl:
        cl.nodes[0].refusal_log.every = 3600.0  # however slow the machine, every attempt falls in one period
        attempts = {
            "refused unauthenticated from": PEER_MAGIC + encode_frame(pm.PeerHello(9, "local")),
            "refused wrong_cluster from": PEER_MAGIC + encode_frame(pm.PeerAuth(1, "x", b"n" * pa.NONCE_BYTES)),
            "with unknown preamble": b"GET / HTTP/1.1\r\n\r\n",
            "misbehaved": PEER_MAGIC + HEADER.pack(1 << 20),
        }
        for payload in attempts.values():
            for _ in range(30):
                reader, writer = await asyncio.open_connection(*cl.addr(0))
                writer.write(payload)
                await read_to_end(reader)
                writer.close()
        assert refused(cl, Refusal.UNAUTHENTICATED) == refused(cl, Refusal.WRONG_CLUSTER) == 30
        stats = cl.nodes[0].core.stats
        assert stats["rejected_bad_preamble"] == stats["rejected_peer_protocol"] == 30
        # Within the period of the first, each kind's first refusal is its only line.
        assert {words: caplog.text.count(words) for words in attempts} == dict.fromkeys(attempts, 1)


# -- a peer message on a client connection --------------------------------------------------------


async def test_a_peer_message_on_a_client_connection_is_refused(
    tls_cluster: LoopbackCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cl = tls_cluster
    caplog.set_level(logging.WARNING, logger="overlay.net")
    before = snapshot(cl)
    reader, writer = await asyncio.open_connection(*cl.addr(0), ssl=cl.client_ssl)
    writer.write(CLIENT_MAGIC + encode_frame(cm.Hello("sneaky")))
    writer.write(encode_frame(pm.UpdateRoutingTable((), ())))  # a table update, as a peer would send it
    data = await read_to_end(reader)
    writer.close()
    assert data[:4] == CLIENT_MAGIC
    msgs = client_reader().feed(data[4:])
    assert isinstance(msgs[-1], cm.Error) and msgs[-1].fatal
    assert refused(cl, Refusal.PEER_MESSAGE_ON_CLIENT) == 1
    assert "refused peer_message_on_client from 127.0.0.1:" in caplog.text
    assert snapshot(cl) == before
