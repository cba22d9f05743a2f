"""A synthetic, step-structured reasoning task: grade-school arithmetic word problems (GSM8K-like).

The demo draft / target / judge models (``engines/demo``) are trained on this task, and every later
capability is tested on it. A problem describes a person, some items and a few events; the solution is a
list of short steps, each ONE sentence with ONE computation ``x op y = r`` (``op`` in ``+ - x /``, integer
operands and result), joined by ``"\\n\\n"``, then a final line ``"#### N"`` as in GSM8K::

    Mia has 4 boxes of pencils. Each box holds 12 pencils. She gives away 9 pencils. ...
    -> "Mia has 4 x 12 = 48 pencils.\\n\\nThat leaves 48 - 9 = 39.\\n\\n#### 39"

Wording. Each step kind has three sentence frames (two with units, one without) and, where the operation
is commutative, two operand orders. Which wording a step gets is a *deterministic* function of the
problem (the person's name, the item and the step's position, through fixed lookup tables), not a coin
flip: a large enough model learns it with clear logit margins (stable greedy output), while a much
smaller model often picks another wording for the same computation, which a semantic judge accepts and
exact matching rejects.

Ground truth for "semantically equal": :func:`parse_step` recovers the :class:`Computation` of a step's
text; :func:`steps_equivalent` compares computations (operand order ignored for ``+`` and ``x``).

Everything is deterministic per seed (``random.Random(seed)``; no global random state).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..core.steps import THINK_CLOSE

__all__ = [
    "ANSWER_PREFIX",
    "DEFAULT_DIFFICULTY",
    "DIFFICULTIES",
    "EVAL_SEED",
    "JUDGE_EVAL_SEED",
    "MAX_STEPS",
    "MIN_STEPS",
    "STEP_DELIMITER",
    "Computation",
    "Problem",
    "ProblemContext",
    "STYLES",
    "VOICES",
    "DEFAULT_STYLE",
    "STEP_KINDS",
    "TRACE_KINDS",
    "StepPair",
    "StepSpec",
    "extract_answer",
    "generate_problems",
    "generate_same_number_pairs",
    "generate_step_pairs",
    "is_reserved_seed",
    "parse_step",
    "inverse_computation",
    "render_spec",
    "render_step",
    "step_meaning",
    "step_style",
    "steps_equivalent",
]

STEP_DELIMITER = "\n\n"
ANSWER_PREFIX = "#### "

#: Held-out evaluation seed for problems: never used for training data (see :func:`is_reserved_seed`).
EVAL_SEED = 2_000_000_011
#: Held-out evaluation seed for judge step pairs: never used for training data.
JUDGE_EVAL_SEED = 2_000_000_029

MIN_STEPS = 2
MAX_STEPS = 8
#: Difficulty levels: 1 (easiest) .. 5. Raises step counts and number magnitudes.
DIFFICULTIES = (1, 2, 3, 4, 5)
#: The difficulty used for evaluation (and the default of :func:`generate_problems`).
DEFAULT_DIFFICULTY = 2

#: Wording functions of the steps (:func:`step_style`): the target's and the draft's.
VOICES = ("target", "draft")

#: Solution styles: one computation per step, or a long reasoning trace (see :class:`Problem`).
STYLES = ("short", "long")
#: The style the shipped demo models (``engines/demo``) were trained on; ``eval --dataset synthetic`` uses it.
DEFAULT_STYLE = "long"

OPS = ("+", "-", "x", "/")
COMMUTATIVE = frozenset({"+", "x"})


def is_reserved_seed(seed: int) -> bool:
    """True for the held-out evaluation seeds (training code must not draw data from these)."""
    return seed in (EVAL_SEED, JUDGE_EVAL_SEED)


def derive_seed(seed: int, *tags: object) -> int:
    """A sub-seed of ``seed`` for one purpose named by ``tags`` (SHA-256 of ``"seed:tag:..."``, first 4 bytes, mod
    10^9): deterministic, independent across tags, and never a reserved held-out seed (``ValueError`` if it were)."""
    h = hashlib.sha256(":".join([str(seed), *map(str, tags)]).encode()).digest()
    s = int.from_bytes(h[:4], "little") % 1_000_000_000
    if is_reserved_seed(s):
        raise ValueError(f"derive_seed({seed}, {tags}) hit the reserved held-out seed {s}; use another tag")
    return s


# --------------------------------------------------------------------------------------------------
# Data types


@dataclass(frozen=True)
class Computation:
    """One arithmetic computation ``operands[0] op operands[1] = result``.

    Attributes:
        op: one of ``"+"``, ``"-"``, ``"x"`` (multiplication), ``"/"`` (exact integer division).
        operands: two non-negative ints, in the order written.
        result: int, the value written after ``=`` (not necessarily correct when parsed from model text).
    """

    op: str
    operands: tuple[int, ...]
    result: int

    def canonical(self) -> tuple[str, tuple[int, ...], int]:
        """Key for semantic equality: operands sorted when ``op`` is commutative (``+``, ``x``)."""
        ops = tuple(sorted(self.operands)) if self.op in COMMUTATIVE else tuple(self.operands)
        return (self.op, ops, self.result)

    def is_correct(self) -> bool:
        """True iff ``result`` is the exact value of the operation (division must be exact)."""
        value = _apply(self.op, self.operands[0], self.operands[1])
        return value is not None and value == self.result

    def text(self) -> str:
        """The expression as written in steps, e.g. ``"4 x 12 = 48"``."""
        return f"{self.operands[0]} {self.op} {self.operands[1]} = {self.result}"


@dataclass(frozen=True)
class ProblemContext:
    """Who and what a problem is about (drives both the question text and the step wording).

    Attributes:
        scenario: ``"count"`` (items), ``"shop"`` (money spent) or ``"work"`` (money earned).
        name: the person's name; ``pron`` / ``pron_obj`` / ``pron_poss``: she/her/her or he/him/his.
        unit: plural noun counted by the running quantity (``"pencils"`` or ``"dollars"``).
        item: the item noun that selects the wording table (for shop/work: the first thing bought or
            the job).
        voice: which wording function words the steps (see :func:`step_style`): ``0`` the target's, ``1`` the
            draft's. The question and the meaning of every step do not depend on it.
    """

    scenario: str
    name: str
    pron: str
    pron_obj: str
    pron_poss: str
    unit: str
    item: str
    voice: int = 0


@dataclass(frozen=True)
class StepSpec:
    """What one solution step says, before it is worded (its meaning plus the words its frame needs).

    Attributes:
        kind: a computation kind (:data:`STEP_KINDS`: ``total``, ``part``, ``add``, ``sub``, ``scale``,
            ``div``, ``change``) or a trace kind (:data:`TRACE_KINDS`: ``plan``, ``given``, ``check``,
            ``summary``, ``conclude``, ``close``, ``final``).
        computation: the arithmetic of a computation step, or the inverse computation a ``check`` writes.
        value: the number a ``plan`` (changes to apply), ``summary``, ``conclude`` or ``final`` step states.
        sentence: the question sentence a ``given`` step restates.
        slots: extra frame words of ``part`` / ``div`` steps.
    """

    kind: str
    computation: Computation | None = None
    value: int | None = None
    sentence: str = ""
    slots: _StepSlots = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.slots is None:
            object.__setattr__(self, "slots", _StepSlots())


@dataclass(frozen=True)
class Problem:
    """One generated word problem with its worked solution.

    Attributes:
        question: the problem text (str, one paragraph, ends with a question mark).
        steps: list[str], the solution's steps before the ``"#### N"`` line, each WITHOUT the trailing
            ``"\\n\\n"``. Style ``"short"``: one computation sentence per step (2 to 8 steps). Style
            ``"long"``: a reasoning trace (plan, and per event: restated given, computation(s), check,
            running summary; then a conclusion), the ``"</think>"`` step, and a one-sentence final answer.
        answer: int, the final answer (equals ``computations[-1].result``).
        computations: tuple[Computation, ...], the problem's arithmetic in order; each one's operands are
            numbers from the question or earlier results (checks are not included: see ``specs``).
        specs: tuple[:class:`StepSpec`, ...], one per step: what each step says (re-worded by
            :func:`render_spec`).
        difficulty: int in :data:`DIFFICULTIES`.
        context: :class:`ProblemContext` (re-renders steps in other wordings).
        style: ``"short"`` or ``"long"`` (:data:`STYLES`).
    """

    question: str
    steps: list[str]
    answer: int
    computations: tuple[Computation, ...]
    specs: tuple[StepSpec, ...]
    difficulty: int
    context: ProblemContext = field(repr=False)
    style: str = "short"

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kind of each step (``specs[i].kind``)."""
        return tuple(sp.kind for sp in self.specs)

    @property
    def step_slots(self) -> tuple[_StepSlots, ...]:
        """The extra frame words of each step (``specs[i].slots``)."""
        return tuple(sp.slots for sp in self.specs)

    @property
    def solution(self) -> str:
        """``"\\n\\n".join(steps) + "\\n\\n#### N"`` (the assistant answer the models are trained on; in the
        long style the chat template's generation prompt opens the ``<think>`` block, so the solution starts
        inside it)."""
        return STEP_DELIMITER.join(self.steps) + STEP_DELIMITER + ANSWER_PREFIX + str(self.answer)

    @property
    def answer_line(self) -> str:
        """The final line, ``"#### N"``."""
        return ANSWER_PREFIX + str(self.answer)

    def in_voice(self, voice: int) -> Problem:
        """The same problem with every step worded by ``voice`` (:data:`VOICES` index; :func:`step_style`): the
        question, answer and step meanings are unchanged. ``generate_problems(..., voice=v)`` equals
        ``generate_problems(..., voice=0)`` re-worded so.

        Raises:
            ValueError: ``voice`` is not an index of :data:`VOICES`.
        """
        if voice not in range(len(VOICES)):
            raise ValueError(f"voice must be an index of {VOICES}, got {voice!r}")
        ctx = replace(self.context, voice=voice)
        return replace(self, steps=_render_steps(self.specs, ctx, self.style), context=ctx)

    def prefix(self, n_steps: int) -> str:
        """Solution text before step ``n_steps`` (each earlier step followed by ``"\\n\\n"``); ``""`` for 0."""
        return "".join(s + STEP_DELIMITER for s in self.steps[:n_steps])


