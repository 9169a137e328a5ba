"""API tokens: the ``ibex_memory.api_tokens`` table, issued by ``ibex token``, read per request."""
