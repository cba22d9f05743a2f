"""Triton model `lookahead_reasoning`: the streaming BLS orchestrator (decoupled, async execute).

Thin adapter: the library class parses the request tensors, runs the Lookahead Reasoning loop over the
`draft`, `target` and `judge` models through BLS, and streams each decided step
(see lookahead_reasoning.serving.triton_lr).
"""

from lookahead_reasoning.serving.triton_lr import LookaheadReasoningModel as TritonPythonModel  # noqa: F401
