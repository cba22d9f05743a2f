"""Engine specifications: ``engines/*.yaml``, one file per served model (role, checkpoint, precision, limits).

A spec says how ONE role's model is served in production on NVIDIA GPUs: which Hugging Face checkpoint,
which precision (bf16, FP8 weights via NVIDIA ModelOpt, FP8 KV cache), parallelism and GPU ids, batch and
sequence limits, KV-cache memory and block reuse, token-level drafting (none, n-gram, EAGLE3, draft-target,
Medusa) and CUDA graphs. ``lookahead-reasoning build --spec FILE`` turns it into artifacts (an FP8
checkpoint, the LLM-API options YAML, serve scripts; see :mod:`lookahead_reasoning.production.engine_build`), and the
TensorRT-LLM backend (:mod:`lookahead_reasoning.backends.trtllm`) builds its ``tensorrt_llm.LLM`` from it.

Runtimes (``runtime``):

- ``llmapi``: TensorRT-LLM's LLM API on the PyTorch runtime (the only path upstream keeps after removing
  the TensorRT engine backend on main in 2026; docs ``legacy/tensorrt-backend-removal.md``). Pre-quantized
  ModelOpt checkpoints, ``KvCacheConfig(dtype="fp8")``, EAGLE3 / n-gram / draft-target drafting.
- ``trt-engine``: the legacy TensorRT engine path of TensorRT-LLM <= 1.2.x (``quantize.py`` /
  ``convert_checkpoint.py`` then ``trtllm-build``); the only one with Medusa heads.
- ``portable``: our PyTorch/transformers engine (CPU or one GPU): n-gram / draft-model drafting from an engine
  spec (the engine also runs Medusa and EAGLE-3 heads, but takes them from a profile's ``medusa:`` / ``eagle3:``
  fields, not from engine specs), no FP8 KV cache, no tensor or pipeline parallelism.

Which drafting method runs where (upstream: ``tensorrt_llm/llmapi/llm_args.py``, each decoding config's
``supports_backend``; docs ``features/speculative-decoding.md``):

============  ======  ==========  ========
method        llmapi  trt-engine  portable
============  ======  ==========  ========
none          yes     yes         yes
ngram         yes     no          yes
eagle3        yes     no          no
draft_target  yes     no          yes (``draft_model``)
medusa        no      yes         no
============  ======  ==========  ========

Invalid combinations raise ``ValueError`` (pydantic's ``ValidationError`` is one) whose message starts with
the offending field's dotted path, e.g. ``drafting.method: ...``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Role = Literal["target", "draft", "judge"]
SpecRuntime = Literal["llmapi", "trt-engine", "portable"]
RUNTIMES: tuple[str, ...] = ("llmapi", "trt-engine", "portable")

#: Smallest CUDA compute capability with FP8 tensor cores (Ada 8.9, Hopper 9.0, Blackwell 10.0).
FP8_MIN_COMPUTE_CAPABILITY = 8.9

#: Where build artifacts go by default (ignored by git): ``<repo>/engines/built/<name>``.
ENGINES_DIR = Path(os.environ.get("LOOKAHEAD_ENGINES_DIR", Path(__file__).resolve().parents[2] / "engines"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CalibrationSpec(_Strict):
    """Calibration data for FP8 post-training quantization (ModelOpt ``mtq.quantize`` forward loop).

    ``dataset``: ``synthetic`` (problems from the synthetic task's generator with ``seed``; the quantization
    script refuses the held-out evaluation seeds, so calibration never sees evaluation problems) or a JSONL file
    of GSM8K-format rows (``question`` / ``answer``). Each sample is the chat-templated question plus its worked
    answer, truncated to ``max_seq_len`` tokens.
    """

    dataset: str = "synthetic"
    samples: int = Field(512, ge=1, le=65536, description="calibration sequences (upstream quantize.py --calib_size)")
    max_seq_len: int = Field(512, ge=8, description="tokens per calibration sequence")
    seed: int = Field(1_000_003, ge=0, description="synthetic-problem seed (the build refuses a held-out seed: "
                                                   "build_scripts/quantize_fp8.py)")


class PrecisionSpec(_Strict):
    """Numeric formats.

    ``dtype``: compute dtype of unquantized layers (LLM API ``dtype``; ``trtllm-build`` via the checkpoint).
    ``weights``: ``unquantized`` (weights in ``dtype``) or ``fp8`` (ModelOpt FP8 E4M3, per-tensor weight
    scale and static per-tensor activation scale; exported as a Hugging Face checkpoint with
    ``hf_quant_config.json``; upstream ``quantize.py --qformat fp8``).
    ``kv_cache``: ``auto`` (the model dtype) or ``fp8`` (LLM API ``KvCacheConfig(dtype="fp8")``; KV scales
    calibrated by ModelOpt ``FP8_KV_CFG``; upstream ``quantize.py --kv_cache_dtype fp8``).
    """

    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    weights: Literal["unquantized", "fp8"] = "unquantized"
    kv_cache: Literal["auto", "fp8"] = "auto"
    calibration: CalibrationSpec = CalibrationSpec()

    @property
    def needs_quantization(self) -> bool:
        """True when a ModelOpt step must produce a quantized checkpoint (FP8 weights or FP8 KV scales)."""
        return self.weights == "fp8" or self.kv_cache == "fp8"


class ParallelSpec(_Strict):
    """Model parallelism of ONE engine replica (LLM API ``tensor_parallel_size`` / ``pipeline_parallel_size``;
    ``trtllm-build`` takes them from the converted checkpoint's ``--tp_size`` / ``--pp_size``)."""

    tensor: int = Field(1, ge=1, le=64)
    pipeline: int = Field(1, ge=1, le=64)

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline


class LimitsSpec(_Strict):
    """Engine limits (LLM API ``max_batch_size``, ``max_input_len``, ``max_seq_len``, ``max_num_tokens``;
    the same ``trtllm-build`` flags on the legacy path). Units: sequences and tokens."""

    max_batch_size: int = Field(64, ge=1, description="concurrent sequences per engine")
    max_input_len: int = Field(4096, ge=1, description="prompt tokens")
    max_seq_len: int = Field(8192, ge=2, description="prompt + generated tokens")
    max_num_tokens: int = Field(8192, ge=1, description="tokens per engine iteration (all sequences)")

    @model_validator(mode="after")
    def _check(self) -> LimitsSpec:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(f"limits.max_input_len: {self.max_input_len} must be < max_seq_len {self.max_seq_len}")
        return self


class KvCacheSpec(_Strict):
    """Paged KV cache (LLM API ``KvCacheConfig``; Triton legacy ``kv_cache_free_gpu_mem_fraction`` /
    ``enable_kv_cache_reuse``). Block reuse is what makes Lookahead Reasoning's ``gamma + 1`` branches with a
    shared prefix cheap: keep it on for the target."""

    free_gpu_memory_fraction: float = Field(0.85, gt=0.0, le=1.0,
                                            description="share of free GPU memory (after weights) for KV blocks")
    enable_block_reuse: bool = True
    tokens_per_block: int | None = Field(None, ge=1, le=1024, description="tokens per KV block (power of two)")

    @field_validator("tokens_per_block")
    @classmethod
    def _pow2(cls, v: int | None) -> int | None:
        if v is not None and v & (v - 1):
            raise ValueError(f"must be a power of two, got {v}")
        return v


class NoDrafting(_Strict):
    method: Literal["none"] = "none"


class NGramDrafting(_Strict):
    """Prompt-lookup drafting (LLM API ``NGramDecodingConfig``). Reference LR setting: 6 tokens, n-gram 2."""

    method: Literal["ngram"] = "ngram"
    max_draft_len: int = Field(6, ge=1, le=64, description="draft tokens per step")
    max_matching_ngram_size: int = Field(2, ge=1, le=16, description="longest suffix matched")
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


class Eagle3Drafting(_Strict):
    """EAGLE-3 draft head (LLM API ``Eagle3DecodingConfig``; PyTorch runtime only)."""

    method: Literal["eagle3"] = "eagle3"
    max_draft_len: int = Field(3, ge=1, le=64)
    checkpoint: str = Field(..., min_length=1, description="EAGLE3 draft head: Hugging Face id or local folder")
    one_model: bool = Field(True, description="draft head runs inside the target model (eagle3_one_model)")
    layers_to_capture: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="target layers whose OUTPUTS feed the head (eagle3_layers_to_capture; TensorRT-LLM's "
                          "default {1, L//2-1, L-4}); a local head's config.json fixes them (its "
                          "eagle_aux_hidden_state_layer_ids are layer inputs, i.e. these + 1)")


