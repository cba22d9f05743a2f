"""The main job on the embedded demo models (``make demo`` / ``python -m lookahead_reasoning.demo``).

Starts a real Triton server with the demo trio (127.0.0.1, free ports), sends held-out synthetic problems
through gRPC streaming in ``lr+sd`` mode (printing each step as it arrives: accepted draft steps in green,
target steps plain), sends the same problems in ``ar`` mode, prints answers, accuracy and the measured
speedup, and stops the server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time



async def _run(client, items, mode: str, console, show: bool):
    from .answers import check_answer

    tokens, seconds, correct, accepted, verified = 0, 0.0, 0, 0, 0
    for i, item in enumerate(items):
        if show:
            console.print(f"\n[bold]Problem {i + 1}[/bold]: {item.prompt}")
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
        seconds += time.perf_counter() - t0
        tokens += metrics.get("generated_tokens", 0)
        accepted += metrics.get("accepted_steps", 0)
        verified += metrics.get("verified_steps", 0)
        ok = check_answer(item, text)
        correct += int(bool(ok))
        if show:
            console.print(f"\n  -> {'correct' if ok else 'wrong'} (reference {item.reference}); "
                          f"{metrics.get('generated_tokens')} tokens, {metrics.get('steps')} steps, "
                          f"{metrics.get('accepted_steps')} drafted steps accepted", style="dim")
    return {"tokens": tokens, "seconds": seconds, "correct": correct, "n": len(items),
            "acceptance": accepted / verified if verified else None}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from .answers import load_items
    from .serving.client import TritonLRClient
    from .serving.server import ServerConfig, TritonServer, free_port, prepare_repository

    p = argparse.ArgumentParser(prog="lookahead_reasoning.demo", description=__doc__)
    p.add_argument("--profile", default="demo")
    p.add_argument("--problems", type=int, default=5)
    args = p.parse_args(argv)
    console = Console()
    *items, spare = load_items("synthetic", args.problems + 1)
    repo = prepare_repository(args.profile, None, None)
    cfg = ServerConfig(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    console.print(f"Starting Triton with the {args.profile!r} profile (model repository {repo}) ...")
    t0 = time.perf_counter()
    with TritonServer(cfg) as server:
        console.print(f"Ready in {time.perf_counter() - t0:.0f} s: gRPC {server.grpc_url}")
        client = TritonLRClient(server.grpc_url, "grpc")
        for mode in ("lr+sd", "ar"):  # warm-up on another problem: neither timed run pays the first calls
            asyncio.run(_run(client, [spare], mode, console, show=False))
        lr = asyncio.run(_run(client, items, "lr+sd", console, show=True))
        console.print("\nSame problems, target alone (ar) ...")
        ar = asyncio.run(_run(client, items, "ar", console, show=False))
    table = Table(title=f"{len(items)} held-out synthetic problems through Triton (gRPC streaming)")
    for col in ("mode", "correct", "tokens/s", "speedup", "step acceptance"):
        table.add_column(col)
    for name, r in (("ar", ar), ("lr+sd", lr)):
        tps = r["tokens"] / r["seconds"] if r["seconds"] else 0.0
        base = ar["tokens"] / ar["seconds"] if ar["seconds"] else 0.0
        acc = "n/a" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        table.add_row(name, f"{r['correct']}/{r['n']}", f"{tps:.1f}", f"{tps / base:.2f}x" if base else "n/a", acc)
    console.print(table)
    console.print("On the demo trio on a CPU, lr+sd is slower than ar (a cycle yields ~1.6 steps and costs more than "
                  "that in target time): the measured reasons are in benchmarks/RESULTS.md, issue-4 and issue-18 "
                  "sections.",
                  style="dim")
    return 0


if __name__ == "__main__":
    sys.exit(main())
