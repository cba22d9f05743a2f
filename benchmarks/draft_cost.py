"""The draft's cost ``c`` through the engine, eager against compiled, in one process (issue 19's ``c <= 0.12``).

``c`` is the draft's time per decoding step over the target's (Fu et al. 2025, section 3.2; measured as
:func:`lookahead_reasoning.core.calibration.calibrate` does: wall time of a 16-token call on the chat prompt of one
held-out problem of the demo task (long style), per token; each ``calibrate`` call takes the median of its 5 repeated
within-repeat ratios). The script starts the profile's target once and the
profile's draft twice, eager and with ``compile: true`` (``PortableEngineConfig.compile``: the decoding forwards
through ``torch.compile``, compiled at start-up), then runs ``--rounds`` rounds; each round calibrates both drafts
against the same target, in an order that alternates from round to round, so that neither setting always runs
first. It prints per setting the median ``c`` over rounds with its range, the draft's and target's ms per token,
and writes them as JSON (``--out``, with date, machine, command, each draft's start-up seconds and the load average).

Usage: python benchmarks/draft_cost.py [--profile demo | --config FILE] [--rounds 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from lookahead_reasoning.backends import make_engine
from lookahead_reasoning.core.calibration import calibrate
from lookahead_reasoning.core.lookahead import LookaheadReasoner
from lookahead_reasoning.evaluation.runner import load_average
from lookahead_reasoning.evaluation.synthetic import DEFAULT_STYLE, EVAL_SEED, generate_problems
from lookahead_reasoning.profiles import load_profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--config", default=None, help="a profile YAML instead of --profile")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, each calibrating both drafts (>= 1)")
    ap.add_argument("--out", default="benchmarks/out/draft_cost.json")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    profile = load_profile(args.profile, args.config)
    if profile.draft is None:
        ap.error(f"profile {profile.name!r} has no draft")
    load_start = load_average()
    target = make_engine(profile.target)
    drafts, startup_s = {}, {}
    samples: dict[str, list[dict]] = {"eager": [], "compiled": []}
    try:
        for name, compiled in (("eager", False), ("compiled", True)):
            t0 = time.perf_counter()
            drafts[name] = make_engine(profile.draft.model_copy(update={"compile": compiled}))
            startup_s[name] = time.perf_counter() - t0
            print(f"draft {name}: started in {startup_s[name]:.1f} s", file=sys.stderr)
        question = generate_problems(1, EVAL_SEED + 17, style=DEFAULT_STYLE)[0].question
        messages = [{"role": "user", "content": question}]
        reasoner = LookaheadReasoner(target, drafts["eager"], None, reasoning_parser=profile.reasoning_parser)
        tp = reasoner.prompt_ids(target, None, messages)
        dp = reasoner.prompt_ids(drafts["eager"], None, messages)
        for r in range(args.rounds):
            order = list(drafts) if r % 2 == 0 else list(drafts)[::-1]
            for name in order:
                cost = calibrate(target, drafts[name], ns=(), sd_ks=(), prompt_ids=tp, draft_prompt_ids=dp)
                samples[name].append({"c": cost.c, "draft_ms": 1e3 * cost.draft_step_seconds,
                                      "target_ms": 1e3 * cost.target_step_seconds})
                print(f"round {r + 1} {name}: c {cost.c:.3f}", file=sys.stderr)
    finally:
        for e in (target, *drafts.values()):
            e.close()
    summary = {}
    for name, rows in samples.items():
        cs = [x["c"] for x in rows]
        summary[name] = {"c_median": statistics.median(cs), "c_min": min(cs), "c_max": max(cs),
                         "draft_ms_median": statistics.median(x["draft_ms"] for x in rows),
                         "target_ms_median": statistics.median(x["target_ms"] for x in rows), "rounds": rows}
    print(f"{'draft':<10} {'c median':>9} {'c range':>15} {'draft ms/tok':>13} {'target ms/tok':>14}")
    for name, s in summary.items():
        print(f"{name:<10} {s['c_median']:>9.3f} {s['c_min']:>7.3f}-{s['c_max']:<7.3f} "
              f"{s['draft_ms_median']:>13.3f} {s['target_ms_median']:>14.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"),
                               "machine": platform.processor() or platform.machine(),
                               "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
                               "profile": profile.name, "rounds": args.rounds, "startup_s": startup_s,
                               "summary": summary,
                               "measurement": {"load_avg_start": load_start, "load_avg_end": load_average()}},
                              indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
