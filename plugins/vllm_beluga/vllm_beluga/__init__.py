"""Beluga KV connector for vLLM (v1 KV connector API)."""

__version__ = "0.1.0"
