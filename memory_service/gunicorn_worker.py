"""The gunicorn worker class of the ``web`` process: gthread, with two changes.

1. A request is read in full (its head, and its body up to the body limit) by the worker's
   event loop, without a thread, before a thread is given to it. gunicorn's gthread worker
   hands a connection to a thread as soon as it is accepted (or, kept alive, as soon as it is
   readable) and the thread then blocks on the socket while the client sends the rest; a
   handful of clients that send their headers and stall their bodies hold every thread, and
   health checks and real requests queue behind them. Buffered in the event loop, a stalled
   client costs a file descriptor and its bytes so far, and is answered 408 and closed once
   ``WEB_REQUEST_TIMEOUT_SECONDS`` have passed without the whole request. The event loop also
   answers ``Expect: 100-continue`` itself (``100 Continue``, then it keeps buffering the body
   under the same deadline) and refuses a body over the limit (a ``Content-Length`` over it,
   or chunks that add up past it) with 413 and ``Connection: close`` as soon as it knows,
   without reading the body. A thread's socket also has a kernel read and send timeout of
   ``WEB_REQUEST_TIMEOUT_SECONDS`` (``SO_RCVTIMEO``/``SO_SNDTIMEO``), a second line of defence
   should a thread ever wait on a client.
2. The answers gunicorn gives on its own (a request line or header it cannot parse or that is
   over its limits, a control character in a header, a bad chunk) are in the service's JSON
   error format, never gunicorn's HTML page, and always 4xx for a client's mistake. Neither
   the log line nor the answer repeats a header's value (it may carry a credential: a line
   ``Authorization Bearer ...`` without its colon is such a mistake).

The worker process also shortens its thread switch interval (:mod:`core.threads`).

TLS and HTTP/2 prior-knowledge connections (neither is used behind the platform's router) are
left to gthread as they are. The class relies on gthread's internals (``TConn``, the poller,
``keepalived_conns``), hence the pin on gunicorn's major version.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import re
import selectors
import socket
import struct
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
from core.threads import switch_often
from schema.bodies import error_body

#: The largest request head (request line and headers) read; beyond it: 431.
MAX_HEAD_BYTES = 64 * 1024
RECV_BYTES = 64 * 1024

#: How long a refused connection is read (and the bytes dropped) after its answer, so that
#: closing it with unread bytes does not reset it before the client has read the answer.
LINGER_SECONDS = 2.0
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_EXPECT_CONTINUE = re.compile(rb"(?im)^expect[ \t]*:[ \t]*100-continue[ \t]*\r?\n")


class Verdict(enum.Enum):
    """What the event loop does with the bytes of a request buffered so far."""

    INCOMPLETE = "incomplete"  # keep reading
    COMPLETE = "complete"  # hand it to a thread
    HEAD_TOO_LARGE = "head too large"  # 431
    BODY_TOO_LARGE = "body too large"  # 413


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


#: gunicorn's errors whose text quotes a header line or value (which may be a credential).
HEADER_ERRORS = (
    http_errors.InvalidHeader,
    http_errors.InvalidHeaderName,
    http_errors.ObsoleteFolding,
)


_HEADER_NAME = re.compile(r"[A-Z0-9!#$%&'*+.^_`|~-]{1,64}")


def describe(exc: BaseException) -> str:
    """A parse error, fit for the log and the answer. A bad header is named only when gunicorn
    reports its parsed name (upper case, a token), never by a line or a value it quotes: a
    line without its colon, such as ``Authorization Bearer ibex_...``, is reported whole."""
    if isinstance(exc, HEADER_ERRORS):
        hdr = str(getattr(exc, "hdr", "") or "")
        named = not isinstance(exc, http_errors.InvalidHeaderName) and _HEADER_NAME.fullmatch(hdr)
        return f"invalid header {hdr}" if named else "invalid header line"
    return str(exc)[:200] or type(exc).__name__


def classify(exc: BaseException) -> tuple[int, str, str, str]:
    """The (status, reason, code, message) of an error gunicorn raised for a request."""
    message = describe(exc)
    if isinstance(exc, SERVER_FAULTS):
        return 500, "Internal Server Error", "INTERNAL_ERROR", "internal error"
    for kind, status, reason, code in CLIENT_ERRORS:
        if isinstance(exc, kind):
            return status, reason, code, message
    if isinstance(exc, ValueError | UnicodeError):  # undecodable bytes in the request
        return 400, "Bad Request", "BAD_REQUEST", message
    return 500, "Internal Server Error", "INTERNAL_ERROR", "internal error"


def _chunked_verdict(body: bytes, limit: int) -> Verdict:
    """Whether a chunked body is all there, or over ``limit``; a malformed one is complete
    (the parser answers it, from what is buffered)."""
    pos = total = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:  # a chunk-size line this long is malformed
            return Verdict.COMPLETE if len(body) - pos > 1024 else Verdict.INCOMPLETE
        try:
            size = int(body[pos:eol].split(b";", 1)[0].strip(), 16)
        except ValueError:
            return Verdict.COMPLETE
        if size == 0:
            done = body.startswith(b"\r\n", eol + 2) or body.find(b"\r\n\r\n", eol) >= 0
            return Verdict.COMPLETE if done else Verdict.INCOMPLETE
        total += size
        if total > limit:
            return Verdict.BODY_TOO_LARGE
        pos = eol + 2 + size + 2
        if pos > len(body):
            return Verdict.INCOMPLETE


def request_verdict(buffered: bytes, body_limit: int) -> tuple[Verdict, bool]:
    """What to do with ``buffered``, the bytes of a request so far (its head, and its body up
    to ``body_limit`` bytes), and whether the request expects ``100 Continue`` (HTTP/1.1 and
    ``Expect: 100-continue``) before its body."""
    match = _HEAD_END.search(buffered)
    if match is None:
        too_large = len(buffered) > MAX_HEAD_BYTES
        return (Verdict.HEAD_TOO_LARGE if too_large else Verdict.INCOMPLETE), False
    if match.start() > MAX_HEAD_BYTES:
        return Verdict.HEAD_TOO_LARGE, False
    lines = buffered[: match.start()].decode("latin-1").lower().splitlines()
    body = buffered[match.end() :]
    length: str | None = None
    chunked = expects_continue = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name == "expect" and value == "100-continue":
            expects_continue = bool(lines) and lines[0].rstrip().endswith("http/1.1")
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
        elif name == "content-length":
            length = value
    if chunked:
        return _chunked_verdict(body, body_limit), expects_continue
    if length is None:
        return Verdict.COMPLETE, expects_continue
    try:
        wanted = int(length)
    except ValueError:
        return Verdict.COMPLETE, False  # the parser rejects it
    if wanted > body_limit:
        return Verdict.BODY_TOO_LARGE, expects_continue
    return (Verdict.COMPLETE if len(body) >= wanted else Verdict.INCOMPLETE), expects_continue


def without_expect_continue(request: bytes) -> bytes:
    """The request without its ``Expect: 100-continue`` line (answered already by the event
    loop: gunicorn would send a second ``100 Continue``)."""
    match = _HEAD_END.search(request)
    if match is None:
        return request
    head = _EXPECT_CONTINUE.sub(b"", request[: match.start()] + b"\r\n", count=1)
    return head[:-2] + request[match.start() :]


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))


class BufferingThreadWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn has no types
    """gthread that reads whole requests in its event loop and answers errors in JSON."""

    def init_process(self) -> None:
        # Before the event loop starts: a thread back from Redis or Postgres (and the loop
        # back from its poll) takes the GIL back within 1 ms, not Python's 5 (core.threads).
        switch_often()
        settings = Settings.from_env()
        self.body_limit = settings.memory_max_body_bytes
        #: How long a client has to send a whole request, from the accept (or, kept alive,
        #: from its next request's first byte).
        self.read_seconds = float(settings.web_request_timeout_seconds)
        self.reading_conns: deque[Any] = deque()
        #: Refused connections, read (and dropped) until their client closes or for
        #: ``LINGER_SECONDS``.
        self.lingering_conns: deque[Any] = deque()
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
        # A thread that ever waits on this client gives up after the request deadline; in
        # the event loop (non-blocking) these timeouts play no part.
        with contextlib.suppress(OSError):
            timeout = _timeval(self.read_seconds)
            client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
            client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeout)
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
            # Readable now: read at once, not after another turn of the loop (a kept-alive
            # request is usually whole in one read, and goes to a thread from here).
            self._on_readable(conn, client)
        else:
            self.enqueue_req(conn)

    def finish_request(self, conn: Any, fs: Any) -> None:
        """As gthread, except that a kept-alive connection whose next request was read ahead
        (pipelined behind the last one) is buffered again, never handed to a thread with only
        part of that request."""
        if (
            self.alive
            and not fs.cancelled()
            and fs.exception() is None
            and fs.result() is True
            and conn.parser is not None
            and self._bufferable(conn)
            and conn.parser.unreader.buf.getvalue()
        ):
            ahead = conn.parser.unreader.take_buffered()
            self._start_reading(conn, ahead)
            self._advance(conn)
            return
        super().finish_request(conn, fs)

    def _start_reading(self, conn: Any, ahead: bytes = b"") -> None:
        conn.sock.setblocking(False)
        conn.request_bytes = ahead
        conn.continued = False
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
        self._advance(conn)

    def _advance(self, conn: Any) -> None:
        """Act on what ``conn`` has buffered: wait for more, answer, or hand it to a thread."""
        verdict, expects_continue = request_verdict(conn.request_bytes, self.body_limit)
        if verdict is Verdict.INCOMPLETE:
            if expects_continue and not conn.continued:
                conn.continued = True
                try:
                    util.write_nonblock(conn.sock, CONTINUE)
                except OSError:
                    self._stop_reading(conn)
                    self._close(conn)
            return
        self._stop_reading(conn)
        if verdict is Verdict.HEAD_TOO_LARGE:
            self._refuse(
                conn,
                431,
                "Request Header Fields Too Large",
                "HEADERS_TOO_LARGE",
                f"the request line and headers must be at most {MAX_HEAD_BYTES} bytes",
            )
            return
        if verdict is Verdict.BODY_TOO_LARGE:
            self._refuse(
                conn,
                413,
                "Content Too Large",
                "BODY_TOO_LARGE",
                f"the body must be at most {self.body_limit} bytes (MEMORY_MAX_BODY_BYTES)",
            )
            return
        request = conn.request_bytes
        if expects_continue:
            request = without_expect_continue(request)
        conn.request_bytes = b""
        conn.init()  # blocking again; builds the HTTP/1 parser (no I/O without TLS)
        conn.parser.unreader.unread(request)
        self.enqueue_req(conn)

    def _refuse(self, conn: Any, status: int, reason: str, code: str, message: str) -> None:
        """Answer, close our side, and drop what the client still sends for a while (closing
        with unread bytes would reset the connection, and the client might lose the answer)."""
        try:
            util.write_nonblock(conn.sock, error_response(status, reason, code, message))
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.timeout = time.monotonic() + LINGER_SECONDS
        self.lingering_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_lingering, conn))

    def _on_lingering(self, conn: Any, client: socket.socket) -> None:
        try:
            data = client.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._stop_lingering(conn)

    def _stop_lingering(self, conn: Any) -> None:
        self.lingering_conns.remove(conn)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
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
        while self.lingering_conns and self.lingering_conns[0].timeout <= now:
            self._stop_lingering(self.lingering_conns[0])

    # -- gunicorn's own answers, in JSON ---------------------------------------------------

    def handle_error(self, req: Any, client: socket.socket, addr: Any, exc: BaseException) -> None:
        status, reason, code, message = classify(exc)
        addr = addr or ("", -1)
        if status < 500:
            self.log.warning("Invalid request from ip=%s: %s", addr[0], message)
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
