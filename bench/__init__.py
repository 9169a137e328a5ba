"""Benchmarks and the fake OpenAI-compatible LLM server they (and the tests) run against."""


class BenchError(RuntimeError):
    """A benchmark could not run (a process died, a service did not answer, ...)."""
