"""The capture writer: the asyncio side of ``overlay.capture`` (SPEC §13, §14).

Rules:

1. One file per node per run: ``<capture_dir>/node-<id>.ndjson``.  A file
   left there by an earlier run is renamed ``….ndjson.old`` (never
   overwritten), so ``overlay replay`` of the directory sees one run.
2. The header is the first line; then every ``FLUSH_SECONDS`` the writer takes
   the buffer's pending chunks (already encoded by the buffer, in the loop,
   a few hundred records at a time) and writes them in a worker thread, so the
   dispatcher never waits on the disk — and the thread only does I/O, which
   releases the GIL.  One batch is written at a time (a lock), so the final
   ``close()`` cannot interleave with a batch still in its thread.
3. ``close()`` (the node's clean shutdown) writes what is left and the ``end``
   record, then closes the file.  A node killed without shutdown leaves a
   file with no ``end`` record; the replay says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import BinaryIO, Final

import msgspec

from overlay.capture import CaptureBuffer, End, capture_file_name, header_for
from overlay.config import ClusterConfig

__all__ = ["FLUSH_SECONDS", "CaptureWriter"]

log = logging.getLogger("overlay.capture")

# Half a second: batches of a few thousand records at full rate, and at most
# half a second of records lost if the process dies without shutdown.
FLUSH_SECONDS: Final = 0.5
# Userspace buffer of the file: one batch usually fits, so a batch is one syscall.
FILE_BUFFER: Final = 1 << 20


class CaptureWriter:
    """Writes one node's capture (rules 1–3); ``buffer`` is what the core appends to."""

    def __init__(
        self, config: ClusterConfig, node_id: int, directory: str | os.PathLike[str], *, run: str | None = None
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.dir = Path(directory)
        self.path = self.dir / capture_file_name(node_id)
        self.run_name = run or self.dir.name
        self.buffer = CaptureBuffer(node_id, payloads=config.cluster.capture_payload)
        self.written = 0
        self._lock = threading.Lock()
        self._fh: BinaryIO | None = None

    def open(self, now: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            old = self.path.with_name(self.path.name + ".old")
            log.warning("node %d: capture %s exists; moved to %s", self.node_id, self.path, old.name)
            os.replace(self.path, old)
        # Open from here to close(), across the node's run (rule 3): no block holds it.
        self._fh = open(self.path, "wb", buffering=FILE_BUFFER)  # noqa: SIM115 — closed by close()
        self._write([msgspec.json.encode(header_for(self.config, self.node_id, self.run_name, now)) + b"\n"], 1)
        log.info("node %d: capturing to %s", self.node_id, self.path)

    def _write(self, chunks: list[bytes], records: int) -> None:
        with self._lock:
            if self._fh is None:
                return
            self._fh.writelines(chunks)
            self._fh.flush()
            self.written += records

    async def run(self) -> None:
        """Rule 2; cancelled by the node's TaskGroup at shutdown."""
        buf = self.buffer
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            records = buf.pending
            if records:
                await asyncio.to_thread(self._write, buf.take(), records)

    def close(self, now: float) -> None:
        """Rule 3."""
        if self._fh is None:
            return
        buf = self.buffer
        records = buf.pending
        chunks = buf.take()
        buf.n += 1
        end = End(self.node_id, buf.n, now, self.written + records + 1, buf.dropped)
        chunks.append(msgspec.json.encode(end) + b"\n")
        self._write(chunks, records + 1)
        with self._lock:
            self._fh.close()
            self._fh = None
        if buf.dropped:
            log.warning("node %d: capture dropped %d records (writer too slow)", self.node_id, buf.dropped)
        log.info("node %d: capture closed, %d records in %s", self.node_id, self.written, self.path)
