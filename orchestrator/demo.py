"""The main job on the embedded demo models (``make demo`` / ``python -m lookahead_reasoning.demo``).

Starts a real Triton server with the demo trio (127.0.0.1, free ports) and sends held-out synthetic problems
through gRPC streaming, each once in ``lr+sd`` mode (printing each step as it arrives: accepted draft steps in
green, target steps plain) and once in ``ar`` mode. Beside them, in the same rotation, the peer a CPU user would
run instead: llama.cpp's plain decoding of the same target (llama-cpp-python's ``Llama.generate`` on the demo
target as GGUF, 1 thread, its fastest setting on 2 vCPUs; the same prompt ids and token budget). Measured as
``eval`` measures (docs/design.md section 2): one untimed warm-up per mode, the modes interleaved per problem in a
rotated order, and the speedups stated with a paired bootstrap 95% interval. Prints answers (graded on the final
answer, after the reasoning), accuracy, the speedup over our ``ar`` and the ratio to llama.cpp, and stops the
server.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time

MODES = ("lr+sd", "ar")
PEER = "llama.cpp plain"
#: Profiles whose target is the demo target, which the peer row decodes (as GGUF).
PEERED_PROFILES = ("demo", "demo-llamacpp")


class LlamaCppPeer:
    """llama.cpp's plain greedy decoding of the demo target (the ``demo-llamacpp`` profile's GGUF) in this process.

    Raises:
        ImportError: llama-cpp-python is not installed; ValueError: the GGUF is missing (``make install`` builds it).
    """

    def __init__(self) -> None:
        from llama_cpp import Llama
        from transformers import AutoTokenizer

        from .profiles import PROFILES

        prof = PROFILES["demo-llamacpp"]
        self.max_tokens = prof.options.token_budget
        self.tok = AutoTokenizer.from_pretrained(prof.target.tokenizer_path())
        self.llm = Llama(str(prof.target.located_path()), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)

    def run(self, item, parser: str) -> dict:
        from .evaluation.answers import check_answer

        ids = self.tok.apply_chat_template([{"role": "user", "content": item.prompt}], add_generation_prompt=True,
                                           tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        self.llm.reset()
        out = []
        t0 = time.perf_counter()
        for t in self.llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            out.append(int(t))
            if t == self.llm.token_eos() or len(out) >= self.max_tokens:
                break
        seconds = time.perf_counter() - t0
        text = self.tok.decode(out, skip_special_tokens=True)
        return {"tokens": len(out), "seconds": seconds, "correct": bool(check_answer(item, text, parser)),
                "accepted": 0, "verified": 0}


async def _one(client, item, mode: str, console, show: bool, parser: str) -> dict:
    """One problem in one mode: ``{"tokens", "seconds", "correct", "accepted", "verified"}``."""
    from .evaluation.answers import check_answer

    t0 = time.perf_counter()
    text, metrics = "", {}
    async for chunk in client.stream(item.prompt, mode=mode):
        if chunk.metrics is not None:
            metrics = chunk.metrics
            continue
        text += chunk.text
        if show:
            console.print(chunk.text, style="green" if chunk.source == "draft" else None, end="",
                          highlight=False, markup=False)
    seconds = time.perf_counter() - t0
    ok = bool(check_answer(item, text, parser))
    if show:
        console.print(f"\n  -> {'correct' if ok else 'wrong'} (reference {item.reference}); "
                      f"{metrics.get('generated_tokens')} tokens, {metrics.get('steps')} steps, "
                      f"{metrics.get('accepted_steps')} drafted steps accepted", style="dim")
    return {"tokens": metrics.get("generated_tokens", 0), "seconds": seconds, "correct": ok,
            "accepted": metrics.get("accepted_steps", 0), "verified": metrics.get("verified_steps", 0)}


async def _run(client, items, spare, console, parser: str, peer: LlamaCppPeer | None) -> dict[str, list[dict]]:
    modes = MODES + ((PEER,) if peer is not None else ())

    async def one(item, mode, show):
        return peer.run(item, parser) if mode == PEER else await _one(client, item, mode, console, show, parser)

    for mode in modes:  # untimed warm-up on another problem: no timed run pays the first calls
        await one(spare, mode, False)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for i, item in enumerate(items):
        console.print(f"\n[bold]Problem {i + 1}[/bold]: {item.prompt}")
        k = i % len(modes)
        for mode in modes[k:] + modes[:k]:  # each mode goes first equally often
            runs[mode].append(await one(item, mode, mode == "lr+sd"))
    return runs


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from .evaluation.answers import load_items
    from .evaluation.runner import bootstrap_speedup_ci, format_speedup
    from .serving.client import TritonLRClient
    from .serving.server import ServerConfig, TritonServer, free_port, prepare_repository

    p = argparse.ArgumentParser(prog="lookahead_reasoning.demo", description=__doc__)
    # demo-llamacpp by default: of the two demo profiles it is the faster in tokens/s (its lr+sd 577 tok/s against the
    # portable profile's 151 on 200 problems, machine G; RESULTS.md, "Lookahead Reasoning over llama.cpp").
    p.add_argument("--profile", default="demo-llamacpp")
    p.add_argument("--problems", type=int, default=6)
    args = p.parse_args(argv)
    console = Console()
    *items, spare = load_items("synthetic", args.problems + 1)
    peer, peer_error = None, f"the {args.profile!r} profile's target is not the demo target"
    if args.profile in PEERED_PROFILES:
        try:
            peer = LlamaCppPeer()
        except (ImportError, ValueError, OSError) as exc:  # the llamacpp extra or the exported GGUF missing
            peer_error = f"{type(exc).__name__}: {exc}"
    repo = prepare_repository(args.profile, None, None)
    cfg = ServerConfig(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    console.print(f"Starting Triton with the {args.profile!r} profile (model repository {repo}) ...")
    t0 = time.perf_counter()
    try:
        with TritonServer(cfg) as server:
            console.print(f"Ready in {time.perf_counter() - t0:.0f} s: gRPC {server.grpc_url}")
            client = TritonLRClient(server.grpc_url, "grpc")
            parser = asyncio.run(client.server_profile())["parameters"].get("reasoning_parser") or "none"
            runs = asyncio.run(_run(client, items, spare, console, parser, peer))
    finally:
        shutil.rmtree(repo, ignore_errors=True)  # the temporary model repository
    tps = {m: sum(r["tokens"] for r in rs) / max(1e-9, sum(r["seconds"] for r in rs)) for m, rs in runs.items()}

    def ratio(mode: str, base: str) -> str:
        ci = bootstrap_speedup_ci(*([r[k] for r in runs[mode]] for k in ("tokens", "seconds")),
                                  *([r[k] for r in runs[base]] for k in ("tokens", "seconds")))
        return format_speedup(tps[mode] / tps[base], ci if mode != base else None) if tps[base] else "n/a"

    table = Table(title=f"{len(items)} held-out synthetic problems, {args.profile!r} through Triton (gRPC streaming) "
                        "and llama.cpp in this process, interleaved")
    cols = ["mode", "correct", "tokens/s", "vs our ar (95% CI)"] + (["vs llama.cpp plain (95% CI)"] if peer else [])
    for col in cols + ["step acceptance"]:
        table.add_column(col)
    for mode in runs:
        rs = runs[mode]
        verified = sum(r["verified"] for r in rs)
        acc = f"{sum(r['accepted'] for r in rs) / verified:.2f}" if verified else "n/a"
        row = [mode, f"{sum(r['correct'] for r in rs)}/{len(rs)}", f"{tps[mode]:.1f}", ratio(mode, "ar")]
        table.add_row(*row, *([ratio(mode, PEER)] if peer else []), acc)
    console.print(table)
    if peer is None:
        console.print(f"llama.cpp plain decoding not measured: {peer_error}", style="yellow")
    console.print(CLOSING, style="dim")
    return 0


#: What the demo shows, from the measurements in benchmarks/RESULTS.md (rewritten when they change).
CLOSING = ("Measured on 2 CPU cores (benchmarks/RESULTS.md, \"Lookahead Reasoning over llama.cpp\", 2026-12-08, 200 "
           "held-out problems, greedy, one run): llama.cpp decodes this target at 643 tok/s and its own draft-model "
           "speculative decoding (llama-server, 8 draft tokens) at 948; our lr+sd runs 577 tok/s on llama.cpp (0.90x "
           "llama.cpp's plain decoding; lr 607, 0.94x: verifying a drafted token costs ~0.25 of a decode there) and "
           "151 on the portable engine, where it is 2.75x that engine's own ar (55 tok/s). A CPU user is better "
           "served by llama.cpp's own speculative decoding today. The ratios above are this run's.")


if __name__ == "__main__":
    sys.exit(main())
