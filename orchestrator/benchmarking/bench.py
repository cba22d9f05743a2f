"""Latency-SLA benchmark: per-request timelines, the serving metrics, a load generator, the ``bench`` command.

Definitions (vLLM ``benchmarks/benchmark_serving.py``, ``calculate_metrics``; genai-perf uses the same ones):

- TTFT (ms) = arrival of the first chunk carrying output - send time.
- ITL (ms) = gaps between consecutive output chunks of a request, pooled over all requests. LR streams whole
  steps, so this is a per-*chunk* figure (vLLM streams about a token per chunk).
- E2E latency (ms) = arrival of the last response - send time (vLLM: ``latency``).
- TPOT (ms/token) = (E2E - TTFT) / (output tokens - 1); undefined for requests with <= 1 output token: left
  out of the TPOT percentiles and counted as 0 for goodput, as vLLM does.
- Run duration (s) = first send to last completion. Output tokens/s = output tokens of the completed requests
  / duration; requests/s = completed requests / duration.
- Goodput (requests/s, vLLM ``--goodput``; DistServe, Zhong et al. 2024) = completed requests meeting ALL
  the given SLOs (``value <= slo``, for TTFT, TPOT, E2E) / duration; None when no SLO is given.
- Statistics of every distribution: mean, std (population, ``numpy.std``), min, max and percentiles p50/p90/p95/p99
  (``numpy.percentile``, linear interpolation, as vLLM); None for an empty sample.
- ISL / OSL: input (prompt) and output tokens per completed request, as the server counts them (target
  tokenizer; the OpenAI endpoints' ``usage``). Total token throughput = (input + output tokens) / duration.

Endpoints (``--endpoint``): ``triton-grpc`` / ``triton-http`` (this project's server, streamed steps with their
token counts), ``openai-chat`` / ``openai-completions`` (any OpenAI-compatible server: our front, vLLM,
trtllm-serve; streamed with ``stream_options.include_usage``, the output tokens taken from the usage, and
``mode`` sent as an extension field, which other servers ignore).

Load: ``concurrency`` = that many workers pulling requests from a queue (closed loop); ``request_rate`` =
Poisson arrivals (open loop, unbounded in flight): exponential gaps with mean ``1 / rate`` from a seeded
``numpy.random.Generator``, the first request at t = 0 (vLLM's ``get_request`` with burstiness 1).

Measurement (:func:`run_bench`): ``--warmup`` untimed requests per mode first (on a spare item: the one after
the ``--requests`` items loaded), then at each load point all modes, in an order rotated per load point, so
no mode always runs first (on a cold server) or last; the 1-minute load average at start and end goes in the
document's ``measurement``, with a warning when it starts above 0.5 per core.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..evaluation.answers import EvalItem

PERCENTILES = (50, 90, 95, 99)
ENDPOINTS = ("triton-grpc", "triton-http", "openai-chat", "openai-completions")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
_SLO_ALIASES = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms", "e2el_ms": "e2e_ms", "e2e": "e2e_ms"}

#: ``send(item, run)`` streams ``(text_piece, token_count)`` (optionally a third element: a metrics dict); ``run``
#: is a mode, or ``MODE:VARIANT`` (:data:`RUN_VARIANTS`).
SendFn = Callable[[EvalItem, str], AsyncIterator[tuple]]

#: Request fields a run variant adds to its mode's requests (``--modes ar,lr+sd,lr+sd:adaptive``).
RUN_VARIANTS: dict[str, dict] = {"adaptive": {"adaptive_gamma": True}}


def parse_runs(text: str) -> list[str]:
    """``--modes`` of ``bench``: modes, each optionally ``:VARIANT`` (:data:`RUN_VARIANTS`; only the step-speculating
    modes ``lr`` and ``lr+sd`` have one). ``ValueError`` names ``--modes``."""
    from ..core.lookahead import parse_modes

    runs = [r.strip() for r in str(text).split(",") if r.strip()]
    parse_modes(",".join(r.partition(":")[0] for r in runs))
    for r in runs:
        mode, colon, variant = r.partition(":")
        if colon and (variant not in RUN_VARIANTS or mode not in ("lr", "lr+sd")):
            raise ValueError(f"--modes: {r!r}: a variant is one of {sorted(RUN_VARIANTS)} after lr or lr+sd")
    if len(set(runs)) != len(runs):
        raise ValueError("--modes: a run is listed twice")
    return runs


def run_request(run: str) -> tuple[str, dict]:
    """``(mode, extra request fields)`` of a run name (see :func:`parse_runs`)."""
    mode, _, variant = run.partition(":")
    return mode, dict(RUN_VARIANTS.get(variant, {}))


@dataclass
class RequestTimeline:
    """One request: times in seconds on one monotonic clock (``time.perf_counter``), tokens per chunk.

    ``chunk_s`` / ``chunk_tokens`` hold only responses that carry output (text or tokens); ``end_s`` is the
    arrival of the stream's last response (possibly a metrics-only one) or of the error."""

    send_s: float
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    end_s: float | None = None
    ok: bool = True
    error: str | None = None
    mode: str = ""
    item_id: str = ""
    server_metrics: dict | None = None

    @property
    def output_tokens(self) -> int:
        """Tokens of the streamed chunks, or the server's count where chunks carry none (OpenAI endpoints)."""
        counted = int(sum(self.chunk_tokens))
        return counted or int((self.server_metrics or {}).get("generated_tokens") or 0)

    @property
    def input_tokens(self) -> int | None:
        """Prompt tokens as the server counted them (None if it did not say)."""
        n = (self.server_metrics or {}).get("prompt_tokens")
        return None if n is None else int(n)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_s[0] - self.send_s if self.chunk_s else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.send_s

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive output chunks (seconds); empty with fewer than two chunks."""
        return np.diff(self.chunk_s).tolist() if len(self.chunk_s) > 1 else []

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1), seconds per token; None when output tokens <= 1."""
        if self.output_tokens <= 1 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def completed(self) -> bool:
        return self.ok and self.end_s is not None and bool(self.chunk_s)


