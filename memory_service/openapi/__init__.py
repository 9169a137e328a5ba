"""The OpenAPI 3 document of the service (``GET /openapi.json``), built from the schemas."""
