"""The request: what a caller may ask for, defined once for every front.

A request enters through four fronts: the command line (``generate``'s flags), the ``lookahead_reasoning``
Triton model (its input tensors, ``config.pbtxt`` and the client's tensor types), the OpenAI-compatible HTTP
front (JSON body fields) and the Python API. :data:`FIELDS` lists every field once, with its type and its name
on each front; the CLI flags, the Triton input list, ``config.pbtxt``, the client's tensor types and the OpenAI
body model are derived from it. :class:`LRRequest` holds the typed values, and :func:`parse_request` is the
one validation and the one conversion to :class:`~lookahead_reasoning.core.lookahead.LROptions`. The limits that
the options themselves carry (``gamma >= 0``, ``0 < top_p <= 1``, ...) are checked there, by ``LROptions``.

Errors are :class:`RequestError` (a field and a message). Each front names the field in its own terms with
:meth:`RequestError.for_front` / :func:`front_error`: ``--gamma`` on the command line, ``text_input`` on Triton
and ``prompt`` elsewhere, ``messages[1].role`` for one message's role.

Triton tensor conventions follow Triton's LLM backends (names as in its vLLM backend): ``text_input`` or
``messages`` (JSON), ``max_tokens``, ``stream``, sampling fields, ``stop`` (a list), vLLM's
``include_stop_str_in_output`` (every front leaves the matched stop string out of the text unless it is true), then
this model's own:
``mode``, ``gamma``, ``judge``, ``async``, ``adaptive_gamma``, ``width``, ``delimiter``, ``max_step_tokens``;
``seed`` -1 means none (the role models' convention). Outputs: ``text_output`` and ``metrics`` (JSON).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from ..backends.base import SdMethod
from .errors import FieldError, describe, field_path, from_validation
from .lookahead import MODES, LROptions, Message, Mode, check_input, with_overrides
from .steps import StopTrimmer
from .verifiers import JUDGES, JudgeName

SD_METHODS: tuple[str, ...] = get_args(SdMethod)

Front = Literal["cli", "triton", "openai", "python"]


@dataclass(frozen=True)
class RequestField:
    """One request field and its name on every front.

    Attributes:
        name: the canonical (Python API) name, an attribute of :class:`LRRequest`.
        dtype: Triton data type without its prefix: ``STRING``, ``INT32``, ``INT64``, ``FP32`` or ``BOOL``.
        many: a list (tensor dims ``[ -1 ]``) rather than one value (``[ 1 ]``).
        triton: the input tensor's name. cli: the flag (None: not on the command line). openai: the JSON body
            key (None: not in the OpenAI front).
        help: one line for ``--help``.
    """

    name: str
    dtype: Literal["STRING", "INT32", "INT64", "FP32", "BOOL"]
    many: bool
    triton: str
    cli: str | None
    openai: str | None
    help: str

    def front_name(self, front: Front) -> str:
        """This field's name on ``front`` (the canonical name where the front has none of its own)."""
        own = {"cli": self.cli, "triton": self.triton, "openai": self.openai}.get(front)
        return own or self.name


