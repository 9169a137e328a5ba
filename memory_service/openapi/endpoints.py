"""``GET /openapi.json``: the document :func:`~memory_service.openapi.document.build_spec`
built, encoded once."""

from __future__ import annotations

from typing import Any

import falcon

from schema.bodies import dumps


class OpenApiResource:
    def __init__(self, document: dict[str, Any]) -> None:
        self.body = dumps(document)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.body
