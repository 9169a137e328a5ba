"""HTTP clients for calls from one process on behalf of every org: they keep no cookies.

``httpx.Client`` keeps the cookies its responses set and sends them on every later request.
A worker's clients call the memory service, the LLM and the embedder for every org in turn,
and the chat proxy's calls the upstream LLM for every org: a cookie one answer set (a CDN's
or a load balancer's, which LLM APIs do set) would ride along on the requests of every org
after it. Reading each
response for cookies also costs a parse of its URL and headers (about 3 % of a worker's
Python CPU on the pipeline's hot path, by profile). These clients neither store nor send
cookies.
"""

from __future__ import annotations

import email.parser
import http.client
import re
import select
import socket
import threading
import types
import urllib.request
from typing import Any, BinaryIO

import httpx

from core.config import redact_url
from core.errors import ConfigError


def endpoint_url(text: str, variable: str) -> httpx.URL:
    """``text`` parsed once, at start: httpx parses a URL given as a string again on every
    request (some 30 us). One it cannot parse (a port that is not a number) is a
    :class:`~core.errors.ConfigError` naming ``variable``, at start rather than at the first
    request; the message shows the URL without its password."""
    try:
        return httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ConfigError(
            f"{variable} is not a URL ({redact_url(text)}): {exc}", variable=variable
        ) from exc


class _NoCookies(httpx.Cookies):
    """A cookie jar that stays empty: what a response sets is dropped unread."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None

    def set(self, name: str, value: str, domain: str = "", path: str = "/") -> None:
        return None

    def update(self, cookies: Any = None) -> None:  # type: ignore[override]
        return None


class _KeepsNoCookies:
    """The ``cookies`` of a client that keeps none (first in the bases, before httpx's)."""

    _no_cookies: httpx.Cookies

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        _refuse_cookies(cookies)


def _refuse_cookies(cookies: Any) -> None:
    if cookies:
        raise ValueError("a cookieless client takes no cookies")


class CookielessClient(_KeepsNoCookies, httpx.Client):
    """An ``httpx.Client`` that neither keeps the cookies its responses set nor sends any.

    Without a ``transport`` of the caller's, its plain ``http://`` requests go over
    :class:`PlainHTTPTransport` (unless the environment names a proxy for them);
    ``https://`` and proxied requests keep httpx's own transport."""

    def __init__(self, **kwargs: Any) -> None:
        _refuse_cookies(kwargs.get("cookies"))
        if kwargs.get("transport") is None and "mounts" not in kwargs and not _http_proxied():
            kwargs["mounts"] = {"http://": PlainHTTPTransport()}
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()


def _http_proxied() -> bool:
    """Whether the environment names a proxy for plain HTTP (httpx would use it)."""
    proxies = urllib.request.getproxies_environment()
    return bool(proxies.get("http") or proxies.get("all"))


#: Idle connections a :class:`PlainHTTPTransport` keeps per host (httpx keeps 20).
MAX_IDLE_PER_HOST = 20


class PlainHTTPTransport(httpx.BaseTransport):
    """Plain HTTP/1.1 with keep-alive over :mod:`http.client`, for ``http://`` only.

    httpx's own transport (httpcore and h11) costs about three times the CPU of
    ``http.client`` per request (0.8 ms more on the benchmark machine), and a worker makes
    five requests a turn. This one sends what httpx built (its headers, whole body and
    timeouts) and reads the whole answer before handing it back; its errors are httpx's, as
    httpx's transport raises them, so callers tell timeouts, refused and dropped connections
    apart as before. An idle connection the server has closed (its keep-alive ended) is
    found before reuse and replaced."""

    def __init__(self, max_idle_per_host: int = MAX_IDLE_PER_HOST) -> None:
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._max_idle = max_idle_per_host
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"not plain http: {url.scheme}", request=request)
        timeouts = request.extensions.get("timeout") or {}
        address = (url.host, url.port or 80)
        body = request.read()
        conn = self._checkout(address, request, timeouts.get("connect"))
        try:
            response = self._exchange(conn, request, body, timeouts)
        except BaseException:
            conn.close()
            raise
        return response

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        request: httpx.Request,
        body: bytes,
        timeouts: dict[str, float | None],
    ) -> httpx.Response:
        sock = conn.sock
        assert sock is not None
        try:
            sock.settimeout(timeouts.get("write"))
            conn.putrequest(
                request.method,
                request.url.raw_path.decode("ascii"),
                skip_host=True,
                skip_accept_encoding=True,
            )
            for name, value in request.headers.raw:
                if name.lower() in (b"transfer-encoding", b"content-length"):
                    continue  # the body goes whole, with its length
                conn.putheader(name.decode("latin-1"), value.decode("latin-1"))
            if body or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
        except TimeoutError as exc:
            raise httpx.WriteTimeout(str(exc) or "write timed out", request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
        try:
            sock.settimeout(timeouts.get("read"))
            answer = conn.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
        except http.client.RemoteDisconnected as exc:
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            ) from exc
        except http.client.HTTPException as exc:
            raise httpx.RemoteProtocolError(
                str(exc) or type(exc).__name__, request=request
            ) from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
        if answer.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return httpx.Response(
            answer.status,
            headers=answer.getheaders(),
            content=content,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": answer.reason.encode("latin-1", "replace"),
            },
        )

    def _checkout(
        self, address: tuple[str, int], request: httpx.Request, connect_timeout: float | None
    ) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                idle = self._idle.get(address)
                conn = idle.pop() if idle else None
            if conn is None:
                break
            if _still_open(conn):
                return conn
            conn.close()
        conn = http.client.HTTPConnection(address[0], address[1], timeout=connect_timeout)
        conn.response_class = _Response
        try:
            conn.connect()
        except TimeoutError as exc:
            conn.close()
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except OSError as exc:
            conn.close()
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        address = (conn.host, conn.port)
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < self._max_idle:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