class StepPair(NamedTuple):
    """A labelled judge example: ``(step_a, step_b, equivalent)``; ``equivalent`` is ground truth."""

    step_a: str
    step_b: str
    equivalent: bool


# --------------------------------------------------------------------------------------------------
# Vocabulary of the task

_NAMES = (
    ("Mia", "she"), ("Noah", "he"), ("Emma", "she"), ("Liam", "he"), ("Ava", "she"), ("Omar", "he"),
    ("Zoe", "she"), ("Jack", "he"), ("Lily", "she"), ("Sam", "he"), ("Nora", "she"), ("Ben", "he"),
    ("Ruby", "she"), ("Leo", "he"), ("Anna", "she"), ("Max", "he"),
)
_PRON = {"she": ("she", "her", "her"), "he": ("he", "him", "his")}

# count scenario: (plural item, container singular, container plural)
_COUNT_ITEMS = (
    ("pencils", "box", "boxes"), ("apples", "bag", "bags"), ("cookies", "tray", "trays"),
    ("stickers", "sheet", "sheets"), ("eggs", "carton", "cartons"), ("marbles", "jar", "jars"),
    ("cards", "pack", "packs"), ("books", "shelf", "shelves"), ("flowers", "pot", "pots"),
    ("beads", "box", "boxes"), ("shells", "bucket", "buckets"), ("candies", "bag", "bags"),
)
# shop scenario: plural items bought by the piece
_SHOP_ITEMS = (
    "pens", "books", "shirts", "toys", "cups", "hats", "plates", "games", "socks", "bowls", "lamps", "balls",
)
# work scenario: the job
_JOBS = ("tutoring", "babysitting", "gardening", "painting", "cleaning", "baking")
_OTHERS = ("a friend", "{poss} mom", "{poss} dad", "a neighbor", "{poss} sister", "{poss} brother", "a classmate")
_SHARES = (("friends", "friend"), ("bags", "bag"), ("kids", "kid"), ("boxes", "box"), ("people", "person"))