class DraftTargetDrafting(_Strict):
    """A separate small model proposes tokens (LLM API ``DraftTargetDecodingConfig``; same tokenizer as the
    target). On the portable runtime this is the ``draft_model`` method with the profile's draft engine."""

    method: Literal["draft_target"] = "draft_target"
    max_draft_len: int = Field(4, ge=1, le=64)
    checkpoint: str = Field(..., min_length=1, description="draft model: Hugging Face id or local folder")


class MedusaDrafting(_Strict):
    """Medusa heads on a TensorRT engine (legacy path, TensorRT-LLM <= 1.2.x: ``convert_checkpoint.py
    --medusa_model_dir`` then ``trtllm-build --speculative_decoding_mode medusa``)."""

    method: Literal["medusa"] = "medusa"
    max_draft_len: int = Field(63, ge=1, le=256, description="tree size (trtllm-build --max_draft_len)")
    checkpoint: str = Field(..., min_length=1, description="Medusa heads folder")
    num_heads: int = Field(4, ge=1, le=16)
    num_layers: int = Field(1, ge=1, le=8, description="residual blocks per head (--num_medusa_layers)")
    choices: list[list[int]] | None = Field(None, description="Medusa tree (runtime medusa_choices)")


Drafting = Annotated[
    NoDrafting | NGramDrafting | Eagle3Drafting | DraftTargetDrafting | MedusaDrafting,
    Field(discriminator="method"),
]