def distribution(values: Sequence[float], scale: float = 1.0,
                 ps: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """``{"mean", "std", "min", "max", "p50", ...}`` of ``values * scale`` (``numpy``; population std,
    linear-interpolation percentiles); every entry None for an empty sample."""
    keys = ["mean", "std", "min", "max"] + [f"p{p}" for p in ps]
    if len(values) == 0:
        return dict.fromkeys(keys)
    arr = np.asarray(values, dtype=float) * scale
    return {"mean": float(arr.mean()), "std": float(arr.std()), "min": float(arr.min()), "max": float(arr.max()),
            **{f"p{p}": float(np.percentile(arr, p)) for p in ps}}


def percentiles_ms(values_s: Sequence[float], ps: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """:func:`distribution` of values in seconds, in milliseconds."""
    return distribution(values_s, 1e3, ps)


def meets_slo(t: RequestTimeline, slo_ms: dict[str, float]) -> bool:
    """All given SLOs met (``<=``, ms); TPOT of a <= 1-token request counts as 0 (vLLM)."""
    values = {"ttft_ms": t.ttft_s, "tpot_ms": t.tpot_s or 0.0, "e2e_ms": t.e2e_s}
    return t.completed and all(values[k] is not None and values[k] * 1e3 <= v for k, v in slo_ms.items())


def duration_s(timelines: Sequence[RequestTimeline]) -> float:
    """First send to last completion (seconds; failed requests included), 0 for none."""
    ends = [t.end_s for t in timelines if t.end_s is not None]
    return max(ends) - min(t.send_s for t in timelines) if ends else 0.0


def summarize(timelines: Sequence[RequestTimeline], slo_ms: dict[str, float] | None = None) -> dict:
    """The metrics of one run (see the module docstring): percentile dicts in ms, rates per second."""
    done = [t for t in timelines if t.completed]
    dur = duration_s(timelines)
    per_s = (lambda x: x / dur) if dur > 0 else (lambda x: 0.0)
    tokens = sum(t.output_tokens for t in done)
    isl = [t.input_tokens for t in done if t.input_tokens is not None]
    out = {
        "completed": len(done),
        "failed": len(timelines) - len(done),
        "duration_s": dur,
        "output_tokens": tokens,
        "input_tokens": sum(isl),
        "isl": distribution(isl),
        "osl": distribution([t.output_tokens for t in done]),
        "ttft_ms": percentiles_ms([t.ttft_s for t in done]),
        "itl_ms": percentiles_ms([g for t in done for g in t.itl_s]),
        "tpot_ms": percentiles_ms([t.tpot_s for t in done if t.tpot_s is not None]),
        "e2e_ms": percentiles_ms([t.e2e_s for t in done]),
        "output_tokens_per_s": per_s(tokens),
        "total_tokens_per_s": per_s(tokens + sum(isl)),
        "requests_per_s": per_s(len(done)),
        "goodput_rps": per_s(sum(meets_slo(t, slo_ms) for t in done)) if slo_ms else None,
    }
    acc = [t.server_metrics for t in done if t.server_metrics and t.server_metrics.get("verified_steps")]
    if acc:
        out["acceptance_rate"] = sum(m.get("accepted_steps", 0) for m in acc) / sum(m["verified_steps"] for m in acc)
    out["samples_ms"] = {  # per completed request, in request order (for CDF plots)
        "ttft": [round(t.ttft_s * 1e3, 3) for t in done],
        "itl": [round(g * 1e3, 3) for t in done for g in t.itl_s],
        "tpot": [None if t.tpot_s is None else round(t.tpot_s * 1e3, 3) for t in done],
        "e2e": [round(t.e2e_s * 1e3, 3) for t in done],
    }
    errors = sorted({t.error for t in timelines if t.error})
    if errors:
        out["errors"] = errors[:5]
    return out


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft_ms=500,tpot_ms=50,e2e_ms=20000"`` -> ``{"ttft_ms": 500.0, ...}`` (vLLM's ``ttft``/``tpot``/
    ``e2el`` keys also accepted). Raises ``ValueError`` naming the offending key."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, eq, val = (x.strip() for x in part.partition("="))
        key = _SLO_ALIASES.get(key, key)
        if not eq:
            raise ValueError(f"--slo: {part!r} is not KEY=VALUE (keys: {', '.join(SLO_KEYS)})")
        if key not in SLO_KEYS:
            raise ValueError(f"--slo: unknown key {key!r} (keys: {', '.join(SLO_KEYS)})")
        if key in out:
            raise ValueError(f"--slo: {key} given twice")
        try:
            v = float(val)
        except ValueError:
            raise ValueError(f"--slo: {key}: {val!r} is not a number of milliseconds") from None
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"--slo: {key}: must be a positive number of milliseconds, got {val}")
        out[key] = v
    return out


