"""Dramatiq actors: one module per pipeline stage (scan, extract, write, pointer)."""