#: drafting method -> runtimes that support it (see the module docstring table).
DRAFTING_RUNTIMES: dict[str, tuple[str, ...]] = {
    "none": ("llmapi", "trt-engine", "portable"),
    "ngram": ("llmapi", "portable"),
    "eagle3": ("llmapi",),
    "draft_target": ("llmapi", "portable"),
    "medusa": ("trt-engine",),
}


class CudaGraphSpec(_Strict):
    """CUDA graphs for decode iterations (LLM API ``CudaGraphConfig``; ``null`` in the options YAML turns them
    off). ``max_batch_size`` defaults to ``limits.max_batch_size``; ``batch_sizes`` lists the captured sizes
    explicitly instead. Legacy engines capture graphs at run time (Triton ``cuda_graph_mode``), not here."""

    enabled: bool = True
    max_batch_size: int | None = Field(None, ge=1)
    batch_sizes: list[int] | None = None
    enable_padding: bool = True

    @model_validator(mode="after")
    def _check(self) -> CudaGraphSpec:
        if self.batch_sizes is not None:
            if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
                raise ValueError("cuda_graphs.batch_sizes: must be a non-empty list of sizes >= 1")
            if self.max_batch_size is not None and self.max_batch_size != max(self.batch_sizes):
                raise ValueError("cuda_graphs.max_batch_size: must equal max(batch_sizes) when both are given")
        return self


