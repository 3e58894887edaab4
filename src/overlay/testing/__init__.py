"""Test helpers: real overlay nodes on loopback, in the test's own process.

As ``trio.testing`` ships with trio, this ships with overlay, so the test
suite, ``bench/`` and an application's own tests start clusters the same way::

    from overlay.config import load_config
    from overlay.testing import LoopbackCluster, wait_until

    async with LoopbackCluster(load_config("cluster.toml"), 3, balancing=False) as cl:
        sub = await (await cl.client(1)).subscribe("price < 100")
        await (await cl.client(0)).publish({"price": 1.0, "sym": "A"})
        note = await sub.next(5.0)
        await cl.stop_node(2)
        await wait_until(lambda: 2 not in cl.nodes[0].core.peers, what="node 2 gone")

What is here:

* ``LoopbackCluster`` — n ``overlay.net.node.Node``s on ephemeral 127.0.0.1
  ports: admin HTTP ports, capacities, config overrides (``override``),
  capture; stop, crash, restart or join a node; ``Client``, ``AgentClient``
  and ``RawClient`` connections; counters, journals, quietness.
  ``LOADED_SUSPECT_TIMEOUT`` for a test that loads its nodes hard and is not
  about failure detection.
* ``RawClient`` — the client protocol spoken directly (key, rank, group,
  weight and load factor set by the test).
* ``CoreLink`` (``overlay.testing.corelink``) — node cores joined by
  deterministic in-memory links, no event loop: the core-pair harness.
* ``MemoryLink`` (``overlay.testing.memory_link``) — one direction between
  two node cores held in memory, for harnesses that drive ``NodeCore``s
  without sockets (the core-pair links and the simulator of SPEC §15).
* ``Mutator``, ``samples`` — one valid message of every wire type over a
  schema, and their mutations (absurd field values, cut and rewritten
  frames) for the fuzzers (``tests/test_fuzz_*.py``, ``bench/fuzz.py``).
* ``wait_until``, ``wait_progressing``, ``nodes_quiet``, ``bound_socket``, ``free_ports`` — bounded
  condition waits and loopback sockets; ``insecure_tls``, ``dev_tls`` — how
  test nodes talk (plain TCP with a secret, or TLS with development
  certificates), ``tls_toml``/``with_tls_table`` for a config file of
  them; ``dial_peer``, ``accept_peer`` — a test playing a node on
  a peer link, opening it as nodes do (SPEC §16).
* ``Ledger``/``Sub`` — the exactly-once ledger of SPEC §8.2;
  ``Traffic``, ``skewed_price``, ``range_subscriptions`` — skewed load that
  makes a cluster balance.
* ``NodeProcesses``, ``write_cluster_config`` — ``overlay node`` processes of
  a generated config, killed (SIGKILL), paused (SIGSTOP) and started again,
  their logs read; ``Partition`` — one of them cut off in a network
  namespace of its own (root only); ``Audit`` with ``publish_steadily`` and
  ``consume`` — every acknowledged (event, subscription) pair delivered
  exactly once across a node's failure (SPEC §16).
"""

from overlay.testing._audit import Audit, Verdict, consume, publish_steadily
from overlay.testing._cluster import LOADED_SUSPECT_TIMEOUT, LoopbackCluster, override
from overlay.testing._ledger import Ledger, Sub
from overlay.testing._loopback import (
    LOOPBACK_SECRET,
    WAIT,
    bound_socket,
    dev_tls,
    free_ports,
    insecure_tls,
    nodes_quiet,
    tls_toml,
    wait_progressing,
    wait_until,
    with_tls_table,
)
from overlay.testing._mutate import Mutator, samples
from overlay.testing._peer import accept_peer, dial_peer
from overlay.testing._processes import NodeProcesses, Partition, log_time, write_cluster_config
from overlay.testing._raw_client import RawClient
from overlay.testing._traffic import (
    GOLDEN,
    QUEUE_SIZE,
    Traffic,
    bench_event,
    load_ranges,
    price_bands,
    range_subscriptions,
    skewed_price,
)
from overlay.testing.memory_link import MemoryLink

__all__ = [
    "GOLDEN",
    "LOADED_SUSPECT_TIMEOUT",
    "LOOPBACK_SECRET",
    "QUEUE_SIZE",
    "WAIT",
    "Audit",
    "Ledger",
    "LoopbackCluster",
    "MemoryLink",
    "Mutator",
    "NodeProcesses",
    "Partition",
    "RawClient",
    "Sub",
    "Traffic",
    "Verdict",
    "accept_peer",
    "bench_event",
    "bound_socket",
    "consume",
    "dev_tls",
    "dial_peer",
    "free_ports",
    "insecure_tls",
    "load_ranges",
    "log_time",
    "nodes_quiet",
    "override",
    "price_bands",
    "publish_steadily",
    "range_subscriptions",
    "samples",
    "skewed_price",
    "tls_toml",
    "wait_progressing",
    "wait_until",
    "with_tls_table",
    "write_cluster_config",
]
