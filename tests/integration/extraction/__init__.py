"""Extraction providers against a fake OpenAI-compatible server over real loopback HTTP."""
