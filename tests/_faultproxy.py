"""A local TCP proxy for fault tests: ``127.0.0.1:<port>`` forwards to a target until told to
``blackhole()`` (bytes are then held, nothing is forwarded, new connections hear nothing) and
forwards again after ``resume()`` (held bytes first, in order). Threads, no timing."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``target``; ``blackhole()`` and ``resume()`` at will."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._open = threading.Event()  # set: forwarding
        self._open.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def blackhole(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self._open.set()  # release the pumps, which then see the sockets closed
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in [self._listener, *sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                self._open.wait()  # blackholed: nothing read, nothing forwarded
                data = source.recv(65536)
                if not data:
                    break
                self._open.wait()  # blackholed while reading: held until resumed
                if self._closed:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@contextmanager
def fault_proxy(target: tuple[str, int]) -> Iterator[FaultProxy]:
    proxy = FaultProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
