"""Benchmarks and the fake OpenAI-compatible LLM server they (and the tests) run against."""
