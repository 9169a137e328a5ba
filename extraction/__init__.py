"""Extraction: LLM providers, the prompt, result parsing and the stage functions."""