def parse_list(text: str, kind: type, flag: str) -> list:
    """``"1,4,16"`` -> ``[1, 4, 16]`` (positive values of ``kind``); ValueError naming ``flag``."""
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a comma-separated list of {kind.__name__}s") from None
    if not vals or any(not v > 0 or not math.isfinite(v) for v in vals):
        raise ValueError(f"{flag}: values must be positive, got {text!r}")
    return vals


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Send offsets (seconds from the start) of ``n`` Poisson arrivals at ``rate`` requests/s: exponential
    gaps with mean ``1 / rate`` from ``numpy.random.default_rng(seed)``, first at 0; all 0 for ``rate = inf``."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])[:n]


async def _one(send: SendFn, item: EvalItem, mode: str, clock: Callable[[], float]) -> RequestTimeline:
    t = RequestTimeline(send_s=clock(), mode=mode, item_id=item.id)
    try:
        async for response in send(item, mode):
            now = clock()
            text, tokens = response[0], int(response[1])
            if len(response) > 2 and response[2]:
                t.server_metrics = dict(response[2])
            if tokens > 0 or text:
                t.chunk_s.append(now)
                t.chunk_tokens.append(tokens)
            t.end_s = now
        if t.end_s is None:
            t.end_s = clock()
    except Exception as exc:  # noqa: BLE001 - a failed request is recorded, the run goes on
        t.ok, t.error, t.end_s = False, f"{type(exc).__name__}: {exc}"[:300], clock()
    return t