# Wording tables (fixed): frame = (NAME_F[name] + ITEM_F[item] + POS_F[step]) % 3,
# operand order = (NAME_O[name] + POS_O[step]) % 2. Lookup tables, not coin flips.
_NAME_F = {n: (i * 7 + 1) % 3 for i, (n, _) in enumerate(_NAMES)}
_NAME_O = {n: (i * 5 // 3) % 2 for i, (n, _) in enumerate(_NAMES)}
_ITEM_KEYS = tuple(dict.fromkeys([c[0] for c in _COUNT_ITEMS] + list(_SHOP_ITEMS) + list(_JOBS)))
_ITEM_F = {it: (i * 5 + 2) % 3 for i, it in enumerate(_ITEM_KEYS)}
_POS_F = (0, 2, 1, 1, 0, 2, 0, 1)
_POS_O = (1, 0, 0, 1, 1, 0, 1, 0)


def step_style(context: ProblemContext, position: int, kind: str | None = None) -> tuple[int, int]:
    """(frame in 0..2, operand order in 0..1) of a step for a problem's context.

    Deterministic in the name, the item and, in the short style, the step's ``position`` (0-based); in the long
    style (``kind`` given) in the step's kind instead: a trace has 20+ steps, and a wording that depends on a
    step's index modulo a table would ask the model to count steps, where a fixed wording per kind of step is a
    plain lookup. Order 1 swaps the operands of ``+`` / ``x``.

    ``context.voice`` 1 (the draft's voice) shifts frame and order by offsets hashed from the voice and each of the
    name, the item and the kind (or position) alone, summed mod 3 (the order: the name's and the kind's, mod 2):
    another fixed function of the same context, of voice 0's own form (a lookup per part, added), which keeps voice
    0's wording for about a third of the held-out steps (33.1% at the default difficulty, long style). A draft
    trained on voice 1 says what the target says in its own words, as a small model of another family does; only a
    semantic judge accepts those steps. Until 2026-12-05 the offset was one hash of the whole (name, item, kind)
    key, a table of 6,496 entries (16 x 29 x 14) that the demo drafts could not learn: they wrote their own voice
    for 42% of the steps (trio v3.1) and copied the wording of their context instead.
    """
    if kind is not None:
        frame = (_NAME_F[context.name] + _ITEM_F[context.item] + _KIND_F[kind]) % 3
        order = (_NAME_O[context.name] + _KIND_O[kind]) % 2
    else:
        p = position % len(_POS_F)
        frame = (_NAME_F[context.name] + _ITEM_F[context.item] + _POS_F[p]) % 3
        order = (_NAME_O[context.name] + _POS_O[p]) % 2
    if context.voice:
        place = kind if kind is not None else position % len(_POS_F)
        hn, hi, hk = (_voice_offset(context.voice, part) for part in (context.name, context.item, place))
        frame, order = (frame + hn[0] + hi[0] + hk[0]) % 3, (order + hn[1] + hk[1]) % 2
    return frame, order


def _voice_offset(voice: int, part: object) -> tuple[int, int]:
    """(frame offset in 0..2, order offset in 0..1) that ``voice`` adds for one part of a step's context (a name,
    an item, a kind or a position), hashed from the voice and that part alone."""
    h = hashlib.blake2b(f"{voice}|{part}".encode(), digest_size=2).digest()
    return h[0] % 3, h[1] % 2


# Step kinds and their three frames ({x} {op} {y} = {r} is the computation; {u} the unit word).
# Frames 0 and 1 name the unit, frame 2 does not.
_FRAMES: dict[str, tuple[str, str, str]] = {
    # running quantity starts as a product
    "total": ("{Name} {verb} {x} {op} {y} = {r} {u}.", "That is {x} {op} {y} = {r} {u} in all.", "{x} {op} {y} = {r}."),
    # a separate product (extra boxes, other items, more hours)
    "part": ("The {what} {partverb} {x} {op} {y} = {r} {u}.", "{x} {op} {y} = {r} {u} for the {what}.",
             "That part is {x} {op} {y} = {r}."),
    "add": ("Now {state} {x} {op} {y} = {r} {u}.", "{x} {op} {y} = {r} {u} in total.",
            "That makes {x} {op} {y} = {r}."),
    "sub": ("Now {state} {x} {op} {y} = {r} {u}.", "{x} {op} {y} = {r} {u} after that.",
            "That leaves {x} {op} {y} = {r}."),
    "scale": ("Now {state} {x} {op} {y} = {r} {u}.", "{x} {op} {y} = {r} {u} after that.",
              "That makes {x} {op} {y} = {r}."),
    "div": ("Each {share} gets {x} {op} {y} = {r} {u}.", "{x} {op} {y} = {r} {u} for each {share}.",
            "So it is {x} {op} {y} = {r}."),
    "change": ("{Pron} gets {x} {op} {y} = {r} dollars back.", "The change is {x} {op} {y} = {r} dollars.",
               "{x} {op} {y} = {r}."),
}
STEP_KINDS = tuple(_FRAMES)


@dataclass(frozen=True)
class _StepSlots:
    """Words a step's frame needs besides the computation."""

    what: str = ""  # for "part": what the product counts ("new boxes", "books")
    share: str = ""  # for "div": the singular share noun


def render_step(kind: str, computation: Computation, context: ProblemContext, frame: int, order: int,
                slots: _StepSlots | None = None) -> str:
    """Render one step sentence.

    Args:
        kind: a key of the step kinds (``total``, ``part``, ``add``, ``sub``, ``scale``, ``div``, ``change``).
        computation: the step's :class:`Computation` (operands in canonical order: running value first).
        context: the problem's :class:`ProblemContext`.
        frame: 0..2 sentence frame; order: 0 or 1, 1 swaps operands of commutative operations.
        slots: extra words for ``part`` / ``div`` frames.

    Returns:
        str: the sentence, without the trailing delimiter.

    Raises:
        KeyError: unknown ``kind``; IndexError: ``frame`` out of range.
    """
    slots = slots or _StepSlots()
    x, y = computation.operands
    if order == 1 and computation.op in COMMUTATIVE:
        x, y = y, x
    verb = {"count": "has", "shop": "spends", "work": "earns"}[context.scenario]
    state = {"count": f"{context.pron} has", "shop": "the total is", "work": f"{context.pron} has"}[context.scenario]
    partverb = "cost" if context.scenario == "shop" else ("pay" if context.scenario == "work" else "hold")
    text = _FRAMES[kind][frame].format(
        Name=context.name, Pron=context.pron.capitalize(), verb=verb, state=state, partverb=partverb,
        x=x, y=y, op=computation.op, r=computation.result, u=context.unit, what=slots.what or context.unit,
        share=slots.share or "one",
    )
    return text


# Trace kinds of the long style ({n}: changes to apply; {s}: a question sentence; {c}: a computation
# "x op y = r"; {v}: a value; {u}: the unit word). Three frames each; "close" is the fixed "</think>".
_TRACE_FRAMES: dict[str, tuple[str, ...]] = {
    "plan": ("Plan: find the start, then apply the {n} changes in order.",
             "First I work out the start, then I go through {n} changes.",
             "I will begin with the first fact and then use {n} more facts."),
    "given": ("The problem says: {s}", "Given: {s}", "Next fact: {s}"),
    "check": ("Check: {c}, which matches.", "To verify: {c}.", "Checking it, {c} is right."),
    "summary": ("So far: {v} {u}.", "Running total: {v} {u}.", "That puts it at {v}."),
    "conclude": ("So the answer is {v}.", "The final result is {v} {u}.", "That means the answer is {v}."),
    "close": (THINK_CLOSE,),
    "final": ("The answer is {v} {u}.", "Final answer: {v} {u}.", "Answer: {v}."),
}
TRACE_KINDS = tuple(_TRACE_FRAMES)
# Long style: the wording offsets of each step kind (see step_style).
_KIND_F = {k: (i * 2 + 1) % 3 for i, k in enumerate(STEP_KINDS + TRACE_KINDS)}
_KIND_O = {k: (i * 3 // 2) % 2 for i, k in enumerate(STEP_KINDS + TRACE_KINDS)}
_INVERSE = {"+": "-", "-": "+", "x": "/", "/": "x"}


def inverse_computation(c: Computation) -> Computation:
    """The check of ``a op b = r``: ``r inv b = a`` (``+``/``-`` and ``x``/``/`` undo each other); exact."""
    return Computation(_INVERSE[c.op], (c.result, c.operands[1]), c.operands[0])


def render_spec(spec: StepSpec, context: ProblemContext, frame: int, order: int) -> str:
    """Word one step: :func:`render_step` for computation kinds, the trace frames otherwise.

    Args:
        spec: what the step says. context: the problem's context. frame: 0..2 (``close`` has one frame; any
            frame renders it). order: 0 or 1; 1 swaps the operands of a commutative computation (also in a
            ``check``).

    Returns:
        str: the step, without the trailing delimiter.

    Raises:
        KeyError: unknown kind; IndexError: ``frame`` out of range.
    """
    if spec.kind in _FRAMES:
        return render_step(spec.kind, spec.computation, context, frame, order, spec.slots)
    frames = _TRACE_FRAMES[spec.kind]
    c = spec.computation
    if c is not None and order == 1 and c.op in COMMUTATIVE:
        c = Computation(c.op, c.operands[::-1], c.result)
    return frames[frame % len(frames)].format(
        n=spec.value, s=spec.sentence, c=c.text() if c is not None else "", v=spec.value, u=context.unit,
        Name=context.name)


def _frame_regex(frame: str) -> re.Pattern:
    groups = {"n": r"(?P<v>\d+)", "v": r"(?P<v>\d+)", "s": r"(?P<s>.+)", "c": r"(?P<c>\d+ [-+x/] \d+ = \d+)",
              "u": r"[a-z]+", "Name": r"[A-Z][a-z]+"}
    parts = re.split(r"\{(\w+)\}", frame)
    return re.compile("".join(groups[x] if i % 2 else re.escape(x) for i, x in enumerate(parts)) + r"\Z")


_TRACE_RE = [(kind, _frame_regex(f)) for kind, fs in _TRACE_FRAMES.items() for f in fs]


# --------------------------------------------------------------------------------------------------
# Parsing


_EXPR = re.compile(r"(\d+)\s*([x×*+\-/÷])\s*(\d+)\s*=\s*(\d+)")
_ANSWER = re.compile(r"####\s*(-?[\d,]*\d)")
_OP_NORMAL = {"×": "x", "*": "x", "÷": "/"}


def parse_step(text: str) -> Computation | None:
    """Recover the computation written in a step's text.

    Args:
        text: one step (str; surrounding whitespace and a trailing ``"\\n\\n"`` are ignored).

    Returns:
        :class:`Computation` if the text holds exactly one expression ``a op b = r`` (``op`` in
        ``+ - x * × / ÷``; ``*``/``×`` read as ``x``, ``÷`` as ``/``), else ``None`` (no expression, or
        more than one). The result is returned as written, correct or not.
    """
    found = _EXPR.findall(text)
    if len(found) != 1:
        return None
    a, op, b, r = found[0]
    return Computation(_OP_NORMAL.get(op, op), (int(a), int(b)), int(r))


def extract_answer(text: str) -> int | None:
    """The integer after the last ``"####"`` in ``text`` (commas removed), or ``None`` if there is none."""
    found = _ANSWER.findall(text)
    if not found:
        return None
    try:
        return int(found[-1].replace(",", ""))
    except ValueError:
        return None


def _norm_text(text: str) -> str:
    return "".join(text.split()).lower()


def step_meaning(text: str) -> tuple:
    """What a step says, as a comparable key (the ground truth behind :func:`steps_equivalent`).

    Returns:
        ``("answer", N)`` for a ``"#### N"`` line; for a step in one of the trace frames, ``(kind, content)``:
        ``("given", restated sentence, whitespace and case dropped)``, ``("check", canonical computation)``,
        ``("plan" | "summary" | "conclude" | "final", number)`` or ``("close",)``; for any other step with one
        computation, ``("calc", canonical computation)`` (:meth:`Computation.canonical`: operand order ignored
        for ``+`` and ``x``), whatever its wording or units; otherwise ``("text", text without whitespace,
        lower-cased)``.
    """
    t = text.strip()
    if t.startswith("####"):
        n = extract_answer(t)
        if n is not None:
            return ("answer", n)
    for kind, rx in _TRACE_RE:
        m = rx.match(t)
        if m is None:
            continue
        g = m.groupdict()
        if "c" in g:
            return (kind, parse_step(g["c"]).canonical())
        if "s" in g:
            return (kind, _norm_text(g["s"]))
        if "v" in g:
            return (kind, int(g["v"]))
        return (kind,)
    c = parse_step(t)
    if c is not None:
        return ("calc", c.canonical())
    return ("text", _norm_text(t))


def steps_equivalent(a: str, b: str) -> bool:
    """Ground-truth semantic equality of two steps: equal :func:`step_meaning`.

    Two computation steps are equivalent iff they hold the same computation (same operation, same operands
    up to order for ``+``/``x``, same written result), whatever the wording or units; a check equals only a
    check of the same computation; a restated given equals the same sentence restated in any frame; plan,
    summary, conclusion and final-answer steps equal the same kind stating the same number; answer lines
    equal iff their answers do. Anything else is compared as text (whitespace and case dropped).
    """
    return step_meaning(a) == step_meaning(b)


# --------------------------------------------------------------------------------------------------
# Problem generation


@dataclass(frozen=True)
class _Level:
    steps: tuple[int, int]  # inclusive range of step counts
    count: tuple[int, int]  # multiplier (number of boxes / items / hours)
    per: tuple[int, int]  # per-unit quantity or price
    delta: tuple[int, int]  # added / removed amounts
    cap: int  # running value stays <= cap


#: Computations per problem in the long style, by difficulty (the trace adds about three steps per event).
_LONG_STEPS = {1: (3, 4), 2: (4, 6), 3: (5, 7), 4: (6, 8), 5: (7, 8)}

_LEVELS = {
    1: _Level((2, 3), (2, 5), (2, 9), (1, 9), 60),
    2: _Level((2, 5), (2, 5), (2, 12), (1, 20), 100),
    3: _Level((3, 6), (2, 9), (2, 25), (1, 50), 500),
    4: _Level((4, 8), (2, 9), (2, 50), (1, 99), 2000),
    5: _Level((5, 8), (2, 9), (2, 99), (1, 250), 9999),
}


def _apply(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "x":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            return None
        return a // b
    raise ValueError(f"unknown op {op!r}")


def _rint(rng: random.Random, lo_hi: tuple[int, int]) -> int:
    return rng.randint(lo_hi[0], lo_hi[1])


class _Builder:
    """Accumulates question sentences and steps for one problem."""

    def __init__(self, ctx: ProblemContext, level: _Level, rng: random.Random):
        self.ctx, self.level, self.rng = ctx, level, rng
        self.sentences: list[str] = []
        self.kinds: list[str] = []
        self.comps: list[Computation] = []
        self.slots: list[_StepSlots] = []
        self.events: list[int] = []  # index in ``sentences`` of the event each computation belongs to
        self.value = 0

    def step(self, kind: str, op: str, a: int, b: int, slots: _StepSlots | None = None) -> int:
        r = _apply(op, a, b)
        assert r is not None and r >= 0, (op, a, b)
        self.kinds.append(kind)
        self.comps.append(Computation(op, (a, b), r))
        self.slots.append(slots or _StepSlots())
        self.events.append(len(self.sentences) - 1)
        return r


def _choose(rng: random.Random, options: Sequence[str]) -> str:
    return options[rng.randrange(len(options))]


def _divisors(v: int) -> list[int]:
    return [k for k in range(2, 10) if v % k == 0 and v // k >= 2]


def _scenario_item(rng: random.Random, scenario: str) -> tuple[str, str, str, str]:
    """``(item, box, boxes, unit)`` of a scenario, drawn from ``rng``: the counted things and their box (singular,
    plural) for ``count``; the goods (``shop``) or the job (``work``), both in dollars and without boxes."""
    if scenario == "count":
        item, box, boxes = _COUNT_ITEMS[rng.randrange(len(_COUNT_ITEMS))]
        return item, box, boxes, item
    if scenario == "shop":
        return _SHOP_ITEMS[rng.randrange(len(_SHOP_ITEMS))], "", "", "dollars"
    return _JOBS[rng.randrange(len(_JOBS))], "", "", "dollars"


def _first_quantity(bld: _Builder, box: str, boxes: str) -> None:
    """The problem's first given, a product (how many x how much each), and its step; sets the running value."""
    rng, ctx, level = bld.rng, bld.ctx, bld.level
    name, item = ctx.name, ctx.item
    a, b = _rint(rng, level.count), _rint(rng, level.per)
    if ctx.scenario == "count":
        s = _choose(rng, (
            f"{name} has {a} {boxes} of {item}. Each {box} holds {b} {item}.",
            f"{name} buys {a} {boxes} of {item} with {b} {item} in each {box}.",
        ))
    elif ctx.scenario == "shop":
        s = _choose(rng, (
            f"{name} buys {a} {item} for ${b} each.",
            f"{name} buys {a} {item}. Each one costs ${b}.",
        ))
    else:
        s = _choose(rng, (
            f"{name} earns ${b} per hour {item} and works {a} hours.",
            f"{name} works {a} hours {item} at ${b} per hour.",
        ))
    bld.sentences.append(s)
    bld.value = bld.step("total", "x", a, b)


def _pick_final(rng: random.Random, scenario: str) -> str:
    """The kind of a problem's last event: ``plain`` (one more middle event), ``div`` (a fair share) or, when
    shopping, ``change`` (paying with a bill)."""
    opts = ["plain"]
    if scenario in ("count", "shop", "work"):
        opts += ["div"]
    if scenario == "shop":
        opts += ["change", "change"]
    return _choose(rng, opts)


def _share_event(bld: _Builder) -> str | None:
    """The running value shared equally among ``k`` (a divisor in 2..9, drawn from ``bld.rng``) as the last event
    and step; returns its question. None, drawing nothing, when the value has no such divisor."""
    ks = _divisors(bld.value)
    if not ks:
        return None
    rng, ctx = bld.rng, bld.ctx
    Pron, item = ctx.pron.capitalize(), ctx.item
    k = ks[rng.randrange(len(ks))]
    if ctx.scenario == "count":
        shares, share = _SHARES[rng.randrange(len(_SHARES))]
        if shares == "boxes" and item == "beads":
            shares, share = "bags", "bag"
        bld.sentences.append(_choose(rng, (
            f"{Pron} shares the {item} equally among {k} {shares}.",
            f"{Pron} splits the {item} equally into {k} {shares}.",
        )))
        question = f"How many {item} does each {share} get?"
    else:
        shares, share = "people", "person"
        if ctx.scenario == "shop":
            bld.sentences.append(f"{Pron} splits the cost equally among {k} people.")
            question = "How much does each person pay?"
        else:
            bld.sentences.append(f"{Pron} shares the money equally among {k} people.")
            question = "How much does each person get?"
    bld.value = bld.step("div", "/", bld.value, k, _StepSlots(share=share))
    return question


def _change_event(bld: _Builder) -> str:
    """Paying with the smallest bill above the running value as the last event, the change as the last step;
    returns its question."""
    bill = [x for x in (20, 50, 100, 200, 500, 1000, 2000, 5000, 10000) if x > bld.value][0]
    bld.sentences.append(f"{bld.ctx.pron.capitalize()} pays with a ${bill} bill.")
    bld.value = bld.step("change", "-", bill, bld.value)
    return f"How much change does {bld.ctx.pron} get?"


def _last_event(bld: _Builder, final_kind: str | None, box: str, boxes: str) -> str:
    """The last event of a problem whose middle events left one step for it (``div``, ``change``; a ``div`` whose
    value has no divisor becomes a plain add or subtract event) and its question; ``""`` when the problem ends with
    :func:`_default_question` (``plain`` and None: the middle events took every step)."""
    if final_kind == "div":
        question = _share_event(bld)
        if question is not None:
            return question
        final_kind = "plain_last"  # not divisible, and no step left to make it so: a plain +/- event instead
    if final_kind == "change":
        return _change_event(bld)
    if final_kind == "plain_last":
        rng, ctx = bld.rng, bld.ctx
        ev = "sub" if bld.value > 2 and rng.random() < 0.5 else "add"
        _apply_event(bld, ev, rng, ctx.name, ctx.pron, ctx.pron.capitalize(), ctx.pron_poss, ctx.item, box, boxes)
    return ""


def _default_question(rng: random.Random, ctx: ProblemContext) -> str:
    """The question of a problem whose last event asks none: how many are left, or how much was spent or earned.
    It draws a wording for every scenario before picking ``ctx``'s, as it always has (seeded problems depend on
    those draws)."""
    name, pron, item = ctx.name, ctx.pron, ctx.item
    return {
        "count": _choose(rng, (f"How many {item} does {name} have now?",
                               f"How many {item} does {pron} have in the end?")),
        "shop": _choose(rng, (f"How much does {name} spend in total?", f"How much money does {pron} spend?")),
        "work": _choose(rng, (f"How much money does {name} have now?", f"How much does {pron} have in the end?")),
    }[ctx.scenario]


def _generate_one(rng: random.Random, difficulty: int, style: str = "short", voice: int = 0) -> Problem:
    """One problem drawn from ``rng``: a name and scenario, a first product, middle events until the step count
    (or all but the last event's step) is used, the last event, the question; then its steps in ``style``."""
    level = _LEVELS[difficulty]
    if style == "long":
        level = _Level(_LONG_STEPS[difficulty], level.count, level.per, level.delta, level.cap)
    name, gender = _NAMES[rng.randrange(len(_NAMES))]
    pron, pobj, pposs = _PRON[gender]
    scenario = _choose(rng, ("count", "count", "shop", "work"))
    n_steps = _rint(rng, level.steps)
    item, box, boxes, unit = _scenario_item(rng, scenario)
    ctx = ProblemContext(scenario, name, pron, pobj, pposs, unit, item, voice)
    bld = _Builder(ctx, level, rng)
    _first_quantity(bld, box, boxes)

    # middle events until one step is left for the last event (or the steps run out)
    final_kind = _pick_final(rng, scenario) if n_steps - len(bld.comps) >= 1 else None
    reserved = 1 if final_kind in ("div", "change") else 0
    while n_steps - len(bld.comps) > reserved:
        ev = _pick_event(rng, scenario, n_steps - len(bld.comps) - reserved)
        _apply_event(bld, ev, rng, name, pron, pron.capitalize(), pposs, item, box, boxes)
    bld.sentences.append(_last_event(bld, final_kind, box, boxes) or _default_question(rng, ctx))

    calcs = [StepSpec(k, c, slots=sl) for k, c, sl in zip(bld.kinds, bld.comps, bld.slots, strict=False)]
    specs = calcs if style == "short" else _trace_specs(bld, calcs)
    steps = _render_steps(specs, ctx, style)
    return Problem(
        question=" ".join(bld.sentences), steps=steps, answer=bld.comps[-1].result,
        computations=tuple(bld.comps), specs=tuple(specs), difficulty=difficulty, context=ctx, style=style,
    )


def _trace_specs(bld: _Builder, calcs: list[StepSpec]) -> list[StepSpec]:
    """The long style's steps: a plan; per event its restated sentence, its computation(s), a check of the
    event's last computation (the inverse operation) and the running value; a conclusion, ``</think>`` and
    the final answer sentence."""
    n_events = bld.events[-1] + 1
    specs = [StepSpec("plan", value=n_events - 1)]
    for e in range(n_events):
        mine = [i for i, ev in enumerate(bld.events) if ev == e]
        specs.append(StepSpec("given", sentence=bld.sentences[e]))
        specs += [calcs[i] for i in mine]
        last = bld.comps[mine[-1]]
        specs.append(StepSpec("check", inverse_computation(last)))
        specs.append(StepSpec("summary", value=last.result))
    answer = bld.comps[-1].result
    return specs + [StepSpec("conclude", value=answer), StepSpec("close"), StepSpec("final", value=answer)]


def _pick_event(rng: random.Random, scenario: str, room: int) -> str:
    opts = ["add", "sub", "add", "sub", "scale"]
    if room >= 2:
        opts += ["group", "group"]
    if scenario == "count" and room >= 2:
        opts += ["lose_group"]
    return _choose(rng, opts)


def _apply_event(bld: _Builder, ev: str, rng: random.Random, name: str, pron: str, Pron: str, pposs: str,
                 item: str, box: str, boxes: str) -> None:
    lv, ctx, v = bld.level, bld.ctx, bld.value
    sc = ctx.scenario
    if ev == "scale" and v * 2 > lv.cap:
        ev = "sub"
    if ev in ("group", "lose_group"):
        c, d = _rint(rng, lv.count), _rint(rng, lv.per)
        if ev == "group" and v + c * d > lv.cap:
            ev = "sub"
        elif ev == "lose_group" and c * d >= v:
            ev = "sub" if v > 2 else "add"
    if ev == "add" and v + 1 > lv.cap:
        ev = "sub"
    if ev == "sub" and v < 3:
        ev = "add"

    if ev == "add":
        k = min(_rint(rng, lv.delta), lv.cap - v)
        k = max(k, 1)
        if sc == "count":
            other = _OTHERS[rng.randrange(len(_OTHERS))].format(poss=pposs)
            s = _choose(rng, (f"{Pron} finds {k} more {item}.", f"{Pron} gets {k} more {item} from {other}."))
        elif sc == "shop":
            s = _choose(rng, (f"{Pron} pays ${k} for delivery.", f"{Pron} also pays a ${k} fee."))
        else:
            s = _choose(rng, (f"{Pron} gets a ${k} tip.", f"{Pron} also gets a ${k} bonus."))
        bld.sentences.append(s)
        bld.value = bld.step("add", "+", v, k)
    elif ev == "sub":
        k = min(_rint(rng, lv.delta), v - 1)
        k = max(k, 1)
        if sc == "count":
            other = _OTHERS[rng.randrange(len(_OTHERS))].format(poss=pposs)
            s = _choose(rng, (f"{Pron} gives {k} {item} to {other}.", f"{Pron} loses {k} {item}.",
                              f"{Pron} uses {k} {item}."))
        elif sc == "shop":
            s = _choose(rng, (f"{Pron} uses a coupon for ${k} off.", f"{Pron} gets a ${k} discount."))
        else:
            s = _choose(rng, (f"{Pron} spends ${k} on lunch.", f"{Pron} pays ${k} for the bus."))
        bld.sentences.append(s)
        bld.value = bld.step("sub", "-", v, k)
    elif ev == "scale":
        m = 2 if v * 3 > lv.cap or rng.random() < 0.6 else 3
        word = {2: "doubles", 3: "triples"}[m]
        if sc == "count":
            s = f"Then {pron} {word} the number of {item}."
        elif sc == "shop":
            s = f"Then {pron} {word} the order."
        else:
            s = f"Then {pron} {word} {pposs} money."
        bld.sentences.append(s)
        bld.value = bld.step("scale", "x", v, m)
    elif ev == "group":
        if sc == "count":
            s = f"{Pron} buys {c} more {boxes} with {d} {item} each."
            what = f"new {boxes}"
        elif sc == "shop":
            other_items = [x for x in _SHOP_ITEMS if x != item]
            it2 = other_items[rng.randrange(len(other_items))]
            s = _choose(rng, (f"{Pron} also buys {c} {it2} for ${d} each.",
                              f"{Pron} also buys {c} {it2}. Each one costs ${d}."))
            what = it2
        else:
            s = f"{Pron} works {c} more hours at ${d} per hour."
            what = "extra hours"
        bld.sentences.append(s)
        p = bld.step("part", "x", c, d, _StepSlots(what=what))
        bld.value = bld.step("add", "+", v, p)
    elif ev == "lose_group":
        bld.sentences.append(f"{Pron} gives away {c} {boxes} with {d} {item} each.")
        p = bld.step("part", "x", c, d, _StepSlots(what=f"{boxes} given away"))
        bld.value = bld.step("sub", "-", v, p)
    else:  # pragma: no cover - defensive
        raise ValueError(ev)


def generate_problems(n: int, seed: int, difficulty: int = DEFAULT_DIFFICULTY, style: str = "short",
                      voice: int = 0) -> list[Problem]:
    """Generate ``n`` problems, deterministically from ``seed``.

    Args:
        n: number of problems (>= 0).
        seed: int; the same ``(n, seed, difficulty, style)`` always yields the same problems, and the first
            ``k`` problems of a call do not depend on ``n``.
        difficulty: level in :data:`DIFFICULTIES` (default :data:`DEFAULT_DIFFICULTY`): computation count
            (short style 1: 2-3, 2: 2-5, 3: 3-6, 4: 4-8, 5: 5-8; long style 3-4, 4-6, 5-7, 6-8, 7-8) and number
            magnitudes (running values stay <= 60, 100, 500, 2000, 9999).
        style: ``"short"`` (one computation per step) or ``"long"`` (a reasoning trace of 20+ steps at
            difficulty 2; see :class:`Problem`).
        voice: :data:`VOICES` index of the wording function (:func:`step_style`): ``0`` the target's (and the
            evaluation's gold), ``1`` the draft's. The same seed gives the same questions, answers and step
            meanings in every voice; only the words of the steps differ.

    Returns:
        list[:class:`Problem`] of length ``n``.

    Raises:
        ValueError: ``n < 0``, unknown ``difficulty``, ``style`` or ``voice``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if difficulty not in _LEVELS:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if voice not in range(len(VOICES)):
        raise ValueError(f"voice must be an index of {VOICES}, got {voice!r}")
    rng = random.Random(seed)
    return [_generate_one(rng, difficulty, style, voice) for _ in range(n)]


# --------------------------------------------------------------------------------------------------
# Judge pairs


def _change_digit(rng: random.Random, v: int) -> int:
    s = list(str(v))
    i = rng.randrange(len(s))
    choices = [d for d in "0123456789" if d != s[i] and not (i == 0 and d == "0" and len(s) > 1)]
    s[i] = choices[rng.randrange(len(choices))]
    return int("".join(s))


def _other_style(rng: random.Random, spec: StepSpec, frame: int, order: int) -> tuple[int, int]:
    """A (frame, order) that words ``spec`` differently (the same one when the kind has a single wording)."""
    c = spec.computation
    n_frames = len(_FRAMES[spec.kind]) if spec.kind in _FRAMES else len(_TRACE_FRAMES[spec.kind])
    commutes = c is not None and c.op in COMMUTATIVE
    options = [(f, o) for f in range(n_frames) for o in range(2 if commutes else 1)]
    options = [fo for fo in options if fo != (frame, order if commutes else 0)]
    return options[rng.randrange(len(options))] if options else (frame, order)


def generate_step_pairs(n: int, seed: int, difficulty: int | None = None, style: str = "short",
                        kinds: Sequence[str] | None = None) -> list[StepPair]:
    """Labelled step pairs for training / evaluating the judge.

    About half the pairs are equivalent: the same computation in another wording (other sentence frame,
    with or without units, swapped operands of ``+``/``x``), a few identical. The rest are hard negatives:
    the same or another wording with one digit changed in the result or in an operand, other operands
    (a number of the problem), another operation on the same operands, swapped operands of ``-``/``/``, other
    operands with the same result (``2 x 40 = 80`` for ``20 x 4 = 80``), or a different step of the same problem.
    About 6% are answer lines (``"#### N"``: equal, another number, or against a step). Which step is "A" is
    random. Labels come from
    :func:`steps_equivalent` (so they always agree with it).

    Args:
        n: number of pairs (>= 0).
        seed: int; deterministic per ``(n, seed, difficulty, style)``.
        difficulty: problem level, or ``None`` for a mix of all levels.
        style: the problems' style (:data:`STYLES`); ``"long"`` pairs every step kind of the reasoning trace
            (restated givens, checks, summaries, plans, conclusions), with the same kinds of negatives: another
            number, another given or another step of the problem.
        kinds: the step kinds to pair (:attr:`Problem.kinds` values: :data:`STEP_KINDS`, and in the long style
            :data:`TRACE_KINDS` such as ``"given"``); ``None`` pairs every kind. Problems without any of them are
            skipped.

    Returns:
        list[:class:`StepPair`] of length ``n``.

    Raises:
        ValueError: ``n < 0``, unknown ``style``, or ``kinds`` a bare string, empty or naming a kind the style has not.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    allowed = STEP_KINDS + (TRACE_KINDS if style == "long" else ())
    if kinds is not None and (isinstance(kinds, str) or not kinds or set(kinds) - set(allowed)):
        raise ValueError(f"kinds must be step kinds of style {style!r} {allowed}, got {kinds!r}")
    rng = random.Random(seed)
    pairs: list[StepPair] = []
    while len(pairs) < n:
        d = difficulty if difficulty is not None else DIFFICULTIES[rng.randrange(len(DIFFICULTIES))]
        prob = _generate_one(rng, d, style)
        # half the pairs at a uniform position (computations and givens fill most of a trace), half at a
        # uniform kind first: the one-per-problem kinds (plan, conclude, final, ...) get pairs too
        present = sorted(set(prob.kinds) & set(kinds if kinds is not None else prob.kinds))
        if not present:
            continue
        kind = present[rng.randrange(len(present))] if rng.random() < 0.5 else None
        at = [i for i, k in enumerate(prob.kinds) if k == kind or kind is None and k in present]
        pairs.append(_make_pair(rng, prob, at[rng.randrange(len(at))]))
    return pairs


def generate_same_number_pairs(n: int, seed: int, style: str = "long") -> list[StepPair]:
    """Labelled pairs of two steps that state the same set of numbers: the pairs an arithmetic guard (such as
    :func:`lookahead_reasoning.core.verifiers.same_arithmetic`) lets through, so a judge alone must tell them
    apart by their words.

    Pairs come two at a time from one problem: a step ``i`` without a computation (a restated given, a summary, a
    conclusion, the final answer, ...; equations already differ in their operands or result) against another
    such step ``j`` of it that states the same numbers (``"The answer is 401 apples."`` / ``"That puts it at
    401."``; a restated given / another event with the same numbers), in ``j``'s own or another wording; and step
    ``i`` against another wording of itself. So about half are not equivalent (a few ``j`` mean the same as
    ``i``); in :func:`generate_step_pairs` such negatives are about 2% of the pairs. Which step is "A" is random;
    labels come from :func:`steps_equivalent`.

    Args:
        n: number of pairs (>= 0).
        seed: int; deterministic per ``(n, seed, style)``.
        style: the problems' style; only ``"long"`` has steps without a computation. Difficulty is a mix of all
            levels.

    Returns:
        list[:class:`StepPair`] of length ``n``.

    Raises:
        ValueError: ``n < 0`` or a style other than ``"long"``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if style != "long":
        raise ValueError(f"style must be 'long' (the only style with steps without a computation), got {style!r}")
    rng = random.Random(seed)
    pairs: list[StepPair] = []

    def ordered(a: str, b: str) -> StepPair:
        a, b = (a, b) if rng.random() < 0.5 else (b, a)
        return StepPair(a, b, steps_equivalent(a, b))

    while len(pairs) < n:
        prob = _generate_one(rng, DIFFICULTIES[rng.randrange(len(DIFFICULTIES))], style)
        # steps without a computation: an equation's operands and result already tell computations apart
        nums = [frozenset(re.findall(r"\d+", s)) if spec.computation is None else frozenset()
                for s, spec in zip(prob.steps, prob.specs, strict=False)]
        same = [(i, j) for i in range(len(nums)) for j in range(len(nums)) if i != j and nums[i] and nums[i] == nums[j]]
        if not same:
            continue
        i, j = same[rng.randrange(len(same))]
        other = prob.steps[j] if rng.random() < 0.5 else _reworded(rng, prob, j)
        pairs.append(ordered(prob.steps[i], other))
        if len(pairs) < n:
            pairs.append(ordered(prob.steps[i], _reworded(rng, prob, i)))
    return pairs


def _same_result_operands(rng: random.Random, comp: Computation) -> tuple[int, int] | None:
    """Other operands of ``comp``'s operation with the same result (``(2, 40)`` for ``20 x 4 = 80``; never the
    same operands or the commutative swap of them); ``None`` when there are none."""
    x, y, r = *comp.operands, comp.result
    if comp.op == "x":
        cands = [(d, r // d) for d in range(2, r) if r % d == 0]
    elif comp.op == "+":
        cands = [(a, r - a) for a in range(1, r)]
    elif comp.op == "-":
        cands = [(r + b, b) for b in range(1, max(2 * y, 10))]
    else:  # "/"
        cands = [(r * k, k) for k in range(2, max(2 * y, 10))]
    cands = [c for c in cands if set(c) != {x, y} and c != (x, y)]
    return cands[rng.randrange(len(cands))] if cands else None


def _render_steps(specs: Sequence[StepSpec], ctx: ProblemContext, style: str) -> list[str]:
    """Every step of a solution worded for ``ctx`` (its voice included) by :func:`step_style`."""
    return [render_spec(sp, ctx, *step_style(ctx, i, sp.kind if style == "long" else None))
            for i, sp in enumerate(specs)]


def _other_event(rng: random.Random, prob: Problem, spec: StepSpec) -> str:
    """Another given sentence of ``prob`` carrying ``spec``'s numbers ("She loses 9 pencils." for "She finds 9
    more pencils."): a negative that only the words of the event tell apart; ``""`` when the problem has no
    other given with as many numbers."""
    nums = re.findall(r"\d+", spec.sentence)
    others = sorted({sp.sentence for sp in prob.specs if sp.kind == "given" and sp.sentence != spec.sentence
                     and len(re.findall(r"\d+", sp.sentence)) == len(nums)})
    for _ in range(len(others)):
        parts = re.split(r"(\d+)", others[rng.randrange(len(others))])
        parts[1::2] = nums
        text = "".join(parts)
        if _norm_text(text) != _norm_text(spec.sentence):
            return text
    return ""


def _style_at(prob: Problem, j: int) -> tuple[int, int]:
    return step_style(prob.context, j, prob.specs[j].kind if prob.style == "long" else None)


def _variant(prob: Problem, j: int, frame_order: tuple[int, int], c: Computation | None = None, **changes) -> str:
    """Step ``j`` of ``prob`` worded with ``frame_order`` (frame, operand order), its computation replaced by ``c``
    (kept when None) and other :class:`StepSpec` fields by ``changes``."""
    spec = prob.specs[j]
    spec = replace(spec, computation=c if c is not None else spec.computation, **changes)
    return render_spec(spec, prob.context, *frame_order)


def _reworded(rng: random.Random, prob: Problem, j: int) -> str:
    """Step ``j`` of ``prob`` unchanged in meaning, in another wording than its gold one (drawn from ``rng``)."""
    return _variant(prob, j, _other_style(rng, prob.specs[j], *_style_at(prob, j)))


def _maybe_reworded(rng: random.Random, prob: Problem, j: int, c: Computation | None = None, **changes) -> str:
    """:func:`_variant` of step ``j`` in its gold wording or, half the time, in another one (drawn from ``rng``)."""
    frame_order = _style_at(prob, j)
    if rng.random() < 0.5:
        return _variant(prob, j, frame_order, c, **changes)
    return _variant(prob, j, _other_style(rng, prob.specs[j], *frame_order), c, **changes)


def _another_step(rng: random.Random, prob: Problem, j: int) -> str:
    """A step of ``prob`` other than ``j``, in its gold wording or, half the time, in another one."""
    others = [i for i in range(len(prob.steps)) if i != j]
    i = others[rng.randrange(len(others))]
    if rng.random() < 0.5:
        return prob.steps[i]
    return _reworded(rng, prob, i)


def _given_number_changed(rng: random.Random, prob: Problem, j: int) -> str:
    """Given step ``j`` with one of its numbers changed in one digit (maybe reworded); another step of ``prob``
    when the sentence has no number."""
    sentence = prob.specs[j].sentence
    nums = re.findall(r"\d+", sentence)
    if not nums:
        return _another_step(rng, prob, j)
    k = rng.randrange(len(nums))
    parts = re.split(r"(\d+)", sentence)
    parts[2 * k + 1] = str(_change_digit(rng, int(nums[k])))
    return _maybe_reworded(rng, prob, j, sentence="".join(parts))


def _counterpart_without_computation(rng: random.Random, prob: Problem, j: int, u: float) -> str:
    """The other side of a pair for trace step ``j`` without arithmetic (plan, given, summary, conclude, close,
    final), chosen by ``u`` in [0, 1): the same text, another wording, another number in the same kind, another
    given with the same numbers, the given with a number changed, or another step."""
    spec = prob.specs[j]
    if u < 0.05 or spec.kind == "close" and u < 0.5:
        return prob.steps[j]
    if u < 0.5:
        return _reworded(rng, prob, j)
    if u < 0.75 and spec.value is not None:  # the same kind stating another number
        return _maybe_reworded(rng, prob, j, value=_change_digit(rng, spec.value))
    if u < 0.62 and spec.kind == "given" and (event := _other_event(rng, prob, spec)):
        return _maybe_reworded(rng, prob, j, sentence=event)  # the same numbers, another event
    if u < 0.75 and spec.kind == "given":  # the same sentence with one number changed
        return _given_number_changed(rng, prob, j)
    return _another_step(rng, prob, j)


def _operand_digit_changed(rng: random.Random, comp: Computation) -> Computation:
    """``comp`` with one digit of one operand changed; its result recomputed half the time (kept when the new
    operands give none, or a negative one)."""
    x, y = comp.operands
    if rng.random() < 0.5:
        ops = (_change_digit(rng, x), y)
    else:
        ops = (x, _change_digit(rng, y))
    r = _apply(comp.op, *ops)
    if r is None or r < 0 or rng.random() < 0.5:
        r = comp.result
    return Computation(comp.op, ops, r)


def _problem_number_operand(rng: random.Random, prob: Problem, comp: Computation) -> Computation:
    """``comp`` with one operand replaced by another number of ``prob`` (an operand or result of its computations),
    its result recomputed (kept when there is none, or a negative one)."""
    x, y = comp.operands
    numbers = sorted({c.result for c in prob.computations} | {v for c in prob.computations for v in c.operands})
    numbers = [v for v in numbers if v not in comp.operands] or [x + 1]
    v = numbers[rng.randrange(len(numbers))]
    ops = (v, y) if rng.random() < 0.5 else (x, v)
    r = _apply(comp.op, *ops)
    return Computation(comp.op, ops, r if r is not None and r >= 0 else comp.result)


def _other_operation(rng: random.Random, comp: Computation) -> Computation:
    """Another operation on ``comp``'s operands, its result computed (kept when there is none, or a negative one)."""
    x, y = comp.operands
    ops2 = [o for o in OPS if o != comp.op]
    op2 = ops2[rng.randrange(len(ops2))]
    r = _apply(op2, x, y)
    return Computation(op2, comp.operands, r if r is not None and r >= 0 else comp.result)


def _counterpart_with_computation(rng: random.Random, prob: Problem, j: int, u: float) -> str:
    """The other side of a pair for step ``j`` with a computation, chosen by ``u`` in [0, 1): the same text,
    another wording, or a hard negative (a result or operand digit changed, another number of the problem as an
    operand, another operation, swapped operands of ``-``/``/``, other operands with the same result, another
    step)."""
    comp = prob.specs[j].computation
    x, y = comp.operands
    if u < 0.05:
        return prob.steps[j]
    if u < 0.5:
        return _reworded(rng, prob, j)
    if u < 0.64:  # result digit changed
        return _maybe_reworded(rng, prob, j, Computation(comp.op, comp.operands, _change_digit(rng, comp.result)))
    if u < 0.74:  # operand digit changed, result unchanged or recomputed
        return _maybe_reworded(rng, prob, j, _operand_digit_changed(rng, comp))
    if u < 0.80:  # another number of the problem as an operand
        return _maybe_reworded(rng, prob, j, _problem_number_operand(rng, prob, comp))
    if u < 0.86:  # another operation on the same operands
        return _maybe_reworded(rng, prob, j, _other_operation(rng, comp))
    if u < 0.90 and comp.op not in COMMUTATIVE:  # swapped operands of - or /
        return _maybe_reworded(rng, prob, j, Computation(comp.op, (y, x), comp.result))
    if u < 0.95 and (ops := _same_result_operands(rng, comp)):  # "2 x 40 = 80" for "20 x 4 = 80"
        return _maybe_reworded(rng, prob, j, Computation(comp.op, ops, comp.result))
    return _another_step(rng, prob, j)


def _answer_line_pair(rng: random.Random, prob: Problem) -> tuple[str, str]:
    """``prob``'s answer line and the other side of its pair: itself, another answer, or the last step."""
    gold = prob.answer_line
    v = rng.random()
    if v < 0.4:
        return gold, gold
    if v < 0.8:
        return gold, ANSWER_PREFIX + str(_change_digit(rng, prob.answer))
    return gold, prob.steps[-1]


def _make_pair(rng: random.Random, prob: Problem, j: int) -> StepPair:
    """A labelled pair of step ``j`` of ``prob`` (its gold text) and a counterpart drawn from ``rng``; for a step
    with a computation, 6% of the time an answer-line pair instead. The order of the two is random; the label is
    :func:`steps_equivalent`."""
    gold = prob.steps[j]
    u = rng.random()
    if prob.specs[j].computation is None:  # trace steps without arithmetic: plan, given, summary, conclude, ...
        other = _counterpart_without_computation(rng, prob, j, u)
    else:
        other = _counterpart_with_computation(rng, prob, j, u)
        if rng.random() < 0.06:  # answer lines: the same, another answer, or a step against an answer line
            gold, other = _answer_line_pair(rng, prob)
    a, b = (gold, other) if rng.random() < 0.5 else (other, gold)
    return StepPair(a, b, steps_equivalent(a, b))
