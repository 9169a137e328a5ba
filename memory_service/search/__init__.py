"""The read path: search and the context block (``/v1/memories/search``, ``/v1/context``)."""
