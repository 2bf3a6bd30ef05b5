"""gunicorn's gthread worker, made to keep answering while clients connect and stall.

gthread hands a new connection to a thread at once; the thread waits up to 5 s for bytes, and
once some arrive it parses the request with a blocking socket. So 64 connections that send
nothing hold the threads for seconds each, and 64 that send half a request hold them forever,
and the healthcheck gets no answer. Here the worker's event loop collects a request's head
(up to the blank line) itself, on non-blocking sockets, and only a complete head gets a thread;
a connection that sends nothing for HEAD_TIMEOUT seconds is closed. Threads then read bodies and
write answers with a kernel timeout (IO_TIMEOUT), so a client that stops sending its body or
stops reading the answer (an event stream) frees its thread too.

Written against gunicorn 27's gthread (its pending-connection list and TConn); TLS and HTTP/2
connections keep gthread's own path."""
import errno
import selectors
import socket
import struct
import time
from functools import partial

from gunicorn import http
from gunicorn.workers.gthread import TConn, ThreadWorker

HEAD_TIMEOUT = 10       # seconds a connection may go without sending a byte of its request head
HEAD_LIMIT = 64 * 1024  # bytes of head gathered before a thread takes over (gunicorn's limits apply)
IO_TIMEOUT = 30         # seconds a thread waits for one read or write on a client's socket


class Worker(ThreadWorker):

    def _own_path(self) -> bool:
        return not self.cfg.is_ssl and self.cfg.http2_cleartext not in ("prior-knowledge", "both")

    def accept(self, listener):
        if not self._own_path():
            return super().accept(listener)
        try:
            sock, client = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        timeout = struct.pack("ll", IO_TIMEOUT, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeout)
        conn = TConn(self.cfg, sock, client, listener.getsockname())   # non-blocking from here
        conn.head = b""
        self._await_head(conn)

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request: its head is gathered here too."""
        if not self._own_path():
            return super().on_client_socket_readable(conn, client)
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        conn.head = b""
        self._read_head(conn)

    def _await_head(self, conn):
        # the pending list is murdered in order of timeout: appending with now + HEAD_TIMEOUT keeps it so
        conn.timeout = time.monotonic() + HEAD_TIMEOUT
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_readable, conn))

    def _on_head_readable(self, conn, client):
        self.poller.unregister(client)
        self.pending_conns.remove(conn)
        self._read_head(conn)

    def _read_head(self, conn):
        try:
            data = conn.sock.recv(HEAD_LIMIT)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data == b"":   # the client went away before asking anything
            self.nr_conns -= 1
            conn.close()
            return
        conn.head += data or b""
        if b"\r\n\r\n" not in conn.head and len(conn.head) < HEAD_LIMIT:
            self._await_head(conn)
            return
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.parser.unreader.unread(conn.head)
        conn.head, conn.data_ready = b"", True
        self.enqueue_req(conn)
