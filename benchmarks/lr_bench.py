"""Lookahead Reasoning benchmark on held-out synthetic problems (in-process, concurrency 1, greedy).

Runs ``ar`` (the baseline), ``sd``, ``lr`` and ``lr+sd`` (sync and async) with the profile's judge, then
``lr+sd`` (sync) with every other verifier, on the same problems; prints and writes a table of accuracy (with
standard error), tokens/s, measured speedup vs ``ar``, step acceptance, the analytic estimate of the speed
model (lookahead_reasoning.metrics, equations (1)-(2), with calibrated c and b(n)) and measured / estimate.

Usage: python benchmarks/lr_bench.py [--problems 200] [--profile demo] [--verifiers exact,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

from tqdm import tqdm

from lookahead_reasoning.answers import load_items
from lookahead_reasoning.calibration import calibrate
from lookahead_reasoning.evaluation import run_mode
from lookahead_reasoning.lookahead import with_overrides
from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--config", default=None)
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--gamma", type=int, default=None)
    ap.add_argument("--verifiers", default="exact,normalized,numeric,embedding,random",
                    help="extra lr+sd (sync) runs, one per verifier")
    ap.add_argument("--skip", default="", help="comma-separated run names to skip")
    ap.add_argument("--out", default="benchmarks/out/lr_bench.json")
    args = ap.parse_args(argv)

    profile = load_profile(args.profile, args.config)
    items = load_items(args.dataset, args.problems)
    reasoner = build_reasoner(profile)
    base = with_overrides(profile.options, gamma=args.gamma)
    judge = base.judge.name
    runs = [("ar", {"mode": "ar"}), ("sd", {"mode": "sd"}),
            (f"lr sync [{judge}]", {"mode": "lr"}), (f"lr async [{judge}]", {"mode": "lr", "async_mode": True}),
            (f"lr+sd sync [{judge}]", {"mode": "lr+sd"}),
            (f"lr+sd async [{judge}]", {"mode": "lr+sd", "async_mode": True})]
    for v in [v for v in args.verifiers.split(",") if v and v != judge]:
        runs.append((f"lr+sd sync [{v}]", {"mode": "lr+sd", "judge": base.judge.model_copy(update={"name": v})}))
    skip = set(filter(None, args.skip.split(",")))
    runs = [r for r in runs if r[0] not in skip]
    t0 = time.time()
    cost = calibrate(reasoner.target, reasoner.draft, ns=(base.gamma + 1,))
    reasoner.cost_model = cost
    rows = {}
    try:
        with tqdm(total=len(items) * len(runs), desc="lr_bench", unit="req", file=sys.stderr) as bar:
            for name, update in runs:
                rows[name] = run_mode(reasoner, items, base.model_copy(update=update), progress=bar.update)
    finally:
        close_reasoner(reasoner)
    ar = rows["ar"]
    table = []
    for name, r in rows.items():
        speedup = r.tokens_per_s / ar.tokens_per_s if ar.tokens_per_s else None
        est = r.speedup_estimate
        table.append({
            "run": name, "accuracy": r.accuracy, "accuracy_stderr": r.accuracy_stderr, "tokens_per_s": r.tokens_per_s,
            "speedup_vs_ar": speedup, "acceptance_rate": r.acceptance_rate, "acceptance_by_depth": r.acceptance_by_depth,
            "speedup_estimate": est, "measured_over_estimate": (speedup / est) if (speedup and est) else None,
            "tokens": r.tokens, "seconds": r.seconds, "judge_fallbacks": r.fallbacks,
            "cycle": cycle_profile(r, ar, cost),
        })
    doc = {"date": date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
           "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])), "profile": profile.name,
           "problems": len(items), "gamma": base.gamma, "cost_model": cost.to_dict(), "wall_seconds": time.time() - t0,
           "runs": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(markdown(doc))
    return 0


def cycle_profile(r, ar, cost) -> dict | None:
    """Where one cycle's time goes, in units of T = the ``ar`` run's seconds per step (same problems), next to
    what the speed model assumes: ``gamma * c`` for drafting and ``b(gamma + 1)`` for the batched target call
    (DESIGN.md section 1). ``other`` is wall time outside engine and judge calls (orchestration)."""
    if not r.cycles or not ar.steps or not r.verified_steps:
        return None
    t = ar.seconds / ar.steps
    per = lambda x: x / r.cycles / t  # noqa: E731
    gamma = r.gamma_sum / r.cycles
    return {"T_ms": 1e3 * t, "steps_per_cycle": r.steps / r.cycles, "mean_gamma": gamma,
            "draft": per(r.draft_seconds), "target": per(r.target_seconds), "judge": per(r.judge_seconds),
            "other": per(r.seconds - r.draft_seconds - r.target_seconds - r.judge_seconds),
            "total": per(r.seconds), "model_draft": gamma * cost.c if cost.c is not None else None,
            "model_target": cost.b_of(gamma + 1)}


def markdown(doc: dict) -> str:
    f = lambda x, d=2: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    cm = doc["cost_model"]
    lines = [f"{doc['problems']} held-out problems, profile {doc['profile']}, gamma {doc['gamma']}; calibrated "
             f"c = {f(cm['c'], 3)}, b = {cm['b']}, target step {f(cm['target_step_ms'])} ms", "",
             "| run | accuracy | tok/s | speedup vs ar | acceptance | estimate | measured/estimate |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        acc = f"{100 * r['accuracy']:.1f}% ± {100 * r['accuracy_stderr']:.1f}" if r["accuracy"] is not None else "n/a"
        lines.append(f"| {r['run']} | {acc} | {f(r['tokens_per_s'], 1)} | {f(r['speedup_vs_ar'])} | "
                     f"{f(r['acceptance_rate'])} | {f(r['speedup_estimate'])} | {f(r['measured_over_estimate'])} |")
    lines += ["", "Per cycle, in units of T = one `ar` step (measured; async runs overlap draft and target time):", "",
              "| run | steps/cycle | draft (model gamma*c) | target call (model b(gamma+1)) | judge | other | total |",
              "|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        c = r.get("cycle")
        if c:
            lines.append(f"| {r['run']} | {f(c['steps_per_cycle'])} | {f(c['draft'])} ({f(c['model_draft'])}) | "
                         f"{f(c['target'])} ({f(c['model_target'])}) | {f(c['judge'])} | {f(c['other'])} | "
                         f"{f(c['total'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
