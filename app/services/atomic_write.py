"""Write a file whole or not at all: a file a person exports (a chat) never stays half-written
under its real name, and a file it replaces stays as it was when the write fails. The
mechanism is the engine's (`engine.files`), shared with its saved states and results."""

from __future__ import annotations

from engine.files import write_bytes_atomic, write_text_atomic

__all__ = ["write_bytes_atomic", "write_text_atomic"]
