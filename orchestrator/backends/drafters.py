"""The one registry of token-level drafters (SD proposers), keyed by ``SpecDecodeConfig.method``.

The in-process engines (:class:`~.portable.PortableEngine`, :class:`~.llamacpp.LlamaCppEngine`, both on
:class:`~.scheduler.BatchScheduler`) build their proposers from :data:`DRAFTERS` (:func:`make_proposers`) and refuse
a request's method in the same words (:func:`check_method`). The batched proposer interface is
:class:`~.spec_decode.Proposer`; n-gram and draft-model proposers live in :mod:`.spec_decode`, the ones that read the
target's features in :mod:`.medusa` and :mod:`.eagle` (which import :mod:`.spec_decode`, hence this module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .base import SpecDecodeConfig
from .eagle import Eagle3Proposer
from .medusa import MedusaProposer
from .spec_decode import DraftModelProposer, NgramProposer, Proposer


@dataclass(frozen=True)
class Drafter:
    """One token-level SD method (``SpecDecodeConfig.method``) of the in-process engines (:data:`DRAFTERS`).

    Attributes:
        method: the method's name, the registry's key.
        build: the :class:`Proposer` from its source (the draft engine, the heads); a method without a source
            (n-gram) takes none.
        needs: what an engine must be built with to run it (None: nothing), for the refusal.
        runtimes: the runtimes that run it (an engine's ``name``).
        why_not: why the other runtimes do not, for the refusal.
    """

    method: str
    build: Callable[..., Proposer]
    needs: str | None = None
    runtimes: tuple[str, ...] = ("portable", "llamacpp")
    why_not: str = ""


#: The one registry of drafters, keyed by method: the portable and llama.cpp engines build their proposers from it
#: (:func:`make_proposers`) and refuse a request's method with its entry (:func:`check_method`).
DRAFTERS: dict[str, Drafter] = {d.method: d for d in (
    Drafter("ngram", NgramProposer),
    Drafter("draft_model", DraftModelProposer, needs="a draft_engine"),
    Drafter("medusa", MedusaProposer, needs="medusa_heads", runtimes=("portable",),
            why_not="it reads the target's hidden states, which only the portable engine exposes"),
    Drafter("eagle3", Eagle3Proposer, needs="eagle3_head", runtimes=("portable",),
            why_not="it reads the target's hidden states, which only the portable engine exposes"),
)}


def make_proposers(runtime: str, **sources: Any) -> dict[str, Proposer]:
    """The proposers an engine of ``runtime`` runs: each :data:`DRAFTERS` method of that runtime that needs nothing
    (n-gram), or whose source is given (``draft_model=engine``, ``medusa=heads``, ``eagle3=head``; None: not built).

    Raises:
        ValueError: a source for a method that ``runtime`` does not run, or that no drafter has.
    """
    for method in sources:
        if method not in DRAFTERS or runtime not in DRAFTERS[method].runtimes:
            raise ValueError(f"{method}: the {runtime} engine has no drafter of that name")
    out: dict[str, Proposer] = {}
    for method, d in DRAFTERS.items():
        if runtime not in d.runtimes:
            continue
        if d.needs is None:
            out[method] = d.build()
        elif sources.get(method) is not None:
            out[method] = d.build(sources[method])
    return out


def check_method(runtime: str, spec: SpecDecodeConfig, proposers: Mapping[str, Proposer]) -> None:
    """Refuse ``spec.method`` unless an engine of ``runtime`` with ``proposers`` (from :func:`make_proposers`) runs
    it; the same words on every runtime.

    Raises:
        ValueError: ``spec.method: ...``, saying which runtimes run the method and why not this one, or what the
            engine must be built with.
    """
    method = spec.method
    if method == "none" or method in proposers:
        return
    d = DRAFTERS.get(method)
    if d is None:
        raise ValueError(f"spec.method: {method!r} has no drafter (known: {', '.join(DRAFTERS)})")
    if runtime not in d.runtimes:
        here = [m for m, x in DRAFTERS.items() if runtime in x.runtimes]
        raise ValueError(f"spec.method: {method!r} runs on the {', '.join(d.runtimes)} runtime only ({d.why_not}); "
                         f"the {runtime} runtime runs {', '.join(repr(m) for m in here)}")
    raise ValueError(f"spec.method: {method!r} needs an engine built with {d.needs}")
