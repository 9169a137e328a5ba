"""Memories: the create flow (idempotency, dedup), the store and the ``/v1/memories`` routes."""
