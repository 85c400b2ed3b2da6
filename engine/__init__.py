"""Candlewick's inference engine: GGUF models on llama.cpp. Never imports Qt or the app."""

__version__ = "0.1.0"