async def run_load(send: SendFn, items: Sequence[EvalItem], mode: str, requests: int, *,
                   concurrency: int | None = None, request_rate: float | None = None, seed: int = 0,
                   progress: bool = True, clock: Callable[[], float] = time.perf_counter) -> list[RequestTimeline]:
    """Send ``requests`` requests (items cycled in order) in ``mode`` at a concurrency or a request rate;
    returns the timelines in request order. Exactly one of ``concurrency`` / ``request_rate`` is given."""
    from tqdm import tqdm

    if (concurrency is None) == (request_rate is None):
        raise ValueError("give exactly one of concurrency or request_rate")
    if not items:
        raise ValueError("dataset: no items")
    load = f"c={concurrency}" if concurrency else f"rate={request_rate}/s"
    bar = tqdm(total=requests, desc=f"{mode} {load}", unit="req", file=sys.stderr, disable=not progress)
    out: list[RequestTimeline | None] = [None] * requests

    async def do(i: int) -> None:
        out[i] = await _one(send, items[i % len(items)], mode, clock)
        bar.update()

    try:
        if concurrency:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(requests):
                queue.put_nowait(i)

            async def worker() -> None:
                while not queue.empty():
                    await do(queue.get_nowait())

            await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
        else:
            start = clock()
            tasks = []
            for i, offset in enumerate(poisson_arrivals(requests, request_rate, seed)):
                delay = start + offset - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(do(i)))
            await asyncio.gather(*tasks)
    finally:
        bar.close()
    return out  # type: ignore[return-value]


@dataclass
class BenchConfig:
    """What to run: modes side by side at each load point (concurrencies or request rates)."""

    modes: list[str]
    requests: int
    concurrencies: list[int] | None = None
    request_rates: list[float] | None = None
    slo_ms: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    warmup: int = 1

    def loads(self) -> list[tuple[str, float]]:
        if self.concurrencies:
            return [("concurrency", c) for c in self.concurrencies]
        return [("request_rate", r) for r in self.request_rates or []]

    def mode_order(self, level: int) -> list[str]:
        """The modes in the order load point number ``level`` (0-based) runs them: rotated by ``level``, so
        each mode goes first at every ``len(modes)``-th load point."""
        k = level % len(self.modes) if self.modes else 0
        return self.modes[k:] + self.modes[:k]


ROTATED_ORDER = "modes rotated per load point (load point j starts at mode j mod len(modes))"


async def run_bench(send: SendFn, items: Sequence[EvalItem], config: BenchConfig, progress: bool = True,
                    warmup_item: EvalItem | None = None) -> dict:
    """Every mode at every load point; returns ``{"runs": [...], "slo_ms": ..., "measurement": ...}`` (the
    ``--out`` document).

    First ``config.warmup`` untimed requests per mode, one at a time, on ``warmup_item`` (default: the first
    item); they are in no run's metrics. Then at load point ``j`` the modes run in
    :meth:`BenchConfig.mode_order` ``(j)``; ``runs`` stays in (load point, ``config.modes``) order, each run
    carrying ``order_position`` (0 = ran first at its load point) and ``speedup_vs_ar``: its output tokens/s
    over ``ar``'s at the same load. ``measurement`` (``evaluation.measurement_block``) records the warm-up,
    the order and the 1-minute load average at start and end (with a ``warning`` above 0.5 per core).

    Raises:
        ValueError: as :func:`run_load` (no items, not exactly one of concurrency / request rate).
    """
    from ..evaluation.runner import load_average, measurement_block

    load_start = load_average()
    spare = warmup_item if warmup_item is not None else (items[0] if items else None)
    warm_failed = 0
    if spare is not None:
        for _ in range(config.warmup):
            for mode in config.modes:
                warm_failed += not (await _one(send, spare, mode, time.perf_counter)).ok
    runs = []
    for level, (key, load) in enumerate(config.loads()):
        kw = {"concurrency": int(load)} if key == "concurrency" else {"request_rate": float(load)}
        done = {}
        for pos, mode in enumerate(config.mode_order(level)):
            tls = await run_load(send, items, mode, config.requests, seed=config.seed, progress=progress, **kw)
            done[mode] = {"mode": mode, key: kw[key], "order_position": pos, **summarize(tls, config.slo_ms)}
        runs += [done[mode] for mode in config.modes]
    for run in runs:
        key = "concurrency" if "concurrency" in run else "request_rate"
        ar = next((r for r in runs if r["mode"] == "ar" and r[key] == run[key]), None)
        run["speedup_vs_ar"] = (run["output_tokens_per_s"] / ar["output_tokens_per_s"]
                                if ar and ar["output_tokens_per_s"] else None)
    measurement = measurement_block(load_start, warmup_requests_per_mode=config.warmup,
                                    warmup_item=None if spare is None else spare.id, warmup_failed=warm_failed,
                                    order=ROTATED_ORDER)
    return {"runs": runs, "slo_ms": config.slo_ms or None, "requests_per_run": config.requests,
            "percentiles": "numpy.percentile, linear interpolation", "measurement": measurement}