_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class EngineSpec(_Strict):
    """One served model. See the module docstring; every field maps to an upstream argument named in the
    field's own docstring. Load with :func:`load_spec`, write with :func:`dump_spec`."""

    name: str = Field(..., description="lower-case slug; names the build folder engines/built/<name>")
    role: Role
    checkpoint: str = Field(..., min_length=1, description="Hugging Face id (e.g. Qwen/Qwen3-32B) or local folder")
    tokenizer: str | None = Field(None, description="tokenizer folder or id (default: checkpoint)")
    runtime: SpecRuntime = "llmapi"
    precision: PrecisionSpec = PrecisionSpec()
    parallel: ParallelSpec = ParallelSpec()
    gpus: list[int] = Field(default_factory=lambda: [0], description="CUDA device ids this role may use")
    gpu_compute_capability: float = Field(9.0, ge=7.0, le=12.9,
                                          description="of the target GPUs (H100/H200 9.0, L40S 8.9, A100 8.0)")
    limits: LimitsSpec = LimitsSpec()
    kv_cache: KvCacheSpec = KvCacheSpec()
    drafting: Drafting = NoDrafting()
    cuda_graphs: CudaGraphSpec = CudaGraphSpec()
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of this role's trtllm-serve / OpenAI server")
    trust_remote_code: bool = False
    output_dir: str | None = Field(None, description="build folder (default engines/built/<name>)")

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} is not a lower-case slug (letters, digits, '.', '_', '-')")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("list at least one GPU id")
        if any(g < 0 for g in v):
            raise ValueError(f"GPU ids must be >= 0, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"GPU ids must be distinct, got {v}")
        return v

    @model_validator(mode="after")
    def _combinations(self) -> EngineSpec:
        method = self.drafting.method
        allowed = DRAFTING_RUNTIMES[method]
        if self.runtime not in allowed:
            hint = {
                "medusa": "Medusa heads exist only on the legacy TensorRT engine path (runtime: trt-engine, "
                          "TensorRT-LLM <= 1.2.x); the PyTorch runtime (llmapi) has no Medusa support",
                "eagle3": "EAGLE3 runs on the LLM API PyTorch runtime only (runtime: llmapi)",
                "ngram": "NGramDecodingConfig supports the PyTorch runtime only (runtime: llmapi or portable)",
                "draft_target": "DraftTargetDecodingConfig supports the PyTorch runtime only (runtime: llmapi "
                                "or portable)",
            }[method]
            raise ValueError(f"drafting.method: {method!r} is not available with runtime {self.runtime!r}: {hint}")
        world = self.parallel.world_size
        if len(self.gpus) % world:
            raise ValueError(
                f"parallel.tensor: tensor ({self.parallel.tensor}) x pipeline ({self.parallel.pipeline}) = {world} "
                f"GPUs per replica does not divide the {len(self.gpus)} GPU ids listed in gpus {self.gpus}"
            )
        if self.runtime == "portable":
            if world > 1:
                raise ValueError("parallel.tensor: the portable runtime runs on one device; tensor and pipeline "
                                 "parallel sizes must be 1")
            if self.precision.kv_cache == "fp8":
                raise ValueError("precision.kv_cache: the portable runtime keeps the KV cache in the compute dtype; "
                                 "an FP8 KV cache needs runtime llmapi or trt-engine")
            if self.precision.weights == "fp8":
                raise ValueError("precision.weights: the portable runtime has no FP8 kernels; serve the FP8 "
                                 "checkpoint on runtime llmapi (or evaluate its dequantized copy, see "
                                 "build_scripts/quantize_fp8.py)")
        fp8 = self.precision.weights == "fp8" or self.precision.kv_cache == "fp8"
        if fp8 and self.gpu_compute_capability < FP8_MIN_COMPUTE_CAPABILITY:
            which = "precision.weights" if self.precision.weights == "fp8" else "precision.kv_cache"
            raise ValueError(
                f"{which}: FP8 needs GPUs of compute capability >= {FP8_MIN_COMPUTE_CAPABILITY} (Ada, Hopper, "
                f"Blackwell); gpu_compute_capability is {self.gpu_compute_capability}"
            )
        if self.role == "judge" and method != "none":
            raise ValueError("drafting.method: the judge reads ONE token per call, so token-level drafting cannot "
                             "speed it up; use method: none")
        cg = self.cuda_graphs
        top = cg.max_batch_size or (max(cg.batch_sizes) if cg.batch_sizes else None)
        if cg.enabled and top is not None and top > self.limits.max_batch_size:
            raise ValueError(f"cuda_graphs.max_batch_size: {top} exceeds limits.max_batch_size "
                             f"{self.limits.max_batch_size}")
        if method != "none" and self.drafting.max_draft_len >= self.limits.max_seq_len:  # type: ignore[union-attr]
            raise ValueError("drafting.max_draft_len: must be smaller than limits.max_seq_len")
        return self

    # -- derived values ---------------------------------------------------------------------------------
    @property
    def replicas(self) -> int:
        """Data-parallel engine replicas: ``len(gpus) / (tensor * pipeline)``."""
        return len(self.gpus) // self.parallel.world_size

    def replica_gpus(self, index: int = 0) -> list[int]:
        """GPU ids of replica ``index`` (consecutive slices of ``gpus``)."""
        w = self.parallel.world_size
        if not 0 <= index < self.replicas:
            raise ValueError(f"replica: index {index} outside [0, {self.replicas})")
        return self.gpus[index * w:(index + 1) * w]

    def build_dir(self) -> Path:
        """Where ``lookahead-reasoning build`` writes (``output_dir`` or ``engines/built/<name>``)."""
        if self.output_dir:
            p = Path(self.output_dir)
            return p if p.is_absolute() else ENGINES_DIR.parent / p
        return ENGINES_DIR / "built" / self.name

    def tokenizer_source(self) -> str:
        return self.tokenizer or self.checkpoint

    def served_checkpoint(self) -> str:
        """The checkpoint the runtime loads: the quantized export when the build quantizes, else ``checkpoint``."""
        if self.runtime == "llmapi" and self.precision.needs_quantization:
            return str(self.build_dir() / "checkpoint")
        if self.runtime == "trt-engine":
            return str(self.build_dir() / "engine")
        return self.checkpoint


# -- YAML I/O --------------------------------------------------------------------------------------------

def _format_validation(exc: ValidationError, source: str) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()) if not isinstance(x, int))
    # Discriminated unions put the tag in the location (drafting.medusa.checkpoint): keep it readable.
    msg = str(first.get("msg", exc)).replace("Value error, ", "")
    head, sep, _ = msg.partition(":")
    # Model-level validators name the field themselves ("drafting.method: ..."), relative to the root.
    if sep and re.fullmatch(r"[A-Za-z_][\w.]*", head) and (not loc or head.startswith(loc)):
        return f"{msg} (in {source})"
    return f"{loc}: {msg} (in {source})" if loc else f"{msg} (in {source})"


