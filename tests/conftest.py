"""Shared fixtures: real small models (no mocks).

``tiny_model_dir``: a randomly initialised tiny Qwen3 checkpoint with a byte-level BPE tokenizer trained
here on a small corpus (seeded; built once per session). ``demo_dir``: the committed demo trio.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest
from lookahead_reasoning.serving.server import free_port

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "engines" / "demo"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch.compile only where a test is about it (``compile_enabled``): the demo profile compiles its draft at start-up
# (12-40 s on 2 cores), which every other test, server and CLI run would pay for nothing. Read by torch at import
# (torch._dynamo.config.disable) and inherited by every child process (Triton's stubs, the CLI).
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
# OpenMP threads (torch's, llama.cpp's) sleep instead of spinning when idle: two xdist workers, Triton stubs and
# llama.cpp roles share 2 cores, and spinning threads would starve the other processes (with spinning, a Triton test
# of the smollm2-llamacpp profile took 811 s beside the other worker).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@contextlib.contextmanager
def compile_enabled():
    """torch.compile on again, in this process (``torch._dynamo.config.disable``) and for child processes started
    inside the block (``TORCH_COMPILE_DISABLE`` removed from the environment)."""
    import torch

    saved = os.environ.pop("TORCH_COMPILE_DISABLE", None)
    try:
        with torch._dynamo.config.patch(disable=False):
            yield
    finally:
        if saved is not None:
            os.environ["TORCH_COMPILE_DISABLE"] = saved


#: Seconds the suite's shared servers get to exit before their processes are killed (``TritonServer.stop``). After
#: concurrent streams Triton 2.51 keeps the ``lookahead_reasoning`` model loaded for its whole 30-s exit timeout
#: (reproduced on 2026-12-07 with 16 concurrent gRPC streams on the demo profile: not an open HTTP connection, not
#: the held BLS responses, not uncollected garbage; cause not found, see issue 60), which cost the suite 30 s per
#: server. Clean exits are what test_shutdown.py and test_cli.py's SIGTERM test check, with the full timeout.
STOP_GRACE_S = 5.0


#: Session servers shared by several files: under pytest-xdist (``make test``: two workers, ``--dist loadgroup``) the
#: files that use one run on the same worker, so that no server starts twice.
SHARED_SERVER_GROUPS = {"triton_server": "demo-server", "openai_front": "demo-server",
                        "tiny_server": "tiny-server", "tiny_openai": "tiny-server"}


#: The longest groups, longest first (durations of 2026-12-07 on 2 vCPUs: 560, 280, 240, 210 and 150 s; the rest
#: under 100 s): with ``--no-loadscope-reorder`` (Makefile) xdist hands groups out in collection order, so these
#: start first and the two workers finish close together (longest-processing-time-first). xdist's own reorder
#: sorts by test count and left the 4-test lossless file, the second longest, for last.
RUN_FIRST = ("tiny-server", "test_lossless_demo.py", "test_llamacpp.py", "demo-server", "test_faults.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each test file runs whole on one xdist worker (its module fixtures built once), the files sharing a session
    server (``SHARED_SERVER_GROUPS``) on one worker together, the ``RUN_FIRST`` groups first. Without xdist the
    mark does nothing. ``tryfirst``: xdist's worker reads the marks in its own ``pytest_collection_modifyitems`` (it
    suffixes each node id with its group), so they must be there before it runs. pytest 9.2's structured node ids
    drop that suffix and with it the groups (pytest-xdist issue 1386): a file's tests would spread over both
    workers, each starting the file's servers again. pyproject's test extra keeps pytest below 9.2."""
    group_of_file: dict[Path, str] = {}
    for item in items:
        shared = next((g for f, g in SHARED_SERVER_GROUPS.items() if f in item.fixturenames), None)
        if shared or item.path not in group_of_file:
            group_of_file[item.path] = shared or group_of_file.get(item.path) or item.path.name
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of_file[item.path]))
    first = {g: i for i, g in enumerate(RUN_FIRST)}
    items.sort(key=lambda it: first.get(group_of_file[it.path], len(first)))  # stable: the rest keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a server fixture reports the server log's warnings and errors (Triton's lines other
    than ``I`` info, and the Python stubs' own output), so that a failure in CI shows what the server saw."""
    from lookahead_reasoning.serving.server import TritonServer

    report = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            log = getattr(value, "log_path", None) if isinstance(value, TritonServer) else None
            if log and Path(log).exists():
                lines = Path(log).read_text(errors="replace").replace("\r", "\n").splitlines()
                keep = [ln[:400] for ln in lines if ln.strip() and not re.match(r"^I\d{4} |^[|+]|^Loading weights", ln)]
                report.sections.append((f"server log of {name} ({log}), last 60 lines that are not info",
                                        "\n".join(keep[-60:])))
    return report