FIELDS: tuple[RequestField, ...] = (
    RequestField("prompt", "STRING", False, "text_input", "--prompt", "prompt",
                 "the prompt (a model with a chat template gets it as one user message)"),
    RequestField("messages", "STRING", False, "messages", "--messages", "messages",
                 'chat messages as JSON: [{"role": "system|user|assistant", "content": "..."}]'),
    RequestField("max_tokens", "INT64", False, "max_tokens", "--max-tokens", "max_tokens", "new-token budget"),
    RequestField("stream", "BOOL", False, "stream", None, "stream", "one response per decided step"),
    RequestField("temperature", "FP32", False, "temperature", "--temperature", "temperature",
                 "0 = greedy (default); at most 2"),
    RequestField("top_p", "FP32", False, "top_p", "--top-p", "top_p", "nucleus sampling mass, in (0, 1]"),
    RequestField("top_k", "INT64", False, "top_k", "--top-k", "top_k",
                 "sample among the k most likely tokens (0: all)"),
    RequestField("seed", "INT64", False, "seed", "--seed", "seed", "sampling seed (>= 0)"),
    RequestField("stop", "STRING", True, "stop", "--stop", "stop", "user stop string (repeatable)"),
    RequestField("include_stop_str_in_output", "BOOL", False, "include_stop_str_in_output",
                 "--include-stop-str-in-output", "include_stop_str_in_output",
                 "keep the matched stop string in the text (default: left out, as in OpenAI's API and vLLM)"),
    RequestField("mode", "STRING", False, "mode", "--mode", "mode", " | ".join(MODES)),
    RequestField("gamma", "INT64", False, "gamma", "--gamma", "gamma", "lookahead depth: drafted steps per cycle"),
    RequestField("judge", "STRING", False, "judge", "--judge", "judge",
                 "step verifier: " + " | ".join(JUDGES) + " (default: the profile's)"),
    RequestField("async_mode", "BOOL", False, "async", "--async", "async", "pipelined asynchronous loop"),
    RequestField("adaptive_gamma", "BOOL", False, "adaptive_gamma", "--adaptive-gamma", "adaptive_gamma",
                 "adapt gamma to acceptance and load"),
    RequestField("width", "INT64", False, "width", "--width", "width", "draft candidates per depth (sync loop)"),
    RequestField("delimiter", "STRING", False, "delimiter", "--delimiter", "delimiter",
                 'step delimiter (default "\\n\\n"; escapes like \\n allowed on the command line)'),
    RequestField("max_step_tokens", "INT64", False, "max_step_tokens", "--max-step-tokens", "max_step_tokens",
                 "tokens per step at most"),
    RequestField("sd_method", "STRING", False, "sd_method", "--sd-method", "sd_method",
                 "token-level SD inside the target's calls (sd, lr+sd): " + " | ".join(SD_METHODS)
                 + " (default: the profile's; medusa / eagle3 need the target's heads, draft_model a draft)"),
    RequestField("sd_tokens", "INT64", False, "sd_tokens", "--sd-tokens", "sd_tokens",
                 "tokens per SD proposal, 1..64 (default: the profile's)"),
)
BY_NAME = {f.name: f for f in FIELDS}
#: Input tensors of the ``lookahead_reasoning`` model, in ``config.pbtxt`` order.
TRITON_INPUTS: tuple[str, ...] = tuple(f.triton for f in FIELDS)
#: Output tensors of the ``lookahead_reasoning`` model.
TRITON_OUTPUTS: tuple[tuple[str, str], ...] = (("text_output", "STRING"), ("metrics", "STRING"))


#: Integers travel as 64-bit tensors (Triton inputs, the client): a value that does not fit is refused here,
#: never wrapped around. Floats must be finite (a float32 input that overflowed arrives as inf).
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class LRRequest(BaseModel):
    """A request's typed values (``None``: the profile's default). Types only (64-bit integers, finite floats):
    the ranges are the options'."""

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr | None = None
    messages: list[Message] | None = None
    max_tokens: Int64 | None = None
    stream: StrictBool = False
    temperature: Finite | None = None
    top_p: Finite | None = None
    top_k: Int64 | None = None
    seed: Int64 | None = None
    stop: list[StrictStr] | None = None
    include_stop_str_in_output: StrictBool = False
    mode: Mode | None = None
    gamma: Int64 | None = None
    judge: JudgeName | None = None
    async_mode: StrictBool | None = None
    adaptive_gamma: StrictBool | None = None
    width: Int64 | None = None
    delimiter: StrictStr | None = None
    max_step_tokens: Int64 | None = None
    sd_method: SdMethod | None = None
    sd_tokens: Annotated[int, Field(ge=1, le=64)] | None = None

    def chat(self) -> list[dict] | None:
        """The messages as plain dicts (what the engines' chat templates take), or None."""
        return None if self.messages is None else [m.model_dump() for m in self.messages]

    def trimmer(self, options: LROptions) -> StopTrimmer:
        """What every front applies to the text it returns: the matched stop string (of ``options.stop``, the
        stops the loop ran with) left out unless ``include_stop_str_in_output``."""
        return StopTrimmer(() if self.include_stop_str_in_output else options.stop)

    def options(self, defaults: LROptions) -> LROptions:
        """The one conversion to loop options: ``defaults`` with every given field set (validated by
        ``LROptions``; a ``ValidationError`` locates the option, see :func:`_option_field`)."""
        sampling = defaults.sampling.model_dump()
        sampling.update({k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "seed")
                         if getattr(self, k) is not None})
        step = defaults.step.model_dump()
        step.update({k: getattr(self, k) for k in ("delimiter", "max_step_tokens") if getattr(self, k) is not None})
        judge = defaults.judge.model_dump()
        if self.judge is not None:
            judge["name"] = self.judge
        target_spec = None
        if self.sd_method is not None or self.sd_tokens is not None:
            target_spec = defaults.target_spec.model_dump()
            given = (("method", self.sd_method), ("num_speculative_tokens", self.sd_tokens))
            target_spec.update({k: v for k, v in given if v is not None})
        return with_overrides(
            defaults, mode=self.mode, gamma=self.gamma, max_tokens=self.max_tokens, width=self.width,
            async_mode=self.async_mode, adaptive_gamma=self.adaptive_gamma,
            stop=tuple(self.stop) if self.stop is not None else None, sampling=sampling, step=step, judge=judge,
            target_spec=target_spec)


