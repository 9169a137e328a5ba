"""The chat path: an OpenAI-compatible endpoint that forwards chat completions upstream,
records each call as a session's turn (through a spool the worker drains) and can put the
conversation's memories into its system prompt. The ``proxy`` process of the Procfile."""
