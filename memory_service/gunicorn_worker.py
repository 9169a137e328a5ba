"""The gunicorn worker class of the ``web`` process: gthread, with two changes.

1. A request is read in full (its head, and its body up to the body limit) by the worker's
   event loop, without a thread, before a thread is given to it. gunicorn's gthread worker
   hands a connection to a thread as soon as it is accepted (or, kept alive, as soon as it is
   readable) and the thread then blocks on the socket while the client sends the rest; a
   handful of clients that send their headers and stall their bodies hold every thread, and
   health checks and real requests queue behind them. Buffered in the event loop, a stalled
   client costs a file descriptor and its bytes so far, and is answered 408 and closed once
   ``WEB_REQUEST_TIMEOUT_SECONDS`` have passed without the whole request.
2. The answers gunicorn gives on its own (a request line or header it cannot parse or that is
   over its limits, a control character in a header, a bad chunk) are in the service's JSON
   error format, never gunicorn's HTML page, and always 4xx for a client's mistake.

TLS and HTTP/2 prior-knowledge connections (neither is used behind the platform's router) are
left to gthread as they are. The class relies on gthread's internals (``TConn``, the poller,
``keepalived_conns``), hence the pin on gunicorn's major version.
"""

from __future__ import annotations

import contextlib
import errno
import re
import selectors
import socket
import time
from collections import deque
from datetime import timedelta
from functools import partial
from typing import Any

from gunicorn import util
from gunicorn.http import errors as http_errors
from gunicorn.http.message import Request
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import TConn, ThreadWorker

from core.config import Settings
from memory_service.errors import error_body

#: The largest request head (request line and headers) read; beyond it: 431.
MAX_HEAD_BYTES = 64 * 1024
RECV_BYTES = 64 * 1024

_HEAD_END = re.compile(rb"\r?\n\r?\n")

#: gunicorn's own parse errors, by the answer they get: (status, reason, code).
CLIENT_ERRORS: tuple[tuple[type[Exception], int, str, str], ...] = (
    (http_errors.LimitRequestLine, 414, "URI Too Long", "URI_TOO_LONG"),
    (http_errors.LimitRequestHeaders, 431, "Request Header Fields Too Large", "HEADERS_TOO_LARGE"),
    (http_errors.ExpectationFailed, 417, "Expectation Failed", "EXPECTATION_FAILED"),
    (http_errors.ForbiddenProxyRequest, 403, "Forbidden", "FORBIDDEN"),
    (http_errors.ParseException, 400, "Bad Request", "BAD_REQUEST"),
)
#: Parse errors that are the app's or the configuration's fault, not the client's.
SERVER_FAULTS = (
    http_errors.InvalidResponseHeader,
    http_errors.InvalidResponseHeaderName,
    http_errors.ConfigurationProblem,
)


