"""Orchestration overhead of serving through Triton, at concurrency 1.

Runs the same held-out problems (greedy) in-process (``LookaheadReasoner`` over portable engines) and through a
real Triton server (gRPC streaming: BLS orchestrator + role models in their own processes), one request at a time,
and reports per-request end-to-end latency both ways and the overhead share
``(e2e_triton - e2e_in_process) / e2e_triton`` (goal <= 10%). Also checks the answers are identical.

Note: in-process, the three engines share one Python process (and its GIL); under Triton each role model is its
own process, so on a multi-core CPU Triton can even be faster. Both numbers are printed as measured.

Usage: python benchmarks/triton_overhead.py [--problems 20] [--mode lr+sd] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from lookahead_reasoning.core.lookahead import with_overrides
from lookahead_reasoning.evaluation.answers import load_items
from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile
from lookahead_reasoning.serving.client import TritonLRClient
from lookahead_reasoning.serving.server import ServerConfig, TritonServer, free_port, prepare_repository


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--mode", default="lr+sd")
    ap.add_argument("--out", default="benchmarks/out/triton_overhead.json")
    args = ap.parse_args(argv)
    items = load_items("synthetic", args.problems)
    profile = load_profile(args.profile)

    reasoner = build_reasoner(profile)
    opts = with_overrides(profile.options, mode=args.mode)
    try:
        reasoner.run(items[0].prompt, options=opts)  # warm-up
        local = []
        for it in items:
            t0 = time.perf_counter()
            res = reasoner.run(it.prompt, options=opts)
            local.append((time.perf_counter() - t0, res.text, res.metrics.generated_tokens))
    finally:
        close_reasoner(reasoner)

    repo = prepare_repository(args.profile, None, None)
    cfg = ServerConfig(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    with TritonServer(cfg) as server:
        client = TritonLRClient(server.grpc_url, "grpc")

        async def go():
            await client.generate(items[0].prompt, mode=args.mode)  # warm-up
            out = []
            for it in items:
                t0 = time.perf_counter()
                text = ""
                async for c in client.stream(it.prompt, mode=args.mode):
                    text += c.text
                out.append((time.perf_counter() - t0, text))
            return out

        remote = asyncio.run(go())
    e2e_local = [x[0] for x in local]
    e2e_remote = [x[0] for x in remote]
    same = sum(a[1] == b[1] for a, b in zip(local, remote, strict=False))
    total_local, total_remote = sum(e2e_local), sum(e2e_remote)
    doc = {
        "profile": args.profile, "mode": args.mode, "problems": len(items),
        "in_process_e2e_s": {"mean": statistics.mean(e2e_local), "median": statistics.median(e2e_local)},
        "triton_e2e_s": {"mean": statistics.mean(e2e_remote), "median": statistics.median(e2e_remote)},
        "overhead_share": (total_remote - total_local) / total_remote,
        "identical_answers": same,
        "tokens": sum(x[2] for x in local),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{len(items)} problems, mode {args.mode}, concurrency 1: in-process mean e2e "
          f"{doc['in_process_e2e_s']['mean'] * 1e3:.0f} ms, through Triton (gRPC streaming) "
          f"{doc['triton_e2e_s']['mean'] * 1e3:.0f} ms -> overhead {100 * doc['overhead_share']:.1f}% of e2e "
          f"(goal <= 10%); identical answers {same}/{len(items)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
