"""``GET /docs``: a page for the OpenAPI document (``GET /openapi.json``), offline.

The page is Swagger UI, from the ``swagger-ui-bundle`` package (its files ship inside the
wheel), served by the service itself under ``/docs/<file>``: nothing is loaded from a CDN (and
the online validator badge is off), so the page works on a machine without network. Only the
few files the page uses are served.
No token is needed to read it, as for ``/openapi.json``; "Authorize" takes one for the calls
tried from the page.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import falcon

from memory_service.errors import ErrorAnswer

#: The Swagger UI files the page loads, and their content types.
ASSETS = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui-standalone-preset.js": "text/javascript; charset=utf-8",
    "favicon-32x32.png": "image/png",
}

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>IBEX memory service API</title>
<link rel="stylesheet" href="/docs/swagger-ui.css">
<link rel="icon" type="image/png" href="/docs/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script src="/docs/swagger-ui-standalone-preset.js"></script>
<script>
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
  layout: "StandaloneLayout"
});
</script>
</body>
</html>
"""


def assets_folder() -> Path:
    """Where ``swagger-ui-bundle`` keeps Swagger UI's files."""
    import swagger_ui_bundle

    return Path(swagger_ui_bundle.swagger_ui_path)


class DocsPage:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.text = PAGE


class DocsAsset:
    def __init__(self, folder: Path) -> None:
        self.files = {name: (folder / name).read_bytes() for name in ASSETS}

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        if name not in self.files:
            raise ErrorAnswer(404, "NOT_FOUND", f"no file {name!r} of the docs page")
        resp.content_type = ASSETS[name]
        resp.data = self.files[name]
        resp.set_header("Cache-Control", "public, max-age=86400")


def document(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (the OpenAPI document) with ``/docs`` and ``/docs/{name}`` described."""
    out = copy.deepcopy(spec)
    out["paths"]["/docs"] = {
        "get": {
            "operationId": "docsPage",
            "summary": "A page for this document (Swagger UI, served offline; no token).",
            "responses": {
                "200": {
                    "description": "HTML page.",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                }
            },
        }
    }
    out["paths"]["/docs/{name}"] = {
        "get": {
            "operationId": "docsAsset",
            "summary": "A file of the docs page: " + ", ".join(sorted(ASSETS)) + ".",
            "parameters": [
                {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {
                    "description": "The file.",
                    "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                },
                "404": {
                    "description": "Not a file of the page.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
        }
    }
    return out


def add_routes(app: falcon.App[falcon.Request, falcon.Response]) -> None:
    """``/docs`` and ``/docs/<file>`` on ``app``."""
    app.add_route("/docs", DocsPage())
    app.add_route("/docs/{name}", DocsAsset(assets_folder()))


__all__ = ["ASSETS", "PAGE", "add_routes", "assets_folder", "document"]