def error_response(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 answer with the JSON error body; the connection is closed after it."""
    body = error_body(code, message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def classify(exc: BaseException) -> tuple[int, str, str, str]:
    """The (status, reason, code, message) of an error gunicorn raised for a request."""
    message = str(exc)[:200] or type(exc).__name__
    if isinstance(exc, SERVER_FAULTS):
        return 500, "Internal Server Error", "INTERNAL_ERROR", "internal error"
    for kind, status, reason, code in CLIENT_ERRORS:
        if isinstance(exc, kind):
            return status, reason, code, message
    if isinstance(exc, ValueError | UnicodeError):  # undecodable bytes in the request
        return 400, "Bad Request", "BAD_REQUEST", message
    return 500, "Internal Server Error", "INTERNAL_ERROR", "internal error"


def _chunked_complete(body: bytes, limit: int) -> bool:
    """Whether a chunked body is all there (or is already over ``limit``, or malformed: the
    parser or the app answers then, from what is buffered)."""
    pos = total = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            return len(body) - pos > 1024  # a chunk-size line this long is malformed
        try:
            size = int(body[pos:eol].split(b";", 1)[0].strip(), 16)
        except ValueError:
            return True
        if size == 0:
            return body.startswith(b"\r\n", eol + 2) or body.find(b"\r\n\r\n", eol) >= 0
        total += size
        if total > limit:
            return True
        pos = eol + 2 + size + 2
        if pos > len(body):
            return False


def request_complete(buffered: bytes, body_limit: int) -> bool | None:
    """Whether ``buffered`` holds a whole request (head, and body up to ``body_limit + 1``
    bytes); None when its head is already over ``MAX_HEAD_BYTES``."""
    match = _HEAD_END.search(buffered)
    if match is None:
        return None if len(buffered) > MAX_HEAD_BYTES else False
    if match.start() > MAX_HEAD_BYTES:
        return None
    head = buffered[: match.start()].decode("latin-1").lower()
    body = buffered[match.end() :]
    length: str | None = None
    chunked = False
    for line in head.splitlines()[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name == "expect" and value == "100-continue":
            return True  # the client waits for gunicorn's "100 Continue" before its body
        if name == "transfer-encoding" and "chunked" in value:
            chunked = True
        elif name == "content-length":
            length = value
    if chunked:
        return _chunked_complete(body, body_limit)
    if length is None:
        return True
    try:
        wanted = int(length)
    except ValueError:
        return True  # the parser rejects it
    if wanted > body_limit:
        return True  # the app answers 413 without reading it
    return len(body) >= wanted


class BufferingThreadWorker(ThreadWorker):
    """gthread that reads whole requests in its event loop and answers errors in JSON."""

    def init_process(self) -> None:
        settings = Settings.from_env()
        self.body_limit = settings.memory_max_body_bytes
        #: How long a client has to send a whole request, from the accept (or, kept alive,
        #: from its next request's first byte).
        self.read_seconds = float(settings.web_request_timeout_seconds)
        self.reading_conns: deque[Any] = deque()
        super().init_process()

    # -- reading requests in the event loop ------------------------------------------------

    def _bufferable(self, conn: Any) -> bool:
        return not self.cfg.is_ssl and not negotiation.prior_knowledge_allowed(
            self.cfg, conn.client
        )

    def accept(self, listener: socket.socket) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())
        if self._bufferable(conn):
            self._start_reading(conn)
        else:
            client_sock.setblocking(True)
            self.enqueue_req(conn)

    def on_client_socket_readable(self, conn: Any, client: socket.socket) -> None:
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        if self._bufferable(conn):
            self._start_reading(conn)
        else:
            self.enqueue_req(conn)

    def _start_reading(self, conn: Any) -> None:
        conn.sock.setblocking(False)
        conn.request_bytes = b""
        conn.timeout = time.monotonic() + self.read_seconds
        self.reading_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _stop_reading(self, conn: Any) -> None:
        self.reading_conns.remove(conn)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)

    def _on_readable(self, conn: Any, client: socket.socket) -> None:
        try:
            data = client.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before sending a whole request
            self._stop_reading(conn)
            self._close(conn)
            return
        conn.request_bytes += data
        complete = request_complete(conn.request_bytes, self.body_limit)
        if complete is False:
            return
        self._stop_reading(conn)
        if complete is None:
            self._refuse(
                conn,
                431,
                "Request Header Fields Too Large",
                "HEADERS_TOO_LARGE",
                f"the request line and headers must be at most {MAX_HEAD_BYTES} bytes",
            )
            return
        conn.init()  # blocking again; builds the HTTP/1 parser (no I/O without TLS)
        conn.parser.unreader.unread(conn.request_bytes)
        conn.request_bytes = b""
        self.enqueue_req(conn)

    def _refuse(self, conn: Any, status: int, reason: str, code: str, message: str) -> None:
        with contextlib.suppress(OSError):
            util.write_nonblock(conn.sock, error_response(status, reason, code, message))
        self._close(conn)

    def _close(self, conn: Any) -> None:
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """Also answer 408 to, and close, the connections whose request is overdue."""
        super().murder_pending()
        now = time.monotonic()
        while self.reading_conns and self.reading_conns[0].timeout <= now:
            conn = self.reading_conns[0]
            self._stop_reading(conn)
            self._refuse(
                conn,
                408,
                "Request Timeout",
                "REQUEST_TIMEOUT",
                f"the request was not sent within {self.read_seconds:g} s",
            )

    # -- gunicorn's own answers, in JSON ---------------------------------------------------

    def handle_error(self, req: Any, client: socket.socket, addr: Any, exc: BaseException) -> None:
        status, reason, code, message = classify(exc)
        addr = addr or ("", -1)
        if status < 500:
            self.log.warning("Invalid request from ip=%s: %s", addr[0], exc)
            if req is None and isinstance(getattr(exc, "req", None), Request):
                req = getattr(exc, "req")  # noqa: B009 (for the access log)
        else:
            self.log.exception("Error handling request")
        if req is not None:
            environ = default_environ(req, client, self.cfg)
            environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = addr[0], str(addr[1])
            resp = Response(req, client, self.cfg)
            resp.status = f"{status} {reason}"
            resp.response_length = 0
            self.log.access(resp, req, environ, timedelta(0))
        try:
            util.write_nonblock(client, error_response(status, reason, code, message))
        except Exception:
            self.log.debug("Failed to send error message.")
