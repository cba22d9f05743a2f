"""Tensor conventions of the ``lookahead_reasoning`` Triton model (the role models' codec is
:mod:`lookahead_reasoning.backends.role_tensors`).

The ``lookahead_reasoning`` model follows Triton's LLM backends (names as in the vLLM backend):
inputs ``text_input`` or ``messages`` (JSON), ``max_tokens``, ``stream``, ``temperature``, ``top_p``,
``top_k``, ``seed`` (-1 = none), ``stop``, ``mode``, ``gamma``, ``judge``, and ``async``, ``adaptive_gamma``,
``width``, ``delimiter``, ``max_step_tokens``; outputs ``text_output`` and ``metrics``.
"""

from __future__ import annotations

LR_INPUTS = ("text_input", "messages", "max_tokens", "stream", "temperature", "top_p", "top_k", "seed", "stop",
             "mode", "gamma", "judge", "async", "adaptive_gamma", "width", "delimiter", "max_step_tokens")
