"""HTTP clients for calls from one process on behalf of every org: they keep no cookies.

``httpx.Client`` keeps the cookies its responses set and sends them on every later request.
A worker's clients call the memory service, the LLM and the embedder for every org in turn,
the chat proxy's calls the upstream LLM for every org, and the MCP server's calls the memory
service for every token: a cookie one answer set (a CDN's or a load balancer's, which LLM
APIs do set) would ride along on the requests of every org and token after it. Reading each
response for cookies also costs a parse of its URL and headers (about 3 % of a worker's
Python CPU on the pipeline's hot path, by profile). These clients neither store nor send
cookies.
"""

from __future__ import annotations

from typing import Any

import httpx


class _NoCookies(httpx.Cookies):
    """A cookie jar that stays empty: what a response sets is dropped unread."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None

    def set(self, name: str, value: str, domain: str = "", path: str = "/") -> None:
        return None


class CookielessClient(httpx.Client):
    """An ``httpx.Client`` that neither keeps the cookies its responses set nor sends any."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("cookies"):
            raise ValueError("a cookieless client takes no cookies")
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        if cookies:
            raise ValueError("a cookieless client takes no cookies")


class CookielessAsyncClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` that neither keeps the cookies its responses set nor sends any."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("cookies"):
            raise ValueError("a cookieless client takes no cookies")
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        if cookies:
            raise ValueError("a cookieless client takes no cookies")


__all__ = ["CookielessAsyncClient", "CookielessClient"]
