"""Named runs of the `smollm2` profile on the same GSM8K test questions, with per-request metrics kept
(role time split: draft / target / judge seconds; acceptance by depth; SD tokens per forward).

Each run is NAME=key:value;key:value (LROptions overrides: mode, gamma, judge, delimiter, max_step_tokens,
async). The first run should be `ar` (speedups are relative to it, on the same questions).

Usage:
  python benchmarks/smollm2_runs.py --limit 30 --out benchmarks/out/smollm2_delimiter.json \
      --run "ar=mode:ar" --run "lr_nl=mode:lr;delimiter:\\n" --run "lr_nlnl=mode:lr;delimiter:\\n\\n"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lookahead_reasoning.core.calibration import calibrate_reasoner
from lookahead_reasoning.core.metrics import RequestMetrics
from lookahead_reasoning.evaluation.answers import check_answer, load_items
from lookahead_reasoning.evaluation.runner import uses_chat_template
from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile
from tqdm import tqdm


def parse_run(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition("=")
    over: dict = {}
    for part in filter(None, spec.split(";")):
        k, _, v = part.partition(":")
        v = v.encode().decode("unicode_escape")
        if k in ("gamma", "max_step_tokens", "width"):
            v = int(v)
        if k in ("async",):
            v = v.lower() in ("1", "true", "yes")
        over[k] = v
    return name, over


def options_for(reasoner, over: dict):
    o = dict(over)
    step = reasoner.defaults.step.model_dump()
    if "delimiter" in o:
        step["delimiter"] = o.pop("delimiter")
    if "max_step_tokens" in o:
        step["max_step_tokens"] = o.pop("max_step_tokens")
    judge = reasoner.defaults.judge.model_dump()
    if "judge" in o:
        judge["name"] = o.pop("judge")
    if "async" in o:
        o["async_mode"] = o.pop("async")
    return reasoner.options(step=step, judge=judge, **o)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--run", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calibrate", action="store_true")
    args = ap.parse_args(argv)
    runs = [parse_run(r) for r in args.run]
    items = load_items(args.dataset, args.offset + args.limit)[args.offset:]
    profile = load_profile(args.profile)
    need_judge = any(o.get("judge") == "llm" for _, o in runs) or profile.options.judge.name == "llm"
    t0 = time.time()
    reasoner = build_reasoner(profile, need_draft=True, need_judge=need_judge)
    doc: dict = {"command": " ".join(["python"] + sys.argv), "profile": profile.name, "dataset": args.dataset,
                 "n": len(items), "offset": args.offset, "runs": {}}
    try:
        if args.calibrate:
            cost = calibrate_reasoner(reasoner, *items[0].request(uses_chat_template(reasoner)), ns=(2, 3, 5))
            reasoner.cost_model = cost
            doc["cost_model"] = cost.to_dict()
        chat = uses_chat_template(reasoner)
        with tqdm(total=len(items) * len(runs), file=sys.stderr, desc="runs") as bar:
            for name, over in runs:
                opts = options_for(reasoner, over)
                per = []
                for it in items:
                    prompt, messages = it.request(chat)
                    res = reasoner.run(prompt, messages, opts)
                    per.append({"id": it.id, "correct": check_answer(it, res.text), "text": res.text,
                                "finish": res.finish_reason, "metrics": res.metrics.to_dict()})
                    bar.update(1)
                doc["runs"][name] = {"options": opts.model_dump(mode="json"), "items": per,
                                     "summary": summarize(per, reasoner.cost_model)}
                print(name, json.dumps(doc["runs"][name]["summary"]), file=sys.stderr, flush=True)
                write(args.out, doc)  # finished runs survive an interrupt
    finally:
        close_reasoner(reasoner)
    base = next(iter(doc["runs"].values()))["summary"]
    for r in doc["runs"].values():
        s = r["summary"]
        s["speedup_vs_first"] = s["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None
        s["latency_speedup_vs_first"] = base["seconds"] / s["seconds"] if s["seconds"] else None
        for k in ("speedup_estimate", "bound_free_draft_and_judge"):  # predicted speedup vs the first run
            if s.get(k) is not None and base.get("speedup_estimate"):
                s[k + "_vs_first"] = s[k] / base["speedup_estimate"]
    doc["wall_seconds"] = time.time() - t0
    write(args.out, doc)
    print(json.dumps({k: v["summary"] for k, v in doc["runs"].items()}, indent=2))
    return 0


def write(path: str, doc: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def summarize(per: list[dict], cost=None) -> dict:
    """Totals of a run's per-item metrics, with the speed model's estimate and its free-draft-and-judge bound
    (lookahead_reasoning.core.metrics, equation (1)) when a cost model was calibrated."""
    ms = [p["metrics"] for p in per]
    total = RequestMetrics()
    for m in ms:
        total.merge(RequestMetrics.from_dict(m))
    t, d = total.target, total.draft
    tot = lambda k: sum(m[k] or 0 for m in ms)  # noqa: E731
    graded = [p["correct"] for p in per if p["correct"] is not None]
    seconds = tot("seconds")
    depth_acc, depth_ver = [], []
    for m in ms:
        for lst, src in ((depth_acc, m["accepted_by_depth"]), (depth_ver, m["verified_by_depth"])):
            while len(lst) < len(src):
                lst.append(0)
            for i, x in enumerate(src):
                lst[i] += x
    return {
        "accuracy": sum(graded) / len(graded) if graded else None,
        "generated_tokens": tot("generated_tokens"), "seconds": seconds,
        "tokens_per_s": tot("generated_tokens") / seconds if seconds else 0.0,
        "acceptance_rate": tot("accepted_steps") / tot("verified_steps") if tot("verified_steps") else None,
        "acceptance_by_depth": [a / v if v else None for a, v in zip(depth_acc, depth_ver, strict=False)],
        "steps": tot("steps"), "target_steps": tot("target_steps"), "cycles": tot("cycles"),
        "drafted_steps": tot("drafted_steps"), "verified_steps": tot("verified_steps"),
        "accepted_steps": tot("accepted_steps"),
        "steps_per_cycle": tot("steps") / tot("cycles") if tot("cycles") else None,
        "tokens_per_step": tot("generated_tokens") / tot("steps") if tot("steps") else None,
        "draft_token_share": d.tokens / tot("generated_tokens") if tot("generated_tokens") else None,
        "draft_seconds_share": d.seconds / seconds if seconds else None,
        "target_seconds_share": t.seconds / seconds if seconds else None,
        "judge_seconds_share": tot("judge_seconds") / seconds if seconds else None,
        "judge_seconds": tot("judge_seconds"), "draft_seconds": d.seconds, "target_seconds": t.seconds,
        "judge_ms_per_cycle": 1e3 * tot("judge_seconds") / tot("cycles") if tot("cycles") else None,
        "target_branches_per_cycle": t.branches / tot("cycles") if tot("cycles") else None,
        "sd_tokens_per_forward": t.call_tokens / t.forward_passes if t.forward_passes else None,
        "judge_fallbacks": tot("fallbacks"),
        "speedup_estimate": total.estimate(cost),
        "bound_free_draft_and_judge": total.estimate(cost, free_draft_and_judge=True),
        "finish": {k: sum(p["finish"] == k for p in per) for k in ("eos", "length", "stop")},
    }


if __name__ == "__main__":
    sys.exit(main())