def build_tiny_model(out: Path, seed: int = 0, layers: int = 2, hidden: int = 64, vocab: int = 320,
                     arch: str = "qwen3") -> Path:
    """A random tiny checkpoint: ``arch`` is ``qwen3`` or ``llama`` (the two decoder families the demo trio and
    SmolLM2 use; their forwards take the pre-built attention mask differently)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    corpus = [
        f"Step {i}: {a} + {b} = {a + b}.\n\nThe total is {a * b} apples." for i, (a, b) in
        enumerate((x % 97, (x * 7) % 89) for x in range(400))
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    torch.manual_seed(seed)
    config_cls, model_cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    cfg = config_cls(
        vocab_size=len(fast), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=2 * hidden, max_position_embeddings=512,
        tie_word_embeddings=False, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )
    model = model_cls(cfg)
    # Random weights give near-uniform logits; scale the head so greedy argmax has real margins
    # (untied, so the model does not just repeat its last token).
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


#: Prompts of the engine-equivalence tests: arithmetic steps, a partial step, one word.
TEXTS = [
    "Step 3: 12 + 5 = 17.\n\nThe total",
    "The total is 42 apples.",
    "Step",
    "Step 1: 4 + 4 = 8.\n\nStep 2: 8 + 4 = 12.\n\nStep 3: 12 + 4 =",
]


def greedy_reference(model_dir, texts=TEXTS, new_tokens: int = 24) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, new ids)`` per text: plain ``model.generate`` greedy continuations with no EOS stop, the
    reference every engine path must reproduce token for token (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                                 pad_token_id=tok.pad_token_id)
        out.append((ids, gen[0, len(ids):].tolist()))
    return out


def cut_at_eos(engine, tokens: list[int]) -> list[int]:
    """``tokens`` up to and including the engine's first EOS id (what the engine returns for them)."""
    for i, t in enumerate(tokens):
        if t in engine.eos_token_ids:
            return tokens[: i + 1]
    return tokens


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_draft"), seed=1, layers=1, hidden=32)


GSM8K_SAMPLE = Path(__file__).resolve().parent / "data" / "gsm8k_test_head20.jsonl"  # first 20 GSM8K test items (MIT)

