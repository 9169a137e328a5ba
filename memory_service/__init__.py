"""The memory service: a WSGI app storing memories with durable idempotency and dedup."""
