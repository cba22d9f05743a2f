"""Reasoning steps: what a step is, how text splits into steps, and reasoning/answer separation.

A step (docs/design.md section 1.1) is a span of whole tokens that ends with the token completing the delimiter
(default ``"\\n\\n"``, as in the paper), with EOS, or when ``max_step_tokens`` (default 100) is reached. A
draft step that was cut by the token limit is never accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .backends.base import FinishReason

DEFAULT_DELIMITER = "\n\n"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class StepConfig(BaseModel):
    """How generation is cut into steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    delimiter: str = Field(DEFAULT_DELIMITER, min_length=1, description="step delimiter (non-empty)")
    max_step_tokens: int = Field(100, ge=1, le=4096, description="tokens per step at most")


@dataclass
class Step:
    """One generated step.

    Attributes:
        text: decoded text (special tokens dropped).
        target_ids: the step's tokens in the target's tokenizer (re-encoded text if the draft's differs).
        draft_ids: the step's tokens in the draft's tokenizer.
        finish: engine finish reason: ``stop`` (delimiter or a user stop string completed), ``eos``,
            ``length`` (cut by ``max_step_tokens`` or the token budget) or ``cancelled``.
        source: which model wrote it.
    """

    text: str
    target_ids: list[int]
    draft_ids: list[int]
    finish: FinishReason
    source: Literal["draft", "target"]
    depth: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Ended by its delimiter/stop string or EOS (a cut step is never accepted)."""
        return self.finish in ("stop", "eos")


def split_steps(text: str, delimiter: str = DEFAULT_DELIMITER) -> list[str]:
    """Split text into steps, each keeping its trailing delimiter, so ``"".join(result) == text``.

    Raises:
        ValueError: empty delimiter.
    """
    if not delimiter:
        raise ValueError("delimiter: must be non-empty")
    out, start = [], 0
    while True:
        i = text.find(delimiter, start)
        if i < 0:
            break
        out.append(text[start:i + len(delimiter)])
        start = i + len(delimiter)
    if start < len(text):
        out.append(text[start:])
    return out


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Separate ``<think> ... </think>`` reasoning from the final answer (as vLLM's reasoning parsers).

    Returns:
        ``(reasoning, answer)``: with a closing ``</think>`` the reasoning is the text before it (an opening
        ``<think>`` removed) and the answer the text after it; an unclosed ``<think>`` makes everything
        reasoning and the answer empty; without tags ``reasoning`` is None and the answer is the whole text.
    """
    stripped = text.lstrip()
    if THINK_CLOSE in text:
        reasoning, answer = text.split(THINK_CLOSE, 1)
        reasoning = reasoning.lstrip()
        if reasoning.startswith(THINK_OPEN):
            reasoning = reasoning[len(THINK_OPEN):]
        return reasoning.strip(), answer.strip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN):].strip(), ""
    return None, text.strip()