def concurrent_outputs(engine, reqs, timeout_s: float = 120) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of each request of ``reqs`` run concurrently twice: all awaited together on one asyncio loop
    (``agenerate``), and one plain thread per request (``generate``); both lists in the order of ``reqs``."""
    import asyncio
    import threading

    async def gather():
        return await asyncio.gather(*(engine.agenerate([r]) for r in reqs))

    via_asyncio = [r[0].token_ids for r in asyncio.run(gather())]
    out: dict[int, list[int]] = {}

    def call(i, req):
        out[i] = engine.generate([req])[0].token_ids

    threads = [threading.Thread(target=call, args=(i, r)) for i, r in enumerate(reqs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    return via_asyncio, [out.get(i) for i in range(len(reqs))]


#: Bad GenerationRequest fields every engine must refuse with a ValueError naming the field (and keep serving):
#: ``(GenerationRequest keyword arguments, field named)``.
BAD_REQUESTS = [
    ({"prompt_ids": []}, "prompt_ids"),
    ({"prompt_ids": [10**6]}, "prompt_ids"),
    ({"prompt_ids": [-1]}, "prompt_ids"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": -3}, "max_new_tokens"),
    ({"max_new_tokens": 10**6}, "max_new_tokens"),
    ({"stop": ("",)}, "stop"),
    ({"prediction": (10**6,)}, "prediction"),
]


@pytest.fixture(scope="session")
def gsm8k_path() -> Path:
    return GSM8K_SAMPLE



@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """A real Triton server with the demo trio (127.0.0.1, free ports; the draft compiled at start-up, as the demo
    profile says: the suite's one compiled server), shared by the session's tests."""
    from lookahead_reasoning.serving.server import ServerConfig, TritonServer, prepare_repository

    repo = prepare_repository("demo", None, str(tmp_path_factory.mktemp("repo")),
                              limits={"max_tokens_limit": "1024", "max_prompt_bytes": "20000",
                                      "max_concurrency": "128", "call_timeout_s": "0"})
    log = tmp_path_factory.mktemp("logs") / "triton.log"
    server = TritonServer(ServerConfig(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()),
                          log_path=log)
    with compile_enabled():
        server.start()
    yield server
    server.stop(STOP_GRACE_S)


def _front(server):
    """The OpenAI-compatible front on a free loopback port, forwarding to ``server``; yields HOST:PORT."""
    from lookahead_reasoning.serving.openai_front import start_front

    port = free_port()
    front = start_front(server.grpc_url, "127.0.0.1", port)
    yield f"127.0.0.1:{port}"
    front.stop()


@pytest.fixture(scope="session")
def openai_front(triton_server):
    yield from _front(triton_server)


@pytest.fixture(scope="session")
def tiny_openai(tiny_server):
    yield from _front(tiny_server)


@pytest.fixture(scope="session")
def tiny_judge_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_judge"), seed=2, layers=1, hidden=32)


@pytest.fixture(scope="session")
def tiny_profile_yaml(tmp_path_factory, tiny_model_dir, tiny_draft_dir, tiny_judge_dir) -> Path:
    """A profile of the three tiny random models (fast to serve): numeric judge by default, llm available."""
    import yaml

    path = tmp_path_factory.mktemp("tiny_profile") / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny",
        "target": {"path": str(tiny_model_dir), "prefix_cache_mb": 4},
        "draft": {"path": str(tiny_draft_dir), "prefix_cache_mb": 4},
        "judge": {"path": str(tiny_judge_dir), "prefix_cache_mb": 4},
        "options": {"judge": {"name": "numeric"}, "max_tokens": 64, "gamma": 2,
                    "step": {"max_step_tokens": 8}},
        "max_gamma_cap": 6,
    }))
    return path


def start_server(tmp_path_factory, profile_config: Path | None, control: str = "none", profile: str | None = None,
                 open_role_models: bool = False, **limits) -> object:
    from lookahead_reasoning.serving.server import ServerConfig, TritonServer, prepare_repository

    params = {"max_tokens_limit": "512", "max_prompt_bytes": "8000", "max_concurrency": "100",
              "call_timeout_s": "0"}
    params.update({k: str(v) for k, v in limits.items()})
    repo = prepare_repository(profile, str(profile_config) if profile_config else None,
                              str(tmp_path_factory.mktemp("repo")), limits=params)
    log = tmp_path_factory.mktemp("logs") / "triton.log"
    server = TritonServer(ServerConfig(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                                       model_control_mode=control, guard_role_models=not open_role_models),
                          log_path=log)
    return server.start()


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory, tiny_profile_yaml):
    """A real Triton server with the tiny profile (bad requests, load, limits)."""
    server = start_server(tmp_path_factory, tiny_profile_yaml)
    yield server
    server.stop(STOP_GRACE_S)


def scrape(server, prefix: str = "lookahead_") -> dict[str, float]:
    """Prometheus samples of the server's metrics port whose name starts with ``prefix``."""
    import urllib.request

    body = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def series(samples: dict[str, float], name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` in :func:`scrape`'s output, whatever the label order (0 if absent)."""
    want = {k: str(v) for k, v in labels.items()}
    for key, value in samples.items():
        head, _, rest = key.partition("{")
        if head == name and dict(re.findall(r'(\w+)="([^"]*)"', rest)) == want:
            return value
    return 0.0


def check_sampling_keeps_target_distribution(spec, **engine_kwargs) -> None:
    """Sample the first 3 tokens over 3,000 seeds through the demo target with token-level SD ``spec`` (engine built
    with ``engine_kwargs``: the heads), and compare the joint distribution with the exact target distribution
    (top-k 3, temperature 1.5) computed from the model: chi-square goodness of fit. Also checks that proposals were
    both accepted and rejected."""
    import torch
    from lookahead_reasoning.backends.base import GenerationRequest, SamplingParams
    from lookahead_reasoning.backends.portable import PortableEngine
    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = str(DEMO / "target")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Max buys 4 cups. Each one costs $3. How much?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompt = tok.encode(text, add_special_tokens=False)
    topk, temp = 3, 1.5

    def dist(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1] / temp
        v, i = logits.topk(topk)
        return dict(zip(i.tolist(), torch.softmax(v, -1).tolist(), strict=False))

    eng = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", prefix_cache=False, **engine_kwargs)
    try:
        n = 3000
        sampling = [SamplingParams(temperature=temp, top_k=topk, seed=s) for s in range(n)]
        results = eng.generate([GenerationRequest(prompt, 3, sampling=p, spec=spec) for p in sampling])
        eos = set(eng.eos_token_ids)
    finally:
        eng.close()
    accepted = sum(r.counters.accepted_tokens for r in results)
    assert 0.1 * n < accepted < sum(r.counters.drafted_tokens for r in results)  # accepted and rejected both ran
    counts: dict[tuple[int, ...], int] = {}
    for r in results:
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    expected: dict[tuple[int, ...], float] = {}  # exact probability of each path of 3 tokens (or fewer, to EOS)

    def walk(path: tuple[int, ...], prob: float) -> None:
        if len(path) == 3 or (path and path[-1] in eos):
            expected[path] = prob
            return
        for t, pt in dist(prompt + list(path)).items():
            walk(path + (t,), prob * pt)

    walk((), 1.0)
    assert set(counts) <= set(expected)
    cells = sorted(expected)
    exp = [n * expected[c] for c in cells]
    obs = [counts.get(c, 0) for c in cells]
    big = [i for i, e in enumerate(exp) if e >= 5]  # chi-square needs expected counts >= 5; pool the rest
    assert len(big) >= 4
    obs_b, exp_b = [obs[i] for i in big], [exp[i] for i in big]
    if n - sum(exp_b) > 1e-6:
        obs_b.append(n - sum(obs_b))
        exp_b.append(n - sum(exp_b))
    assert chisquare(obs_b, exp_b).pvalue > 1e-3