def spec_from_dict(data: Any, source: str = "<spec>") -> EngineSpec:
    """Validate a mapping as an :class:`EngineSpec`.

    Raises:
        ValueError: not a mapping, or invalid (the message starts with the field's dotted path).
    """
    if not isinstance(data, dict):
        raise ValueError(f"spec: {source} does not hold a mapping")
    try:
        return EngineSpec.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_format_validation(exc, source)) from None


def load_spec(path: str | Path) -> EngineSpec:
    """Read and validate ``engines/X.yaml``.

    Raises:
        FileNotFoundError: no such file. ValueError: invalid YAML or spec (naming the field and the file).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"spec: no such file {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"spec: {p} is not valid YAML ({exc})") from None
    return spec_from_dict(data, str(p))


def dump_spec(spec: EngineSpec) -> str:
    """YAML text of ``spec`` that :func:`load_spec` reads back to an equal spec (``None`` fields omitted)."""
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)


def with_runtime(spec: EngineSpec, runtime: str) -> EngineSpec:
    """``spec`` re-validated with another runtime (``build --runtime``).

    Raises:
        ValueError: unknown runtime, or a combination the new runtime does not support.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime: unknown runtime {runtime!r} (choose from {', '.join(RUNTIMES)})")
    data = spec.model_dump(mode="json", exclude_none=True)
    data["runtime"] = runtime
    return spec_from_dict(data, f"{spec.name} with runtime {runtime}")


