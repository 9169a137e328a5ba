"""memories.search."""
