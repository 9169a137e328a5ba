"""``GET /docs``: the OpenAPI document's page and every file it loads, from the app itself."""

from __future__ import annotations

import re
import socket
from typing import Any

import httpx
import pytest

from memory_service.docs_page import ASSETS, assets_folder

ASSETS_FOLDER = assets_folder()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails: the page must not need one."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_page_and_its_files_load_from_the_app(http: httpx.Client, no_network: None) -> None:
    page = http.get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "SwaggerUIBundle" in html and 'url: "/openapi.json"' in html
    assert "validatorUrl: null" in html
    # Nothing from elsewhere: every src and href is one of the app's own paths.
    referenced = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert referenced and all(ref.startswith("/docs/") for ref in referenced), referenced
    assert not re.search(r"https?://", html)
    for ref in referenced:
        asset = http.get(ref)
        assert asset.status_code == 200, ref
        assert asset.headers["content-type"] == ASSETS[ref.removeprefix("/docs/")]
        expected = ASSETS_FOLDER.joinpath(ref.removeprefix("/docs/")).read_bytes()
        assert asset.content == expected and len(expected) > 500, ref
    bundle = http.get("/docs/swagger-ui-bundle.js").text
    assert "SwaggerUIBundle" in bundle
    assert http.get("/openapi.json").json()["paths"]["/docs"]["get"]["operationId"] == "docsPage"


def test_only_the_page_files_are_served(http: httpx.Client) -> None:
    for name in ("index.html", "..%2Fsetup.cfg", "swagger-ui.js.map", "nothing"):
        response = http.get(f"/docs/{name}")
        assert response.status_code == 404, name
        assert response.json()["error"]["code"] == "NOT_FOUND"
