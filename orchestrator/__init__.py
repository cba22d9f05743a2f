"""Lookahead Reasoning serving: step-level speculation (arXiv 2506.19830) with token-level speculative decoding."""

__version__ = "0.1.0"
