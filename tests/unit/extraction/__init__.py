"""Unit tests of extraction: providers, prompt, result parsing, the rules extractor."""