# -- the command ---------------------------------------------------------------------------------------------
def register(subparsers) -> None:
    """Add the ``bench`` subcommand to the CLI's subparsers."""
    b = subparsers.add_parser("bench", help="latency-SLA benchmark against a running server")
    b.add_argument("--url", required=True,
                   help="server address: HOST:PORT (Triton's gRPC or HTTP port), or the OpenAI base URL "
                        "(http://HOST:PORT/v1; HOST:PORT is enough) for the openai-* endpoints")
    b.add_argument("--endpoint", choices=ENDPOINTS, default="triton-grpc",
                   help="what to talk to: this server's Triton model, or any OpenAI-compatible server's chat or "
                        "completions endpoint (our --openai-port front, vLLM, trtllm-serve)")
    b.add_argument("--model", default=None, help="model name for the openai-* endpoints (default: the server's first)")
    b.add_argument("--dataset", default="synthetic", help="synthetic, a dataset name, or a JSONL file")
    load = b.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", help="closed loop: comma-separated in-flight levels, e.g. 1,4,16")
    load.add_argument("--request-rate", help="open loop: Poisson arrivals, requests/s (comma-separated list)")
    b.add_argument("--requests", type=int, default=64, help="requests per mode and load point")
    b.add_argument("--modes", default="ar,lr+sd",
                   help="comma-separated modes, run side by side; lr:adaptive / lr+sd:adaptive run that mode with "
                        "adaptive gamma")
    b.add_argument("--slo", default=None,
                   help="ttft_ms=X,tpot_ms=Y,e2e_ms=Z (goodput counts requests meeting all; unset: no goodput)")
    b.add_argument("--max-tokens", type=int, default=None,
                   help="new-token budget per request (unset: the server profile's)")
    b.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    b.add_argument("--warmup", type=int, default=1, help="untimed warm-up requests per mode before timing")
    b.add_argument("--out", required=True, help="JSON report")
    b.add_argument("--plots", default=None, help="PNG folder (default: next to --out)")
    b.add_argument("--summary", default=None, help="markdown summary (default: --out with .md)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars (logs without \\r)")
    b.add_argument("--export-genai-perf", default=None,
                   help="folder for one genai-perf-style JSON per run (default: next to --out, <stem>_genai_perf)")
    b.set_defaults(func=cmd_bench)


def config_from_args(args) -> BenchConfig:
    """Validate the ``bench`` flags (``ValueError`` naming the flag)."""
    modes = parse_runs(args.modes)
    if args.requests <= 0:
        raise ValueError("--requests: must be > 0")
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise ValueError("--max-tokens: must be > 0")
    warmup = getattr(args, "warmup", 1)
    if warmup < 0:
        raise ValueError("--warmup: must be >= 0")
    conc = parse_list(args.concurrency, int, "--concurrency") if args.concurrency else None
    rates = parse_list(args.request_rate, float, "--request-rate") if args.request_rate else None
    return BenchConfig(modes, args.requests, conc, rates, parse_slo(args.slo), args.seed, warmup)


def client_send(client, **params) -> SendFn:
    """A :data:`SendFn` over a streaming client (``client.stream(prompt=, messages=, mode=, **params)``
    yielding chunks with ``.text``, ``.token_count`` and, on the last, ``.metrics``). Items are sent in their
    plain form when they have one (the server applies its model's chat template), else as chat messages."""

    async def send(item: EvalItem, run: str):
        prompt, messages = item.request(chat=item.prompt is None)
        mode, extra = run_request(run)
        async for ch in client.stream(prompt=prompt, messages=messages, mode=mode, **extra, **params):
            yield ch.text or "", int(ch.token_count or 0), getattr(ch, "metrics", None)

    return send


