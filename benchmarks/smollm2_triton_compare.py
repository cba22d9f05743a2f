"""GSM8K test questions through a real Triton server (`lookahead-reasoning serve --profile smollm2`, gRPC
streaming through `lookahead_reasoning.serving.client.TritonLRClient`) and in-process (`LookaheadReasoner` on the
same profile), greedy, same seed: are the outputs equal?

Usage: python benchmarks/smollm2_triton_compare.py [--n 10] [--modes ar,sd,lr,lr+sd] [--out FILE]
           [--reference RUNS.json]

`--reference` takes the in-process texts from an earlier `benchmarks/smollm2_runs.py` output (run names equal to
the modes, same profile and dataset, greedy) instead of generating them again: on this 2-core CPU each side of
the comparison costs about 30 minutes for 10 questions in all four modes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lookahead_reasoning.evaluation.answers import check_answer, load_items
from lookahead_reasoning.serving.server import free_port


def start_server(profile: str, log_path: Path, timeout_s: float = 600.0):
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    exe = shutil.which("lookahead-reasoning") or str(Path(sys.executable).parent / "lookahead-reasoning")
    cmd = [exe, "serve", "--profile", profile, "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
           "--metrics-port", str(ports["metrics"]), "--log-file", str(log_path)]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ready = threading.Event()
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            print("[serve]", line.rstrip(), file=sys.stderr, flush=True)
            if line.startswith("Triton ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    while not ready.wait(1.0):
        if proc.poll() is not None or time.perf_counter() - t0 > timeout_s:
            stop_server(proc)
            raise RuntimeError(f"server did not start: {''.join(lines[-20:])}")
    return proc, ports, time.perf_counter() - t0


def stop_server(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # `serve` stops Triton cleanly on SIGINT
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_in_process(args, modes, items, doc) -> dict[str, list[dict]]:
    from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile

    t0 = time.time()
    profile = load_profile(args.profile)
    reasoner = build_reasoner(profile, need_draft=True, need_judge=profile.options.judge.name == "llm")
    local: dict[str, list[dict]] = {}
    try:
        for mode in modes:
            local[mode] = []
            opts = reasoner.options(mode=mode, sampling={"temperature": 0.0, "seed": args.seed})
            for it in items:
                t = time.perf_counter()
                res = reasoner.run(None, [dict(m) for m in it.messages], opts)
                local[mode].append({"id": it.id, "text": res.text, "seconds": time.perf_counter() - t,
                                    "metrics": res.metrics.to_dict()})
    finally:
        close_reasoner(reasoner)
    doc["in_process_wall_seconds"] = time.time() - t0
    return local


def reference_texts(path: Path, args, modes, items) -> dict[str, list[dict]]:
    """In-process rows from a `smollm2_runs.py` output; raises ValueError where that run differs from this one."""
    ref = json.loads(path.read_text())
    if ref["profile"] != args.profile or ref["dataset"] != args.dataset or ref.get("offset", 0) != 0:
        raise ValueError(f"{path}: profile/dataset/offset differ from this run")
    local = {}
    for mode in modes:
        run = ref["runs"].get(mode)
        if run is None or run["options"]["mode"] != mode or run["options"]["sampling"]["temperature"] != 0.0:
            raise ValueError(f"{path}: no greedy run named {mode!r}")
        by_id = {r["id"]: r for r in run["items"]}
        missing = [it.id for it in items if it.id not in by_id]
        if missing:
            raise ValueError(f"{path}: run {mode!r} lacks items {missing}")
        local[mode] = [{"id": it.id, "text": by_id[it.id]["text"], "metrics": by_id[it.id]["metrics"],
                        "seconds": by_id[it.id]["metrics"]["seconds"]} for it in items]
    return local


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="smollm2")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--modes", default="ar,sd,lr,lr+sd")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/out/smollm2_triton.json")
    ap.add_argument("--reference", help="smollm2_runs.py output to take the in-process texts from")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    items = load_items(args.dataset, args.n)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict = {"command": " ".join([sys.argv[0]] + (argv or sys.argv[1:])), "profile": args.profile,
                 "dataset": args.dataset, "n": len(items), "seed": args.seed, "temperature": 0.0, "modes": {}}

    # The reference is checked before the (long) served run.
    local = reference_texts(Path(args.reference), args, modes, items) if args.reference else None

    # 1. Through Triton (gRPC streaming).
    from lookahead_reasoning.serving.client import TritonLRClient

    t0 = time.time()
    proc, ports, startup = start_server(args.profile, out.with_name(out.stem + "_server.log"))
    doc["server_startup_seconds"] = startup
    served: dict[str, list[dict]] = {}
    try:
        client = TritonLRClient(f"127.0.0.1:{ports['grpc']}", "grpc", timeout_s=1200)
        for mode in modes:
            served[mode] = []
            for it in items:
                t = time.perf_counter()
                ans = asyncio.run(client.generate(messages=[dict(m) for m in it.messages], stream=True, mode=mode,
                                                  seed=args.seed, temperature=0.0))
                served[mode].append({"id": it.id, "text": ans.text, "seconds": time.perf_counter() - t,
                                     "chunks": len(ans.chunks), "metrics": ans.metrics})
                print(f"[triton] {mode} {it.id}: {ans.metrics.get('generated_tokens')} tokens, "
                      f"{time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    finally:
        stop_server(proc)
    doc["triton_wall_seconds"] = time.time() - t0

    # 2. In-process, same profile and options (or an earlier in-process run of them).
    if local is None:
        local = run_in_process(args, modes, items, doc)
    else:
        doc["in_process_reference"] = args.reference

    for mode in modes:
        rows = []
        for it, s, loc in zip(items, served[mode], local[mode], strict=False):
            rows.append({"id": it.id, "equal": s["text"] == loc["text"],
                         "triton_tokens": s["metrics"].get("generated_tokens"),
                         "in_process_tokens": loc["metrics"].get("generated_tokens"),
                         "triton_seconds": s["seconds"], "in_process_seconds": loc["seconds"],
                         "triton_acceptance": s["metrics"].get("acceptance_rate"),
                         "in_process_acceptance": loc["metrics"].get("acceptance_rate"),
                         "correct": check_answer(it, loc["text"]),
                         "triton_text": s["text"], "in_process_text": loc["text"]})
        doc["modes"][mode] = {"equal": sum(r["equal"] for r in rows), "n": len(rows),
                              "triton_tokens_per_s": (sum(r["triton_tokens"] or 0 for r in rows)
                                                      / sum(r["triton_seconds"] for r in rows)),
                              "in_process_tokens_per_s": (sum(r["in_process_tokens"] or 0 for r in rows)
                                                          / sum(r["in_process_seconds"] for r in rows)),
                              "rows": rows}
        print(f"{mode}: {doc['modes'][mode]['equal']}/{len(rows)} equal", file=sys.stderr)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({m: {k: v for k, v in d.items() if k != "rows"} for m, d in doc["modes"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
