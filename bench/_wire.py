"""Database round trips, counted on the wire: a proxy between a client and Postgres that reads what the
client sends (bench/turn_overhead.py reports a turn's round trips with it; tests/test_round_trips.py holds
a turn to its count).

``with RoundTrips(url) as wire:`` listens on a Unix socket of its own and relays every connection made to
``wire.url`` to the server at ``url``, byte for byte. On the way it splits the client's stream into
protocol messages (a type byte and a length each) and counts the ones that make the client wait for the
server:

* ``Q`` (a simple query) and ``S`` (Sync, the end of an extended-protocol batch) each count one. A
  statement sent outside a pipeline is Parse/Bind/Describe/Execute/Sync: one. A whole ``conn.pipeline()``
  batch up to its sync is one, however many statements it holds, BEGIN and COMMIT included; outside a
  pipeline, BEGIN and COMMIT are statements of their own and count one each.
* ``H`` (Flush) counts one unless it follows a Sync directly: psycopg sends a Flush when a cursor needs its
  rows before the pipeline's sync (a wait in the middle of a pipeline), and a Sync then a Flush at the end
  of a pipeline, before it waits once.

Parse, Bind, Describe and Execute alone never make the server answer (it answers at the Sync or Flush that
follows), so they are not waits. ``wire.count`` is the total since the last ``wire.reset()`` over every
connection through the proxy. The count is of messages, so it does not depend on timing; the proxy adds
latency, so nothing timed should go through it.
"""

from __future__ import annotations

import socket
import tempfile
import threading
from pathlib import Path
from types import TracebackType

_SIMPLE_QUERY, _SYNC, _FLUSH = ord("Q"), ord("S"), ord("H")
_PROTOCOL_3 = 3 << 16  # a StartupMessage's version; SSLRequest, GSSENCRequest and CancelRequest have others


class _Frontend:
    """The client's half of one connection: cuts the byte stream into messages and counts the waits."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._started = False  # before the StartupMessage, messages have no type byte
        self._last = 0

    def feed(self, data: bytes) -> int:
        """Take the next bytes the client sent; the round trips the messages completed by them ask for."""
        self._buffer += data
        waits = 0
        while (kind := self._next_message()) is not None:
            if kind in (_SIMPLE_QUERY, _SYNC) or (kind == _FLUSH and self._last != _SYNC):
                waits += 1
            self._last = kind
        return waits

    def _next_message(self) -> int | None:
        """Remove one whole message from the buffer and return its type (0 for an untyped one); None when the
        buffer holds no whole message yet."""
        buf = self._buffer
        offset = 1 if self._started else 0
        if len(buf) < offset + 4:
            return None
        end = offset + int.from_bytes(buf[offset:offset + 4], "big")
        if len(buf) < end:
            return None
        kind = buf[0] if self._started else 0
        if not self._started and len(buf) >= 8 and int.from_bytes(buf[4:8], "big") == _PROTOCOL_3:
            self._started = True
        del buf[:end]
        return kind


def _upstream_address(url: str) -> tuple[socket.AddressFamily, str | tuple[str, int], dict[str, str]]:
    """Where the server at ``url`` listens, and the URL's other parameters."""
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    host = params.pop("host", "")
    address = params.pop("hostaddr", "") or host
    port = params.pop("port", "") or "5432"
    if not address or "," in address or "," in port:
        raise ValueError("RoundTrips needs one explicit host (a socket directory or a TCP host)")
    if address.startswith("/"):
        return socket.AF_UNIX, f"{address}/.s.PGSQL.{port}", params
    return socket.AF_INET, (address, int(port)), params


class RoundTrips:
    """A counting proxy to the server at ``url`` (see the module's docstring); connect to ``self.url``."""

    def __init__(self, url: str):
        from psycopg.conninfo import make_conninfo

        self._family, self._upstream, params = _upstream_address(url)
        self._folder = tempfile.TemporaryDirectory(prefix="eros-wire-")
        port = 5432
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(Path(self._folder.name) / f".s.PGSQL.{port}"))
        self._listener.listen()
        self._listener.settimeout(0.1)
        self.url = make_conninfo("", **params, host=self._folder.name, port=str(port))
        self._lock = threading.Lock()
        self._count = 0
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="wire-accept", daemon=True)]
        self._threads[0].start()

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def reset(self) -> None:
        with self._lock:
            self._count = 0

    def _add(self, waits: int) -> None:
        if waits:
            with self._lock:
                self._count += waits

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            server = socket.socket(self._family, socket.SOCK_STREAM)
            server.connect(self._upstream)
            self._sockets += [client, server]
            for args in ((client, server, _Frontend()), (server, client, None)):
                thread = threading.Thread(target=self._pump, args=args, name="wire-pump", daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, target: socket.socket, frontend: _Frontend | None) -> None:
        """Relay one direction until it ends; the client's direction is counted before it is relayed (so a
        wait is counted before the server can answer it)."""
        try:
            while data := source.recv(65536):
                if frontend is not None:
                    self._add(frontend.feed(data))
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(5)
        self._folder.cleanup()

    def __enter__(self) -> RoundTrips:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