#: A header line the email parser would read as one ``name: value`` field and nothing else:
#: a name of the characters it allows (printable ASCII but the colon), the value on the same
#: line (no folding, no stray CR or LF), CRLF at the end.
_FIELD = re.compile(rb"([\x21-\x39\x3b-\x7e]+):[ \t]*([^\r\n]*)\r\n")
#: Header lines read per answer at most, and their length (http.client's limits).
_MAX_HEADERS = 100
_MAX_LINE = 65536


def parse_headers(
    fp: BinaryIO, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage
) -> http.client.HTTPMessage:
    """``http.client.parse_headers``, the same message from the same bytes, without the email
    parser for the usual answer (90-100 us of a request's CPU, cold, for six headers):
    when every line is a plain ``name: value`` field ending in CRLF, the fields are set as the
    parser sets them (its compat32 policy: the value's leading blanks dropped, the rest kept);
    anything else (a folded line, a line that is not a field, another line ending) goes to the
    email parser, as before. The same limits on lines and their length, the same errors."""
    lines: list[bytes] = []
    while True:
        line = fp.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("header line")
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {_MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            break
    if lines[-1] == b"\r\n":
        fields = [_FIELD.fullmatch(line) for line in lines[:-1]]
        if all(fields):
            message = _class()
            for field in fields:
                assert field is not None
                message.set_raw(field[1].decode("latin-1"), field[2].decode("latin-1"))
            message.set_payload("")
            return message
    return email.parser.Parser(_class=_class).parsestr(b"".join(lines).decode("iso-8859-1"))


class _Response(http.client.HTTPResponse):
    """The transport's answers: http.client's, with :func:`parse_headers` reading their
    headers. ``begin`` is http.client's own code (status line, length, keep-alive) run with
    :func:`parse_headers` in place of the module's: nothing of it is copied here."""

    begin = types.FunctionType(
        http.client.HTTPResponse.begin.__code__,
        {**vars(http.client), "parse_headers": parse_headers},
        "begin",
    )


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection can carry a request: readable means the server
    closed it (or sent what no request asked for)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class CookielessAsyncClient(_KeepsNoCookies, httpx.AsyncClient):
    """An ``httpx.AsyncClient`` that neither keeps the cookies its responses set nor sends any."""

    def __init__(self, **kwargs: Any) -> None:
        _refuse_cookies(kwargs.get("cookies"))
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()


__all__ = ["CookielessAsyncClient", "CookielessClient", "PlainHTTPTransport"]