# -- the LLM-API options (the same mapping `trtllm-serve --config` reads) --------------------------------

#: Our drafting method -> the LLM API ``decoding_type`` tag (``speculative_config.decoding_type``).
DECODING_TYPES = {"ngram": "NGram", "eagle3": "Eagle3", "draft_target": "Draft_Target", "medusa": "Medusa"}


def eagle3_layers_to_capture(d: Eagle3Drafting) -> list[int] | None:
    """The target layers (outputs) an EAGLE-3 head reads, for ``eagle3_layers_to_capture``.

    Where ``d.checkpoint`` is a local folder, it must be an EAGLE-3 head in the layout
    ``Eagle3DecodingConfig(speculative_model_dir=...)`` loads (SafeAILab/EAGLE's: a one-layer
    ``LlamaForCausalLMEagle3`` ``config.json``, ``model.safetensors`` or ``pytorch_model.bin``); its
    ``eagle_aux_hidden_state_layer_ids`` (layer inputs, vLLM's convention) minus one are the layers, and a
    ``d.layers_to_capture`` that differs is refused. Otherwise (a production host's path, a Hugging Face id, a head
    naming no layers) ``d.layers_to_capture`` as given, None meaning TensorRT-LLM's default.

    Raises:
        ValueError: naming ``drafting.checkpoint`` or ``drafting.layers_to_capture``.
    """
    given = sorted(d.layers_to_capture) if d.layers_to_capture is not None else None
    folder = Path(d.checkpoint)
    if not folder.is_dir():
        return given
    if not any((folder / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise ValueError(f"drafting.checkpoint: {folder} holds no model.safetensors or pytorch_model.bin")
    try:
        cfg = json.loads((folder / "config.json").read_text())
        layers = int(cfg["num_hidden_layers"])
        aux = cfg.get("eagle_aux_hidden_state_layer_ids")
        capture = sorted(int(i) - 1 for i in aux) if aux else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"drafting.checkpoint: {folder}/config.json is not a draft-model config "
                         f"(bad or missing {exc})") from None
    if layers != 1 or not any("Eagle3" in a for a in cfg.get("architectures") or []):
        raise ValueError(f"drafting.checkpoint: {folder} is not an EAGLE-3 head (architectures "
                         f"{cfg.get('architectures')}, {layers} layers)")
    if capture is None:
        return given
    if min(capture) < 0:
        raise ValueError(f"drafting.checkpoint: {folder} reads the embeddings (eagle_aux_hidden_state_layer_ids "
                         f"{aux}), which TensorRT-LLM cannot capture")
    if given is not None and given != capture:
        raise ValueError(f"drafting.layers_to_capture: {given}, but the head was trained on the outputs of layers "
                         f"{capture} (eagle_aux_hidden_state_layer_ids {aux})")
    return capture


def speculative_options(spec: EngineSpec) -> dict | None:
    """``speculative_config`` mapping for the LLM API, or ``None`` without drafting.

    Keys follow ``tensorrt_llm.llmapi`` decoding configs: ``decoding_type``, ``max_draft_len``,
    ``speculative_model_dir`` (the field ``speculative_model`` accepts this name as an alias in current
    releases; 1.0-1.2 know only this one), NGram's ``max_matching_ngram_size`` / ``is_keep_all`` /
    ``is_use_oldest`` / ``is_public_pool``, EAGLE3's ``eagle3_one_model`` and ``eagle3_layers_to_capture``.
    """
    d = spec.drafting
    if d.method == "none":
        return None
    out: dict[str, Any] = {"decoding_type": DECODING_TYPES[d.method], "max_draft_len": d.max_draft_len}
    if isinstance(d, NGramDrafting):
        out.update(max_matching_ngram_size=d.max_matching_ngram_size, is_keep_all=d.is_keep_all,
                   is_use_oldest=d.is_use_oldest, is_public_pool=d.is_public_pool)
    elif isinstance(d, Eagle3Drafting):
        out.update(speculative_model_dir=d.checkpoint, eagle3_one_model=d.one_model)
        layers = eagle3_layers_to_capture(d)
        if layers is not None:
            out["eagle3_layers_to_capture"] = layers
    elif isinstance(d, DraftTargetDrafting):
        out.update(speculative_model_dir=d.checkpoint)
    elif isinstance(d, MedusaDrafting):
        out.update(num_medusa_heads=d.num_heads)
        if d.choices is not None:
            out["medusa_choices"] = d.choices
    return out


def llm_api_options(spec: EngineSpec) -> dict:
    """Keyword arguments of ``tensorrt_llm.LLM`` besides ``model`` / ``tokenizer``, as plain data.

    The same mapping is the ``trtllm-serve MODEL --config FILE`` YAML (``--extra_llm_api_options`` before
    1.2), since both feed ``TorchLlmArgs``. Sources: ``llm-api/reference`` pages of ``LLM``,
    ``KvCacheConfig`` (``free_gpu_memory_fraction``, ``enable_block_reuse``, ``dtype``, ``tokens_per_block``),
    ``CudaGraphConfig`` (``max_batch_size``, ``batch_sizes``, ``enable_padding``) and the decoding configs
    (:func:`speculative_options`). ``disable_overlap_scheduler`` is set for n-gram and draft-target drafting
    as upstream's speculative-decoding examples do.

    Raises:
        ValueError: ``spec.runtime`` is not ``llmapi``.
    """
    if spec.runtime != "llmapi":
        raise ValueError(f"runtime: LLM-API options exist for runtime 'llmapi', not {spec.runtime!r}")
    kv: dict[str, Any] = {
        "free_gpu_memory_fraction": spec.kv_cache.free_gpu_memory_fraction,
        "enable_block_reuse": spec.kv_cache.enable_block_reuse,
        "dtype": "fp8" if spec.precision.kv_cache == "fp8" else "auto",
    }
    if spec.kv_cache.tokens_per_block is not None:
        kv["tokens_per_block"] = spec.kv_cache.tokens_per_block
    opts: dict[str, Any] = {
        "dtype": spec.precision.dtype,
        "tensor_parallel_size": spec.parallel.tensor,
        "pipeline_parallel_size": spec.parallel.pipeline,
        "max_batch_size": spec.limits.max_batch_size,
        "max_input_len": spec.limits.max_input_len,
        "max_seq_len": spec.limits.max_seq_len,
        "max_num_tokens": spec.limits.max_num_tokens,
        "kv_cache_config": kv,
        "trust_remote_code": spec.trust_remote_code,
    }
    cg = spec.cuda_graphs
    if cg.enabled:
        graph: dict[str, Any] = {"enable_padding": cg.enable_padding}
        if cg.batch_sizes is not None:
            graph["batch_sizes"] = sorted(set(cg.batch_sizes))
        else:
            graph["max_batch_size"] = cg.max_batch_size or spec.limits.max_batch_size
        opts["cuda_graph_config"] = graph
    else:
        opts["cuda_graph_config"] = None
    specd = speculative_options(spec)
    if specd is not None:
        opts["speculative_config"] = specd
        if spec.drafting.method in ("ngram", "draft_target"):
            opts["disable_overlap_scheduler"] = True
    return opts


__all__ = [
    "CalibrationSpec", "CudaGraphSpec", "DECODING_TYPES", "DRAFTING_RUNTIMES", "DraftTargetDrafting",
    "Eagle3Drafting", "EngineSpec", "KvCacheSpec", "LimitsSpec", "MedusaDrafting", "NGramDrafting", "NoDrafting",
    "ParallelSpec", "PrecisionSpec", "RUNTIMES", "dump_spec", "llm_api_options", "load_spec", "spec_from_dict",
    "speculative_options", "with_runtime",
]
