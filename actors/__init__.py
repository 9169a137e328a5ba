"""Dramatiq actors: one module per pipeline stage (scan, extract, write, pointer).

``dramatiq actors`` imports this package: the broker first (it becomes Dramatiq's global
broker), then every stage module and the chat path's spool (:mod:`actors.record`), so one worker
command runs every stage.
"""

from actors.broker import Queue, broker
from actors.extract import extract_turn
from actors.pointer import advance_pointer
from actors.record import record_chat_turn
from actors.scan import scan_sessions
from actors.write import write_memory

#: The pipeline's four stages (extraction/dispatch.py routes them); ``record_chat_turn`` is the
#: chat path's spool, drained by the same worker.
ACTORS = (scan_sessions, extract_turn, write_memory, advance_pointer)

__all__ = [
    "ACTORS",
    "Queue",
    "advance_pointer",
    "broker",
    "extract_turn",
    "record_chat_turn",
    "scan_sessions",
    "write_memory",
]