@dataclass(frozen=True)
class Limits:
    """A server's caps on requests (None: no cap): ``max_tokens`` and prompt size in UTF-8 bytes. The cap on
    ``gamma`` is the options' own (``LROptions.max_gamma``; a profile's ``options.max_gamma``)."""

    max_tokens: int | None = None
    max_prompt_bytes: int | None = None


class RequestError(FieldError):
    """A bad request: ``field`` (canonical, with a path inside it such as ``messages[1].role``) and ``message``.

    ``str()`` reads ``"field: message"`` in canonical (Python API) terms; :meth:`for_front` in a front's terms.
    """

    def for_front(self, front: Front) -> str:
        """``"name: message"`` with the field as ``front`` calls it (``--max-tokens``, ``text_input``, ...)."""
        name = rename(self.field, front)
        return f"{name}: {self.message}" if name else self.message


def rename(field: str, front: Front) -> str:
    """A canonical field path in ``front``'s terms: its head is renamed, the rest (``[1].role``) kept."""
    head, rest = re.match(r"([A-Za-z_]*)(.*)", field).groups()
    spec = BY_NAME.get(head)
    return (spec.front_name(front) + rest) if spec is not None else field


def canonical(name: str, front: Front) -> str:
    """The canonical field path of a name (path) in ``front``'s terms (the inverse of :func:`rename`)."""
    head, rest = re.match(r"([-A-Za-z_]*)(.*)", name).groups()
    for f in FIELDS:
        if f.front_name(front) == head:
            return f.name + rest
    return name


def translate(line: str, source: Front, front: Front) -> str:
    """An error line ``"name: message"`` naming a field in ``source``'s terms, renamed to ``front``'s terms
    (the OpenAI front and the ``client`` command re-name what the Triton server said)."""
    head, sep, rest = line.partition(":")
    if not sep or " " in head.strip():
        return line
    return rename(canonical(head.strip(), source), front) + ":" + rest


def front_error(exc: BaseException, front: Front) -> str:
    """One line for any error of a request, naming its field in ``front``'s terms where it names one.

    :class:`RequestError` carries its field; other ``ValueError``s of the library start with ``"field: "``
    (an engine finding the prompt longer than its context window says ``prompt: ...``).
    """
    if isinstance(exc, FieldError):
        return RequestError(exc.field, exc.message).for_front(front)
    field, msg = describe(exc)
    if field and field in BY_NAME:
        return RequestError(field, msg).for_front(front)
    return f"{field}: {msg}" if field else msg


