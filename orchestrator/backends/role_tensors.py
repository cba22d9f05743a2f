"""Tensor codec of the Triton role models (pure numpy): an engine call as tensors and back.

Used by the role models (``lookahead_reasoning.serving.triton_role``) and by the BLS backend that calls them
(:mod:`.triton_bls`), so it lives with the backends. The ``lookahead_reasoning`` model's own inputs are in
:mod:`lookahead_reasoning.core.request`.

Role models (``draft``, ``target``, ``judge``) take one engine call: ``n`` sequences as a padded id matrix (or
texts) plus the request fields as tensors, and return ``n`` results. The tensors (name, Triton data type, dims,
meaning) are defined once, in :data:`ROLE_INPUTS` and :data:`ROLE_OUTPUTS`: the role models' ``config.pbtxt``
(:mod:`lookahead_reasoning.serving.model_repository`), this codec's numpy dtypes and the BLS caller's requested
outputs (:mod:`.triton_bls`) are derived from them, so adding a tensor is one row there plus its encoding here.

Role models are internal: when the server's environment holds :data:`INTERNAL_KEY_ENV` (``serve`` sets a random
one unless ``--open-role-models``), a role model answers only requests whose parameters carry the same value
under :data:`INTERNAL_KEY_PARAM`. The orchestrator's BLS calls add it (:func:`internal_parameters`); a client
outside the server cannot read the environment of Triton's processes, so it cannot call a role model directly.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from .base import GenerationCounters, GenerationRequest, GenerationResult, SamplingParams, SpecDecodeConfig

_DEFAULT_SAMPLING, _DEFAULT_SPEC = SamplingParams(), SpecDecodeConfig()

#: numpy dtype of each Triton data type the role tensors use (``STRING``: Triton's BYTES, UTF-8 ``bytes`` objects).
NUMPY_DTYPES = {"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "STRING": np.object_}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the role models: its name, Triton data type (``config.pbtxt``'s ``TYPE_<dtype>``), dims
    (-1: any size; ``n``: the call's sequences) and meaning."""

    name: str
    dtype: Literal["INT32", "INT64", "FP32", "STRING"]
    dims: tuple[int, ...]
    meaning: str

    @property
    def numpy_dtype(self) -> type:
        return NUMPY_DTYPES[self.dtype]

    def array(self, values) -> np.ndarray:
        """``values`` as this tensor (strings encoded as UTF-8)."""
        if self.dtype == "STRING":
            return np.array([v.encode("utf-8") for v in values], dtype=np.object_)
        return np.array(values, dtype=self.numpy_dtype)


#: Inputs of a role model, all optional (``input_ids`` or ``text_input`` must be given), in ``config.pbtxt`` order.
ROLE_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("input_ids", "INT32", (-1, -1), "[n, L] prompt ids, right-padded with -1 (or text_input)"),
    TensorSpec("input_lengths", "INT32", (-1,), "[n] prompt lengths"),
    TensorSpec("text_input", "STRING", (-1,), "[n] prompt texts (encoded by the model's tokenizer)"),
    TensorSpec("max_tokens", "INT32", (-1,), "[n] max new tokens per sequence"),
    TensorSpec("stop", "STRING", (-1,), "[k] stop strings (shared by the n sequences; optional)"),
    TensorSpec("temperature", "FP32", (-1,), "[n] 0 = greedy (optional)"),
    TensorSpec("top_p", "FP32", (-1,), "[n] nucleus mass (optional)"),
    TensorSpec("top_k", "INT32", (-1,), "[n] top-k, 0 = all (optional)"),
    TensorSpec("seed", "INT64", (-1,), "[n] RNG seed, -1 = none (optional)"),
    TensorSpec("spec_decode", "STRING", (1,), "[1] JSON of SpecDecodeConfig (optional)"),
    TensorSpec("stop_count", "INT32", (1,), "[1] finish at the k-th completed stop string (optional, 1)"),
    TensorSpec("max_tokens_per_stop", "INT32", (1,), "[1] length cap after the last completed stop (optional)"),
    TensorSpec("prediction_ids", "INT32", (-1, -1), "[n, P] predicted continuation ids, right-padded with -1 "
                                                    "(GenerationRequest.prediction; optional)"),
)
#: Outputs of a role model, in ``config.pbtxt`` order (the BLS caller requests them all).
ROLE_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("output_ids", "INT32", (-1, -1), "[n, M] new ids, right-padded with -1"),
    TensorSpec("output_lengths", "INT32", (-1,), "[n] number of new ids"),
    TensorSpec("text_output", "STRING", (-1,), "[n] decoded new text"),
    TensorSpec("finish_reason", "STRING", (-1,), "[n] stop / eos / length / cancelled"),
    TensorSpec("counters", "STRING", (-1,), "[n] JSON of GenerationCounters"),
    TensorSpec("stop_offsets", "STRING", (-1,), "[n] JSON list: new-token count at each completed stop string"),
)
_IN = {t.name: t for t in ROLE_INPUTS}
_OUT = {t.name: t for t in ROLE_OUTPUTS}


