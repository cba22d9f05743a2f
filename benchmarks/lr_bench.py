"""Lookahead Reasoning benchmark on held-out synthetic problems (in-process, concurrency 1, greedy).

Runs ``ar`` (the baseline), ``sd``, ``lr`` and ``lr+sd`` (sync and async, and sync with adaptive gamma) with the
profile's judge and SD method, then ``lr+sd`` (sync) with every other verifier, ``sd`` and ``lr+sd`` with n-gram SD
(when the profile's SD is another method) and with draft-model SD (unless it is the profile's, at the same k), ``sd``
and ``lr+sd`` with Medusa SD and with EAGLE-3 SD (when the profile's target has Medusa heads / an EAGLE-3 head), and
``lr+sd`` at other gammas (``--sweep``), on the same problems; prints and writes a table of accuracy (with
standard error), tokens/s, measured speedup vs ``ar``, step acceptance, the analytic estimate of the speed
model (lookahead_reasoning.core.metrics, equations (1)-(2), with calibrated c, b(n) and v(w)), measured / estimate,
and the same estimate with the independence form of E[steps] (the paper's) for comparison.

Measurement (lookahead_reasoning.evaluation.runner.run_interleaved): one untimed warm-up request per run on a spare
problem (problem ``--problems + 1``), then all runs interleaved per problem in a rotated order (problem ``i``
starts at run ``i mod len(runs)``); speedups carry a 95% paired bootstrap interval over problems, and the JSON
a ``measurement`` block with the 1-minute load average at start and end (a warning above 0.5 per core).

Usage: python benchmarks/lr_bench.py [--problems 200] [--profile demo] [--verifiers exact,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from datetime import date
from pathlib import Path

from lookahead_reasoning.backends.base import SpecDecodeConfig
from lookahead_reasoning.core.calibration import calibrate_reasoner
from lookahead_reasoning.core.lookahead import with_overrides
from lookahead_reasoning.evaluation.runner import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    INTERLEAVED_ORDER,
    PREFIX_CACHE_NOTE,
    WARMUP_REQUESTS,
    format_speedup,
    load_average,
    load_with_spare,
    measurement_block,
    run_interleaved,
    uses_chat_template,
)
from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile
from tqdm import tqdm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--config", default=None)
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--gamma", type=int, default=None)
    ap.add_argument("--verifiers", default="exact,normalized,numeric,embedding,random",
                    help="extra lr+sd (sync) runs, one per verifier")
    ap.add_argument("--skip", default="", help="comma-separated run names to skip (commas inside a name's brackets "
                                               "belong to the name)")
    ap.add_argument("--sweep", default="1,2,3,6,8",
                    help="extra lr+sd (sync) runs at these gammas (with the profile's judge); '' for none")
    ap.add_argument("--sd-draft-tokens", type=int, default=4,
                    help="tokens per proposal of the draft-model SD runs (0: skip them)")
    ap.add_argument("--ngram-tokens", type=int, default=6,
                    help="tokens per proposal of the n-gram SD runs added when the profile's default SD is another "
                         "method (0: skip them)")
    ap.add_argument("--medusa-tokens", type=int, default=None,
                    help="tokens per proposal of the Medusa SD runs (default: all the target's heads; 0: skip them)")
    ap.add_argument("--eagle-tokens", type=int, default=4,
                    help="tokens per proposal of the EAGLE-3 SD runs (when the target has an EAGLE-3 head; "
                         "0: skip them)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature of every run (default: the profile's; 0.6 is how Qwen3 and R1 are run)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed of every request (with --temperature)")
    ap.add_argument("--out", default="benchmarks/out/lr_bench.json")
    args = ap.parse_args(argv)

    load_start = load_average()  # before this process loads the CPU
    profile = load_profile(args.profile, args.config)
    items, spare = load_with_spare(args.dataset, args.problems)
    reasoner = build_reasoner(profile)
    sampling = profile.options.sampling.model_dump()
    sampling.update({k: v for k, v in (("temperature", args.temperature), ("seed", args.seed)) if v is not None})
    base = with_overrides(profile.options, gamma=args.gamma, sampling=sampling)
    judge = base.judge.name
    runs = [("ar", {"mode": "ar"}), ("sd", {"mode": "sd"}),
            (f"lr sync [{judge}]", {"mode": "lr"}), (f"lr async [{judge}]", {"mode": "lr", "async_mode": True}),
            (f"lr+sd sync [{judge}]", {"mode": "lr+sd"}),
            (f"lr+sd async [{judge}]", {"mode": "lr+sd", "async_mode": True}),
            (f"lr+sd sync [{judge}] adaptive gamma", {"mode": "lr+sd", "adaptive_gamma": True})]
    for v in [v for v in args.verifiers.split(",") if v and v != judge]:
        runs.append((f"lr+sd sync [{v}]", {"mode": "lr+sd", "judge": base.judge.model_copy(update={"name": v})}))
    if args.ngram_tokens and base.target_spec.method != "ngram":  # the profile's default SD is another method
        ng = SpecDecodeConfig(method="ngram", num_speculative_tokens=args.ngram_tokens, prompt_lookup_max=2)
        runs += [(f"sd [n-gram, k={args.ngram_tokens}]", {"mode": "sd", "target_spec": ng}),
                 (f"lr+sd sync [{judge}, n-gram SD]", {"mode": "lr+sd", "target_spec": ng})]
    if args.sd_draft_tokens and not (base.target_spec.method == "draft_model"
                                     and base.target_spec.num_speculative_tokens == args.sd_draft_tokens):
        dm = SpecDecodeConfig(method="draft_model", num_speculative_tokens=args.sd_draft_tokens)
        runs += [(f"sd [draft model, k={dm.num_speculative_tokens}]", {"mode": "sd", "target_spec": dm}),
                 (f"lr+sd sync [{judge}, draft-model SD]", {"mode": "lr+sd", "target_spec": dm}),
                 (f"lr+sd sync [{judge}, draft-model SD] gamma=1", {"mode": "lr+sd", "target_spec": dm, "gamma": 1})]
    medusa_k = args.medusa_tokens
    if medusa_k is None:
        medusa_k = reasoner.target.medusa.num_heads if getattr(reasoner.target, "medusa", None) is not None else 0
    if medusa_k:
        md = SpecDecodeConfig(method="medusa", num_speculative_tokens=medusa_k)
        runs += [(f"sd [Medusa, k={medusa_k}]", {"mode": "sd", "target_spec": md}),
                 (f"lr+sd sync [{judge}, Medusa SD]", {"mode": "lr+sd", "target_spec": md})]
    if args.eagle_tokens and getattr(reasoner.target, "eagle3", None) is not None:
        ea = SpecDecodeConfig(method="eagle3", num_speculative_tokens=args.eagle_tokens)
        runs += [(f"sd [EAGLE-3, k={args.eagle_tokens}]", {"mode": "sd", "target_spec": ea}),
                 (f"lr+sd sync [{judge}, EAGLE-3 SD]", {"mode": "lr+sd", "target_spec": ea})]
    gammas = sorted({int(g) for g in args.sweep.split(",") if g.strip()} - {base.gamma})
    for g in gammas:
        runs.append((f"lr+sd sync [{judge}] gamma={g}",
                     {"mode": "lr+sd", "gamma": g, "max_gamma": max(g, base.max_gamma)}))
    # run names hold commas inside their brackets ("lr+sd sync [llm, Medusa SD]"): split only outside them
    skip = {n.strip() for n in re.split(r",(?![^\[]*\])", args.skip) if n.strip()}
    runs = [r for r in runs if r[0] not in skip]
    t0 = time.time()
    cost = calibrate_reasoner(reasoner, *items[0].request(uses_chat_template(reasoner)),
                              ns=tuple(range(2, max(gammas + [base.gamma]) + 2)))
    reasoner.cost_model = cost
    try:
        with tqdm(total=len(items) * len(runs), desc="lr_bench", unit="req", file=sys.stderr) as bar:
            rows = run_interleaved(reasoner, items, {name: base.model_copy(update=update) for name, update in runs},
                                   progress=bar.update, warmup=WARMUP_REQUESTS, warmup_item=spare)
    finally:
        close_reasoner(reasoner)
    ar = rows.get("ar")
    table = []
    for name, r in rows.items():
        speedup = r.speedup_vs(ar)
        est = r.estimate(ar)
        table.append({
            "run": name, "accuracy": r.accuracy, "accuracy_stderr": r.accuracy_stderr, "tokens_per_s": r.tokens_per_s,
            "speedup_vs_ar": speedup, "speedup_vs_ar_ci95": r.speedup_ci(ar),
            "acceptance_rate": r.acceptance_rate, "acceptance_by_depth": r.acceptance_by_depth,
            "speedup_estimate": est, "measured_over_estimate": (speedup / est) if (speedup and est) else None,
            "speedup_estimate_iid": r.estimate(ar, iid=True),
            "bound_free_draft_and_judge": r.estimate(ar, free_draft_and_judge=True),
            "gamma": r.totals.gamma_sum / r.totals.cycles if r.totals.cycles else None,
            "steps_per_cycle": r.totals.steps_per_cycle, "steps_per_answer": r.steps_per_answer,
            "tokens": r.tokens, "seconds": r.seconds, "judge_fallbacks": r.totals.fallbacks,
            "cycle": cycle_profile(r.totals, ar.totals, cost) if ar is not None else None,
            **token_sd(r.totals.target),
            "solved_vs_ar": r.solved_changes(ar), "per_item": r.per_item_json(),
        })
    measurement = measurement_block(
        load_start, warmup_requests_per_mode=WARMUP_REQUESTS,
        warmup_item=f"{spare.id} (not measured)" if spare else f"{items[0].id} (the first measured problem, once more "
                                                                  "untimed)",
        order=INTERLEAVED_ORDER, prefix_cache=PREFIX_CACHE_NOTE, bootstrap_resamples=BOOTSTRAP_RESAMPLES,
        bootstrap_seed=BOOTSTRAP_SEED,
        interval="speedup_vs_ar_ci95: 2.5th-97.5th percentiles of the paired bootstrap over problems")
    doc = {"date": date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
           "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])), "profile": profile.name,
           "problems": len(items), "gamma": base.gamma, "judge": judge, "sampling": base.sampling.model_dump(),
           "cost_model": cost.to_dict(), "wall_seconds": time.time() - t0,
           "measurement": measurement, "runs": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(markdown(doc))
    if measurement.get("warning"):
        print(f"warning: {measurement['warning']}", file=sys.stderr)
    return 0


def token_sd(t) -> dict:
    """Token-level SD inside the target's calls (``t``: the run's target RoleCounters): tokens per decoding
    forward of a row (the acceptance length, 1 + accepted proposals per forward) and the acceptance at each
    proposal position (accepted / proposed there; position ``i`` needs ``0..i-1`` accepted)."""
    if not t.proposed_tokens:
        return {"sd_tokens_per_forward": None, "sd_acceptance_by_position": None}
    return {"sd_tokens_per_forward": 1 + t.accepted_tokens / t.forward_passes,
            "sd_acceptance_by_position": [a / n if n else None for a, n in
                                          zip(t.accepted_by_position + [0] * len(t.proposed_by_position),
                                              t.proposed_by_position, strict=False)]}


def cycle_profile(r, ar, cost) -> dict | None:
    """Where one cycle's time goes (``r``, ``ar``: a run's merged RequestMetrics), in units of T = the ``ar``
    run's seconds per step (same problems), next to what equation (1) of lookahead_reasoning.core.metrics charges
    for each part (``RequestMetrics.cycle_cost``, converted to the same unit; the target's share includes its
    prefill). ``other`` is wall time outside engine and judge calls (orchestration)."""
    terms = r.cycle_cost(cost)
    if terms is None or not ar.steps or not r.verified_steps:
        return None
    t = ar.seconds / ar.steps
    per = lambda x: x / r.cycles / t  # noqa: E731
    model = lambda x: x * cost.target_step_seconds / t  # noqa: E731
    return {"T_ms": 1e3 * t, "steps_per_cycle": r.steps / r.cycles, "mean_gamma": r.gamma_sum / r.cycles,
            "drafted_steps_per_cycle": r.drafted_steps / r.cycles,
            "longest_branch_forwards": r.target.call_forwards / r.target.calls,
            "rows_per_forward": r.target.forward_passes / r.target.call_forwards,
            "draft": per(r.draft.seconds), "target": per(r.target.seconds), "judge": per(r.judge_seconds),
            "other": per(r.seconds - r.draft.seconds - r.target.seconds - r.judge_seconds),
            "total": per(r.seconds), "model_draft": model(terms["draft"]),
            "model_target": model(terms["target"] + terms["prefill"]), "model_judge": model(terms["judge"])}


def markdown(doc: dict) -> str:
    """The report's markdown: setup and measurement lines (the load warning in bold), then the tables; speedups
    read ``"1.23 [1.10, 1.35]"`` (point estimate [95% paired bootstrap interval over problems])."""
    f = lambda x, d=2: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    cm = doc["cost_model"]
    meas = doc.get("measurement") or {}
    lines = [f"{doc['problems']} held-out problems, profile {doc['profile']}, gamma {doc['gamma']}; calibrated "
             f"c = {f(cm['c'], 3)}, b = {cm['b']}, v = {cm.get('v')}, target step {f(cm['target_step_ms'])} ms", ""]
    if meas:
        if meas.get("warning"):
            lines += [f"**Warning: {meas['warning']}**", ""]
        lines += [f"Measured with {meas.get('warmup_requests_per_mode')} untimed warm-up request(s) per run, runs "
                  f"{meas.get('order')}, prefix cache {meas.get('prefix_cache')}; speedup intervals: 95% paired "
                  f"bootstrap over problems ({meas.get('bootstrap_resamples')} resamples); 1-minute load average "
                  f"{f(meas.get('load_avg_1min_start'))} at start, {f(meas.get('load_avg_1min_end'))} at end "
                  f"(includes this run), {meas.get('cpu_count')} cores.", ""]
    lines += [
             "| run | accuracy | solved vs ar: lost / gained | tok/s | speedup vs ar | acceptance | by depth 0-3 | "
             "estimate | measured/estimate | i.i.d. estimate | bound (free draft and judge) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        acc = f"{100 * r['accuracy']:.1f}% ± {100 * r['accuracy_stderr']:.1f}" if r["accuracy"] is not None else "n/a"
        sv = r.get("solved_vs_ar")
        solved = f"{sv['lost']} / {sv['gained']}" if sv else "n/a"
        depth = " / ".join(f(a) for a in (r.get("acceptance_by_depth") or [])[:4]) or "n/a"
        lines.append(f"| {r['run']} | {acc} | {solved} | "
                     f"{f(r['tokens_per_s'], 1)} | {format_speedup(r['speedup_vs_ar'], r.get('speedup_vs_ar_ci95'))} | "
                     f"{f(r['acceptance_rate'])} | {depth} | {f(r['speedup_estimate'])} | "
                     f"{f(r['measured_over_estimate'])} | "
                     f"{f(r['speedup_estimate_iid'])} | {f(r['bound_free_draft_and_judge'])} |")
    name = f"lr+sd sync [{doc['judge']}]"
    sweep = sorted((r for r in doc["runs"] if r["run"].split(" gamma=")[0] == name), key=lambda r: r["gamma"] or 0)
    if len(sweep) > 1:
        lines += ["", "Lookahead depth (lr+sd sync, same judge): measured, equation (1), and the bound with a free "
                  "draft and judge (c = 0, J = 0) at the measured acceptance:", "",
                  "| gamma | accuracy | speedup vs ar | acceptance | steps/cycle | estimate | measured/estimate | "
                  "bound (free draft and judge) |", "|---|---|---|---|---|---|---|---|"]
        for r in sweep:
            lines.append(f"| {f(r['gamma'], 0)} | {100 * r['accuracy']:.1f}% | "
                         f"{format_speedup(r['speedup_vs_ar'], r.get('speedup_vs_ar_ci95'))} | "
                         f"{f(r['acceptance_rate'])} | {f(r['steps_per_cycle'])} | {f(r['speedup_estimate'])} | "
                         f"{f(r['measured_over_estimate'])} | {f(r['bound_free_draft_and_judge'])} |")
    lines += ["", "Per cycle, in units of T = one `ar` step (measured; async runs overlap draft and target time;",
              "in brackets what equation (1) charges):", "",
              "| run | steps/cycle | draft | target call | judge | other | total |",
              "|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        c = r.get("cycle")
        if c:
            lines.append(f"| {r['run']} | {f(c['steps_per_cycle'])} | {f(c['draft'])} ({f(c['model_draft'])}) | "
                         f"{f(c['target'])} ({f(c['model_target'])}) | {f(c['judge'])} | {f(c['other'])} | "
                         f"{f(c['total'])} |")
    sd = [r for r in doc["runs"] if r.get("sd_tokens_per_forward")]
    if sd:
        lines += ["", "Token-level SD inside the target's calls: tokens per decoding forward of a row (acceptance "
                  "length) and acceptance at each proposal position:", "",
                  "| run | tokens/forward | acceptance by position |", "|---|---|---|"]
        for r in sd:
            pos = " / ".join(f(a) for a in r["sd_acceptance_by_position"])
            lines.append(f"| {r['run']} | {f(r['sd_tokens_per_forward'])} | {pos} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