def _option_field(loc: tuple) -> str:
    """The request field behind an ``LROptions`` error location (``("sampling", "top_p")`` -> ``top_p``,
    ``("judge", "name")`` -> ``judge``). A check across fields has no location and names its field in its
    message (``gamma: 9 exceeds the cap ...``): "" here, and :func:`~.errors.from_validation` reads the message."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    return next((part for part in reversed(parts) if part in BY_NAME), ".".join(parts))


def _invalid(exc: ValidationError, options: bool) -> RequestError:
    err = from_validation(exc, _option_field if options else field_path)
    return RequestError(err.field, err.message)


def parse_request(values: Mapping[str, Any], defaults: LROptions, limits: Limits = Limits(),
                  require_input: bool = True) -> tuple[LRRequest, LROptions]:
    """Validate a request once and convert it: ``(request, options)``.

    Args:
        values: canonical field name -> value (absent or None: the default); ``messages`` may be a JSON string.
        defaults: the profile's options. limits: the server's caps.
        require_input: check that exactly one of ``prompt`` / ``messages`` is given and well formed (False: options
            only, as ``eval`` needs, whose prompts come from datasets).

    Raises:
        RequestError: the first bad field (unknown fields too), in canonical terms.
    """
    values = {k: v for k, v in values.items() if v is not None}
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise RequestError(unknown[0], "unknown field")
    if isinstance(values.get("messages"), str):
        try:
            values["messages"] = json.loads(values["messages"])
        except json.JSONDecodeError as exc:
            raise RequestError("messages", f"not valid JSON ({exc.msg})") from None
    if isinstance(values.get("stop"), str):
        values["stop"] = [values["stop"]]
    try:
        req = LRRequest.model_validate(values)
    except ValidationError as exc:
        raise _invalid(exc, options=False) from None
    if require_input:
        try:
            check_input(req.prompt, req.chat(), limits.max_prompt_bytes)
        except FieldError as exc:
            raise RequestError(exc.field, exc.message) from None
    if limits.max_tokens is not None and req.max_tokens is not None and req.max_tokens > limits.max_tokens:
        raise RequestError("max_tokens", f"{req.max_tokens} exceeds the server limit of {limits.max_tokens}")
    try:
        return req, req.options(defaults)
    except ValidationError as exc:
        raise _invalid(exc, options=True) from None


def openai_body_fields() -> dict[str, tuple[Any, Any]]:
    """Fields of the OpenAI front's request body derived from :data:`FIELDS` (not prompt/messages, which are
    per endpoint): ``{canonical name: (optional type, Field(None, alias=openai name))}`` for
    ``pydantic.create_model``."""
    out: dict[str, tuple[Any, Any]] = {}
    for f in FIELDS:
        if f.openai and f.name not in ("prompt", "messages"):
            info = LRRequest.model_fields[f.name]
            # the field's constraints (strictness, 64-bit range) travel in its metadata, not its annotation
            ann = Annotated.__class_getitem__((info.annotation, *info.metadata)) if info.metadata else info.annotation
            out[f.name] = (ann | None, Field(None, alias=f.openai))
    return out


def add_request_flags(parser, skip: tuple[str, ...] = ()) -> None:
    """The command line's request flags: one per field with a ``cli`` name (not in ``skip``), typed by its
    dtype (``BOOL``: a switch; a list: repeatable) and stored under the canonical name; :func:`parse_request`
    validates the values (:func:`request_values` collects them). They form one help group: an unset flag takes
    the profile's default (``LROptions``; the demo: mode ``lr+sd``, gamma 4, greedy, the ``llm`` judge, 800
    tokens; gamma at most the profile's ``options.max_gamma``, 8 by default)."""
    parser = parser.add_argument_group(
        "request", "unset flags take the profile's defaults (demo: mode lr+sd, gamma 4, greedy, judge llm, "
                   "max tokens 800; gamma at most the profile's options.max_gamma, 8 by default)")
    for f in FIELDS:
        if f.cli is None or f.name in skip:
            continue
        kw: dict = {"dest": f.name, "default": None, "help": f.help}
        if f.dtype == "BOOL":
            kw["action"] = "store_true"
        elif f.many:
            kw["action"] = "append"
        elif f.dtype in ("INT32", "INT64"):
            kw["type"] = int
        elif f.dtype == "FP32":
            kw["type"] = float
        parser.add_argument(f.cli, **kw)


def request_values(args, skip: tuple[str, ...] = ()) -> dict:
    """The request fields given on the command line (``argparse.Namespace`` from :func:`add_request_flags`):
    canonical name -> value, ``--delimiter`` escapes (``\\n``) decoded."""
    values = {f.name: getattr(args, f.name, None) for f in FIELDS if f.cli and f.name not in skip}
    if values.get("delimiter") is not None:
        values["delimiter"] = values["delimiter"].encode().decode("unicode_escape")
    return {k: v for k, v in values.items() if v is not None}
