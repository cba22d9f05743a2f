"""The LLM-as-judge prompt (docs/design.md section 1.5, after the reference Lookahead Reasoning code).

The judge sees two reasoning steps and answers ``[aligned]`` or ``[unaligned]``. The assistant turn is
pre-filled with ``[`` and exactly ONE token is read: the verdict is "aligned" iff that token is the
``aligned`` token. The step texts are encoded with special tokens disabled, so a step that contains chat
control tokens, the prompt's own words or the string ``[aligned]`` is only ever text inside the prompt:
it cannot close the user turn or answer on the judge's behalf.
"""

from __future__ import annotations

from typing import Any

ALIGNED = "aligned"
UNALIGNED = "unaligned"
ASSISTANT_PREFILL = "["

JUDGE_INSTRUCTIONS = (
    "Do the two reasoning steps below convey the same meaning? Focus on the key ideas, the logic and the "
    "numeric results, not the wording. Answer [aligned] or [unaligned]; if unsure, answer [unaligned]."
)

_A = "\x00STEP_A\x00"
_B = "\x00STEP_B\x00"


def judge_user_message(target_step: str, draft_step: str) -> str:
    """The user message text holding both steps (``target_step`` is "Step A", ``draft_step`` "Step B")."""
    return f"{JUDGE_INSTRUCTIONS}\nStep A: {target_step.strip()}\nStep B: {draft_step.strip()}"


def build_judge_ids(tokenizer: Any, target_step: str, draft_step: str) -> list[int]:
    """Token ids of the full judge prompt, ending with the pre-filled ``[``.

    Args:
        tokenizer: a Hugging Face tokenizer; its chat template is used when it has one, otherwise the
            plain user message followed by ``"\\nAnswer: "``.
        target_step, draft_step: the two step texts (str).

    Returns:
        list[int]: prompt ids; the judge's next token is the verdict.

    The template is rendered once with placeholders; the template pieces are encoded normally (so chat
    control tokens are real) and the step texts with ``split_special_tokens=True`` (so they are not).
    """
    rendered = _render(tokenizer, judge_user_message(_A, _B))
    head, rest = rendered.split(_A, 1)
    middle, tail = rest.split(_B, 1)
    ids: list[int] = []
    ids += tokenizer.encode(head, add_special_tokens=False)
    ids += tokenizer.encode(target_step.strip(), add_special_tokens=False, split_special_tokens=True)
    ids += tokenizer.encode(middle, add_special_tokens=False)
    ids += tokenizer.encode(draft_step.strip(), add_special_tokens=False, split_special_tokens=True)
    ids += tokenizer.encode(tail + ASSISTANT_PREFILL, add_special_tokens=False)
    return ids


def verdict_token_ids(tokenizer: Any) -> tuple[int, int]:
    """(aligned id, unaligned id): the first token of each verdict word as it follows ``[``.

    Raises:
        ValueError: if the two words share their first token (then one token cannot tell them apart).
    """
    base = tokenizer.encode(ASSISTANT_PREFILL, add_special_tokens=False)
    a = tokenizer.encode(ASSISTANT_PREFILL + ALIGNED, add_special_tokens=False)[len(base)]
    u = tokenizer.encode(ASSISTANT_PREFILL + UNALIGNED, add_special_tokens=False)[len(base)]
    if a == u:
        raise ValueError("judge tokenizer: 'aligned' and 'unaligned' start with the same token")
    return a, u


def _render(tokenizer: Any, user_text: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
        )
    return user_text + "\nAnswer: "
