"""Toren: a durable runtime for LLM agents."""

__version__ = "0.1.0"