def openai_send(client, model: str, chat: bool, **params) -> SendFn:
    """A :data:`SendFn` over an ``openai.AsyncOpenAI`` client: streamed chat or completions with
    ``stream_options.include_usage``; each content delta is a chunk (its tokens are not known, so 0), and the last
    response carries the usage as ``{"prompt_tokens", "generated_tokens"}``. ``mode`` goes in the body as an
    extension (servers other than ours ignore it)."""

    async def send(item: EvalItem, run: str):
        prompt, messages = item.request(chat=chat)
        if chat and messages is None:  # a plain item: one user message (as the Triton endpoints send it)
            messages = [{"role": "user", "content": prompt}]
        mode, extra = run_request(run)
        common = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                  "extra_body": {"mode": mode, **extra}, **params}
        if chat:
            stream = await client.chat.completions.create(messages=messages, **common)
        else:
            stream = await client.completions.create(prompt=prompt, **common)
        async for chunk in stream:
            if chunk.usage is not None:
                yield "", 0, {"prompt_tokens": chunk.usage.prompt_tokens,
                              "generated_tokens": chunk.usage.completion_tokens}
            for c in chunk.choices:
                if chat:
                    d = c.delta.model_dump()
                    text = (d.get("content") or "") + (d.get("reasoning_content") or "")
                else:
                    text = c.text or ""
                yield text, 0

    return send


def openai_base_url(url: str) -> str:
    """``HOST:PORT`` or ``http://HOST:PORT[/v1]`` -> ``http://HOST:PORT/v1``."""
    url = url if "://" in url else f"http://{url}"
    return url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"


async def _bench_with_client(args, config: BenchConfig, items: list[EvalItem],
                             warmup_item: EvalItem | None = None) -> dict:
    params = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    endpoint = getattr(args, "endpoint", "triton-grpc")
    if endpoint.startswith("triton"):
        from lookahead_reasoning.serving.client import TritonLRClient

        client = TritonLRClient(args.url, endpoint.split("-")[1])
        profile = await client.server_profile()
        send = client_send(client, **params)
    else:
        import openai

        client = openai.AsyncOpenAI(base_url=openai_base_url(args.url), api_key="unused", max_retries=0)
        model = args.model or (await client.models.list()).data[0].id
        profile = {"endpoint": endpoint, "base_url": openai_base_url(args.url), "model": model}
        send = openai_send(client, model, endpoint == "openai-chat", **params)
    doc = await run_bench(send, items, config, progress=not args.no_progress, warmup_item=warmup_item)
    return {"server_profile": profile, "endpoint": endpoint, **doc}


def cmd_bench(args) -> int:
    """The ``bench`` handler: validate, run against the server, write JSON, plots and the summary."""
    from pathlib import Path

    from ..evaluation.runner import load_with_spare, write_json
    from ..reporting import environment
    from .bench_report import export_genai_perf, plot_bench, write_summary

    config = config_from_args(args)
    items, spare = load_with_spare(args.dataset, config.requests)  # the spare item (if any) is the warm-up's
    from ..serving.client import ServerError, transport_error

    try:
        doc = asyncio.run(_bench_with_client(args, config, items, spare))
    except (ValueError, ServerError):
        raise
    except Exception as exc:  # noqa: BLE001 - transport errors: one line naming the URL, non-zero exit
        raise ValueError(transport_error(exc, args.url)) from None
    doc.update({"dataset": args.dataset, **environment()})
    write_json(args.out, doc)
    out = Path(args.out)
    plots = plot_bench(doc, Path(args.plots) if args.plots else out.parent / f"{out.stem}_plots")
    export_genai_perf(doc, Path(args.export_genai_perf) if getattr(args, "export_genai_perf", None)
                      else out.parent / f"{out.stem}_genai_perf")
    summary = Path(args.summary) if args.summary else out.with_suffix(".md")
    write_summary(doc, summary, plots)
    print(summary.read_text())  # the tables are the command's output (stdout); progress and warnings go to stderr
    if doc["measurement"].get("warning"):
        print(f"warning: {doc['measurement']['warning']}", file=sys.stderr)
    dead = [r for r in doc["runs"] if not r["completed"]]
    for r in dead:  # a load point where nothing completed measured nothing: say why, exit non-zero
        key = "concurrency" if "concurrency" in r else "request_rate"
        print(f"error: {r['mode']} at {key} {r[key]}: all {r['failed']} requests failed: "
              f"{(r.get('errors') or ['unknown error'])[0]}", file=sys.stderr)
    return 1 if dead else 0