def _str(x) -> str:
    return x.decode("utf-8") if isinstance(x, (bytes, bytearray)) else str(x)


def requests_to_arrays(requests: Sequence[GenerationRequest]) -> dict[str, np.ndarray]:
    """Encode an engine call (requests sharing stop strings and SD settings) as role-model inputs.

    Raises:
        ValueError: requests that differ in ``stop`` or ``spec`` (split the call first).
    """
    if not requests:
        raise ValueError("requests: empty call")
    stop, spec = requests[0].stop, requests[0].spec
    limits = (requests[0].stop_count, requests[0].max_tokens_per_stop)
    if any(r.stop != stop or r.spec != spec or (r.stop_count, r.max_tokens_per_stop) != limits for r in requests):
        raise ValueError("requests: one call must share stop strings, stop limits and spec settings")
    n, width = len(requests), max(len(r.prompt_ids) for r in requests)
    ids = np.full((n, width), -1, dtype=_IN["input_ids"].numpy_dtype)
    for i, r in enumerate(requests):
        ids[i, : len(r.prompt_ids)] = r.prompt_ids
    values: dict[str, list] = {
        "input_lengths": [len(r.prompt_ids) for r in requests],
        "max_tokens": [r.max_new_tokens for r in requests],
    }
    # Optional inputs are sent only when they differ from the defaults the model applies: every tensor is
    # one more shared-memory transfer per BLS call, and a greedy step call needs none of them.
    if any(r.sampling != _DEFAULT_SAMPLING for r in requests):
        values["temperature"] = [r.sampling.temperature for r in requests]
        values["top_p"] = [r.sampling.top_p for r in requests]
        values["top_k"] = [r.sampling.top_k for r in requests]
        values["seed"] = [-1 if r.sampling.seed is None else r.sampling.seed for r in requests]
    if spec != _DEFAULT_SPEC:
        values["spec_decode"] = [spec.model_dump_json()]
    if stop:
        values["stop"] = list(stop)
    if limits[0] != 1:
        values["stop_count"] = [limits[0]]
    if limits[1] is not None:
        values["max_tokens_per_stop"] = [limits[1]]
    out = {"input_ids": ids, **{name: _IN[name].array(v) for name, v in values.items()}}
    if any(r.prediction for r in requests):
        pred = np.full((n, max(len(r.prediction) for r in requests)), -1, dtype=_IN["prediction_ids"].numpy_dtype)
        for i, r in enumerate(requests):
            pred[i, : len(r.prediction)] = r.prediction
        out["prediction_ids"] = pred
    return out


def arrays_to_requests(get, encode=None) -> list[GenerationRequest]:
    """Decode role-model inputs; ``get(name)`` returns the array or None; ``encode(text)`` tokenizes
    ``text_input``. Raises ``ValueError`` naming the tensor for malformed inputs."""
    ids, lengths, texts = get("input_ids"), get("input_lengths"), get("text_input")
    if ids is not None:
        if ids.ndim != len(_IN["input_ids"].dims):
            raise ValueError(f"input_ids: expected shape [n, L], got {list(ids.shape)}")
        if lengths is None:
            lengths = np.array([int((row >= 0).sum()) for row in ids])
        if lengths.shape != (ids.shape[0],):
            raise ValueError("input_lengths: must have one length per row of input_ids")
        prompts = [tuple(int(t) for t in row[: int(n)]) for row, n in zip(ids, lengths, strict=False)]
    elif texts is not None:
        if encode is None:
            raise ValueError("text_input: this model cannot encode text")
        prompts = [tuple(encode(_str(t))) for t in texts.reshape(-1)]
    else:
        raise ValueError("input_ids: missing (give input_ids or text_input)")
    n = len(prompts)

    def per_seq(name, default, cast):
        arr = get(name)
        if arr is None:
            return [default] * n
        arr = arr.reshape(-1)
        if arr.shape[0] == 1:
            arr = np.repeat(arr, n)
        if arr.shape[0] != n:
            raise ValueError(f"{name}: expected {n} values, got {arr.shape[0]}")
        return [cast(x) for x in arr]

    max_tokens = per_seq("max_tokens", 16, int)
    # the same defaults requests_to_arrays leaves out (one source: SamplingParams)
    temperature = per_seq("temperature", _DEFAULT_SAMPLING.temperature, float)
    top_p = per_seq("top_p", _DEFAULT_SAMPLING.top_p, float)
    top_k = per_seq("top_k", _DEFAULT_SAMPLING.top_k, int)
    seed = per_seq("seed", -1 if _DEFAULT_SAMPLING.seed is None else _DEFAULT_SAMPLING.seed, int)
    stop_arr = get("stop")
    stop = tuple(_str(s) for s in stop_arr.reshape(-1)) if stop_arr is not None else ()
    spec_arr = get("spec_decode")
    spec = (SpecDecodeConfig.model_validate_json(_str(spec_arr.reshape(-1)[0])) if spec_arr is not None
            else _DEFAULT_SPEC)
    count_arr, cap_arr = get("stop_count"), get("max_tokens_per_stop")
    stop_count = int(count_arr.reshape(-1)[0]) if count_arr is not None else 1
    per_stop = int(cap_arr.reshape(-1)[0]) if cap_arr is not None else None
    pred_arr = get("prediction_ids")
    if pred_arr is not None and (pred_arr.ndim != 2 or pred_arr.shape[0] != n):
        raise ValueError(f"prediction_ids: expected shape [{n}, P], got {list(pred_arr.shape)}")
    out = []
    for i in range(n):
        sampling = SamplingParams(temperature=temperature[i], top_p=top_p[i], top_k=top_k[i],
                                  seed=None if seed[i] < 0 else seed[i])
        pred = () if pred_arr is None else tuple(int(t) for t in np.trim_zeros(pred_arr[i] + 1, "b") - 1)
        out.append(GenerationRequest(prompts[i], max_tokens[i], stop, sampling, spec, stop_count=stop_count,
                                     max_tokens_per_stop=per_stop, prediction=pred))
    return out


