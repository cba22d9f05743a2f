"""Reasoning steps: what a step is, how text splits into steps, and what the user sees of them (reasoning/answer
separation, the matched stop string left out).

A step (docs/design.md section 1.1) is a span of whole tokens that ends with the token completing the delimiter
(default ``"\\n\\n"``, as in the paper), with EOS, or when ``max_step_tokens`` (default 100) is reached. A
draft step that was cut by the token limit is never accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..backends.base import FinishReason

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


#: Reasoning parsers (vLLM's ``--reasoning-parser`` names): ``deepseek_r1`` for models whose chat template
#: opens ``<think>`` in the generation prompt (the output starts inside the reasoning; no ``</think>`` yet means
#: it is all reasoning), ``qwen3`` for models that write ``<think>`` themselves, ``none`` to leave text whole.
ReasoningParser = Literal["none", "deepseek_r1", "qwen3"]


def split_reasoning(text: str, parser: ReasoningParser = "qwen3") -> tuple[str | None, str]:
    """Separate ``<think> ... </think>`` reasoning from the final answer (vLLM's reasoning parsers, see
    https://docs.vllm.ai/en/latest/features/reasoning_outputs.html).

    Args:
        text: the generated text (str).
        parser: ``qwen3``: reasoning only when the output opens with ``<think>``, up to the first ``</think>``
            (unclosed: everything after the tag); ``deepseek_r1``: the prompt opened the block, so the reasoning
            is everything up to the first ``</think>`` (a leading ``<think>`` dropped), all of it if none yet;
            ``none``: no split.

    Returns:
        ``(reasoning, answer)``, both stripped; ``reasoning`` is None when the parser finds no reasoning block,
        and then the answer is the whole text, unchanged.
    """
    head = text.lstrip()
    opened = head.startswith(THINK_OPEN)
    if parser == "none" or (parser == "qwen3" and not opened):
        return None, text
    if opened:
        head = head[len(THINK_OPEN):]
    reasoning, _, answer = head.partition(THINK_CLOSE)
    return reasoning.strip(), answer.strip()


class ReasoningStream:
    """Incremental :func:`split_reasoning` of streamed text: each delta becomes a reasoning delta, an answer
    delta, or both (the one holding ``</think>``), as vLLM streams ``reasoning_content`` then ``content``.

    Tags are never emitted. Text that could be the start of a tag split across deltas is held back until the
    next delta (or :meth:`flush`) decides it. Where the text has a reasoning block, both parts are stripped as
    :func:`split_reasoning` strips them (leading white space dropped, trailing white space held until more text
    follows), so the deltas of a stream add up to exactly the non-streamed split.
    """

    def __init__(self, parser: ReasoningParser = "qwen3") -> None:
        self.parser = parser
        self._state = "reasoning" if parser == "deepseek_r1" else ("start" if parser == "qwen3" else "answer")
        self._held = ""
        self._seen = False  # deepseek_r1: whether the text that decides about a leading <think> has arrived
        self._block = parser == "deepseek_r1"  # a reasoning block exists: both parts are stripped
        self._trim_r, self._trim_a = _Strip(), _Strip()

    def feed(self, delta: str) -> tuple[str, str]:
        """Returns ``(reasoning_delta, answer_delta)`` (either may be ``""``)."""
        was_reasoning = self._state == "reasoning"
        reasoning, answer = self._feed(delta)
        return self._stripped(reasoning, answer, closed=was_reasoning and self._state != "reasoning")

    def flush(self) -> tuple[str, str]:
        """The held-back text at the end of the stream (it was not a tag after all)."""
        reasoning, answer = self._stripped(*self._flush(), closed=True)
        if self._block:
            self._trim_a.end()
        return reasoning, answer

    def _stripped(self, reasoning: str, answer: str, closed: bool) -> tuple[str, str]:
        if not self._block:
            return reasoning, answer
        reasoning = self._trim_r.feed(reasoning)
        if closed:  # </think> passed (or the stream ended): the reasoning's trailing white space is dropped
            self._trim_r.end()
        return reasoning, self._trim_a.feed(answer)

    def _feed(self, delta: str) -> tuple[str, str]:
        text, self._held = self._held + delta, ""
        reasoning, answer = "", ""
        if self._state == "start":  # qwen3: reasoning only if the output opens with <think>
            head = text.lstrip()
            if head.startswith(THINK_OPEN):
                self._state, text, self._block = "reasoning", head[len(THINK_OPEN):], True
            elif THINK_OPEN.startswith(head):  # maybe the tag, not complete yet (or only whitespace so far)
                self._held = text
                return "", ""
            else:
                self._state = "answer"
        if self._state == "reasoning" and self.parser == "deepseek_r1" and not self._seen:  # a leading <think>
            head = text.lstrip()
            if not head or (THINK_OPEN.startswith(head) and head != THINK_OPEN):
                self._held = text
                return "", ""
            text, self._seen = (head[len(THINK_OPEN):] if head.startswith(THINK_OPEN) else text), True
        if self._state == "reasoning":
            i = text.find(THINK_CLOSE)
            if i >= 0:
                reasoning, text, self._state = text[:i], text[i + len(THINK_CLOSE):].lstrip(), "answer_start"
            else:
                keep = _partial_suffix(text, THINK_CLOSE)
                reasoning, self._held = text[: len(text) - keep], text[len(text) - keep:]
                return reasoning, ""
        if self._state == "answer_start":  # drop the blank lines after </think>
            text = text.lstrip()
            if not text:
                return reasoning, ""
            self._state = "answer"
        return reasoning, answer + text

    def _flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        if not held:
            return "", ""
        return (held, "") if self._state == "reasoning" else ("", held)


class _Strip:
    """Streamed ``str.strip``: leading white space dropped, trailing white space held until text follows it;
    :meth:`end` drops what is held."""

    def __init__(self) -> None:
        self.started, self.held = False, ""

    def feed(self, piece: str) -> str:
        if not self.started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self.started = True
        piece = self.held + piece
        body = piece.rstrip()
        self.held = piece[len(body):]
        return body

    def end(self) -> None:
        self.held = ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class StopTrimmer:
    """Leaves the matched user stop string out of the text the user sees, as OpenAI's API and vLLM do (vLLM's
    ``include_stop_str_in_output`` keeps it; docs.vllm.ai, ``SamplingParams``). The engines keep their step
    semantics (the text ends with the token that completed the stop string); the fronts trim with this.

    The generated text ends right after the first stop string, so only its end can be one: while streaming, the
    longest tail that is (the start of) a stop string is held back until the next piece or :meth:`finish`
    decides it.

    Args:
        stops: the request's stop strings (empty ones ignored; an empty list trims nothing).
    """

    def __init__(self, stops) -> None:
        self.stops = [s for s in (stops or []) if s]
        self.held = ""

    def feed(self, text: str) -> str:
        """The part of ``text`` (after what was held) that can be shown now."""
        text = self.held + text
        keep = max([k for s in self.stops for k in range(min(len(s), len(text)), 0, -1)
                    if text.endswith(s[:k])] + [0])
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def finish(self, stopped: bool) -> str:
        """What was held, without the stop string when the answer ended on one (``stopped``: finish reason
        ``stop``)."""
        held, self.held = self.held, ""
        if stopped:
            for s in sorted(self.stops, key=len, reverse=True):
                if held.endswith(s):
                    return held[:-len(s)]
        return held

    def apply(self, text: str, stopped: bool) -> str:
        """The last piece: ``text`` (a whole answer, or ``""`` at the end of a stream) with what was held,
        trimmed as :meth:`finish` does."""
        return self.feed(text) + self.finish(stopped)