#: Default caps of one call to a role model: the orchestrator's largest call is gamma + 1 target branches with
#: gamma <= 32 (``LROptions.max_gamma``), and one request never asks for more than the server's ``max_tokens_limit``.
ROLE_MAX_ROWS = 33
ROLE_MAX_NEW_TOKENS = 4096


def check_role_call(requests: Sequence[GenerationRequest], max_rows: int = ROLE_MAX_ROWS,
                    max_new_tokens: int = ROLE_MAX_NEW_TOKENS) -> None:
    """The limits a role model enforces on every call, its orchestrator's or (with ``serve --open-role-models``)
    anyone's: at most ``max_rows`` sequences, each asking for at most ``max_new_tokens`` (the engine itself checks
    that prompt + new tokens fit the context window, and the token ids).

    Raises:
        ValueError: naming ``rows`` or ``max_new_tokens``.
    """
    if len(requests) > max_rows:
        raise ValueError(f"rows: {len(requests)} sequences in one call exceed this role model's limit of {max_rows}")
    worst = max((r.max_new_tokens for r in requests), default=0)
    if worst > max_new_tokens:
        raise ValueError(f"max_new_tokens: {worst} exceeds this role model's limit of {max_new_tokens}")


def results_to_arrays(results: Sequence[GenerationResult]) -> dict[str, np.ndarray]:
    n, width = len(results), max([len(r.token_ids) for r in results] + [1])
    ids = np.full((n, width), -1, dtype=_OUT["output_ids"].numpy_dtype)
    for i, r in enumerate(results):
        ids[i, : len(r.token_ids)] = r.token_ids
    values = {
        "output_lengths": [len(r.token_ids) for r in results],
        "text_output": [r.text for r in results],
        "finish_reason": [r.finish_reason for r in results],
        "counters": [json.dumps(asdict(r.counters)) for r in results],
        "stop_offsets": [json.dumps(r.stop_offsets) for r in results],
    }
    return {"output_ids": ids, **{name: _OUT[name].array(v) for name, v in values.items()}}


def arrays_to_results(get) -> list[GenerationResult]:
    ids, lengths = get("output_ids"), get("output_lengths")
    texts, reasons, counters = get("text_output"), get("finish_reason"), get("counters")
    offsets = get("stop_offsets")
    out = []
    for i in range(ids.shape[0]):
        n = int(lengths[i])
        out.append(GenerationResult(
            [int(t) for t in ids[i, :n]], _str(texts[i]), _str(reasons[i]),  # type: ignore[arg-type]
            GenerationCounters(**json.loads(_str(counters[i]))),
            stop_offsets=json.loads(_str(offsets[i])) if offsets is not None else [],
        ))
    return out


INTERNAL_KEY_ENV = "LOOKAHEAD_INTERNAL_KEY"
INTERNAL_KEY_PARAM = "lookahead_internal_key"


def internal_parameters() -> dict[str, str]:
    """Request parameters of an internal (BLS) call: the server's key, or none when role models are open."""
    key = os.environ.get(INTERNAL_KEY_ENV)
    return {INTERNAL_KEY_PARAM: key} if key else {}


def is_internal(parameters_json: str | None) -> bool:
    """Whether a role-model request may run: role models are open (no key in the environment), or its parameters
    (Triton's request parameters as JSON) carry the key (constant-time comparison)."""
    key = os.environ.get(INTERNAL_KEY_ENV)
    if not key:
        return True
    given = json.loads(parameters_json or "{}").get(INTERNAL_KEY_PARAM)
    return isinstance(given, str) and hmac.compare_digest(given, key)

