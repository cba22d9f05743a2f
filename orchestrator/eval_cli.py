"""The ``eval`` command's handler: several datasets, a ``--gamma`` sweep, plots (argument handling only).

Wiring in :mod:`.cli` (the ``eval`` parser is created with ``conflict_handler="resolve"`` so that the flags
added here replace the common ``--gamma``/``--dataset``)::

    e = sub.add_parser("eval", help=..., conflict_handler="resolve")
    ...; _common(e)
    add_eval_arguments(e)
    e.set_defaults(func=cmd_eval)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .answers import DATASETS


def add_eval_arguments(e: argparse.ArgumentParser) -> None:
    """``--dataset`` (comma-separated names or JSONL paths), ``--gamma`` (one value or a sweep), ``--plots``."""
    e.add_argument("--dataset", default="synthetic",
                   help=f"comma-separated datasets: {', '.join(DATASETS)}, or JSONL files")
    e.add_argument("--gamma", default=None,
                   help="lookahead depth; a comma-separated list (e.g. 1,2,4,6,8) also sweeps it for the speculative "
                        "modes (the main table then uses the profile's gamma)")
    e.add_argument("--plots", default=None, help="write PNG plots (acceptance by depth, speedup vs gamma) here")


def parse_gammas(text: str | None) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (integers >= 0, duplicates dropped); ValueError naming ``--gamma``."""
    if text is None:
        return []
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gamma: {text!r} is not an integer or a comma-separated list of integers") from None
    if not vals or any(v < 0 for v in vals):
        raise ValueError(f"--gamma: values must be integers >= 0, got {text!r}")
    return list(dict.fromkeys(vals))


def _table(doc: dict):
    from rich.table import Table

    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    table = Table(title=f"{doc['dataset']}: {doc['n']} items")
    for col in ("mode", "accuracy", "tok/s", "speedup vs ar", "acceptance", "estimate"):
        table.add_column(col)
    for mode, row in doc["modes"].items():
        acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.3f} ± {row['accuracy_stderr']:.3f}"
        table.add_row(mode, acc, f"{row['tokens_per_s']:.1f}", fmt(row["speedup_vs_ar"]),
                      fmt(row["acceptance_rate"]), fmt(row["speedup_estimate"]))
    for mode, rows in (doc.get("gamma_sweep") or {}).items():
        table.add_row(f"{mode} sweep", "", "", "  ".join(f"γ{r['gamma']}:{fmt(r['speedup_vs_ar'])}" for r in rows),
                      "  ".join(f"γ{r['gamma']}:{fmt(r['acceptance_rate'])}" for r in rows), "")
    return table


def eval_markdown(docs: list[dict], common: dict, plots: list | None = None) -> str:
    """Markdown headline tables (per dataset: one row per mode, then the gamma sweep) with date, machine and
    command, for ``benchmarks/RESULTS.md``."""
    f = lambda x, d=2: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    m = common.get("machine", {})
    lines = ["# Accuracy and speed", "", f"- date: {common.get('date')}",
             f"- machine: {m.get('cpu')} x{m.get('cpus')}; GPUs: {', '.join(m.get('gpus') or []) or 'none'}",
             f"- command: `{common.get('command')}`",
             "- tok/s = generated tokens / seconds, one request at a time; speedup = tok/s over ar's; acceptance = "
             "accepted / verified drafted steps; estimate = the speed model's predicted speedup vs ar (equation (1) "
             "of lookahead_reasoning.metrics for the mode over the same for ar, with the run's counts)", ""]
    for doc in docs:
        lines += [f"## {doc['dataset']} ({doc['n']} items)", "",
                  "| mode | accuracy | tok/s | speedup vs ar | acceptance | estimate |", "|---|---|---|---|---|---|"]
        for mode, r in doc["modes"].items():
            acc = "n/a" if r["accuracy"] is None else f"{r['accuracy']:.3f} ± {r['accuracy_stderr']:.3f}"
            lines.append(f"| {mode} | {acc} | {f(r['tokens_per_s'], 1)} | {f(r['speedup_vs_ar'])} "
                         f"| {f(r['acceptance_rate'])} | {f(r['speedup_estimate'])} |")
        for mode, rows in (doc.get("gamma_sweep") or {}).items():
            lines += ["", f"{mode}, gamma sweep:", "", "| gamma | speedup vs ar | acceptance | accuracy | estimate |",
                      "|---|---|---|---|---|"]
            lines += [f"| {r['gamma']} | {f(r['speedup_vs_ar'])} | {f(r['acceptance_rate'])} | {f(r['accuracy'], 3)} "
                      f"| {f(r['speedup_estimate'])} |" for r in rows]
        lines.append("")
    lines += [f"![{Path(p).stem}]({p})" for p in plots or []]
    return "\n".join(lines) + "\n"


def cmd_eval(args) -> int:
    """Validate everything, start the engines once, evaluate each dataset, write JSON and plots."""
    from rich.console import Console
    from tqdm import tqdm

    from .answers import load_items
    from .bench_report import environment
    from .calibration import calibrate_reasoner
    from .cli import _prepare
    from .evaluation import plot_eval, report_json, run_eval, run_gamma_sweep, run_mode, uses_chat_template, write_json
    from .lookahead import MODES
    from .profiles import close_reasoner, load_profile

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes: unknown mode {bad[0] if bad else '(none)'!r} (choose from {', '.join(MODES)})")
    if args.limit is not None and args.limit <= 0:
        raise ValueError("--limit: must be > 0")
    gammas = parse_gammas(args.gamma)
    sweep = len(gammas) > 1
    cap = load_profile(args.profile, args.config).max_gamma_cap
    if any(g > cap for g in gammas):
        raise ValueError(f"--gamma: {max(gammas)} exceeds this profile's cap of {cap}")
    datasets = [d.strip() for d in args.dataset.split(",") if d.strip()]
    if not datasets:
        raise ValueError("--dataset: no dataset given")
    items = {d: load_items(d, args.limit) for d in datasets}
    spec_modes = [m for m in modes if m in ("lr", "lr+sd")]
    ns = argparse.Namespace(**{**vars(args), "gamma": None if sweep or not gammas else gammas[0]})
    reasoner, base = _prepare(ns, modes)
    docs = []
    try:
        cost = None
        if spec_modes:
            first = next(it for its in items.values() for it in its)
            cost = calibrate_reasoner(reasoner, *first.request(uses_chat_template(reasoner)),
                                      ns=tuple(range(2, max(gammas + [base.gamma]) + 2)))
            reasoner.cost_model = cost
        extra_runs = len(spec_modes) * sum(g != base.gamma for g in gammas) + ("ar" not in modes) if sweep else 0
        per_item = len(modes) + extra_runs
        total = sum(len(v) for v in items.values()) * per_item
        with tqdm(total=total, desc="eval", unit="req", file=sys.stderr) as bar:
            for name, its in items.items():
                reports = run_eval(reasoner, its, modes, base, progress=bar.update, keep_outputs=args.keep_outputs)
                extra = {}
                if sweep:
                    ar = reports.get("ar") or run_mode(reasoner, its, base.model_copy(update={"mode": "ar"}), bar.update)
                    extra["gamma_sweep"] = {
                        m: run_gamma_sweep(reasoner, its, m, gammas, base, baseline=ar, done={base.gamma: reports[m]},
                                           progress=bar.update)
                        for m in spec_modes}
                docs.append(report_json(name, reports, extra))
    finally:
        close_reasoner(reasoner)
    common = {"cost_model": cost.to_dict() if cost else None, "options": base.model_dump(mode="json"), **environment()}
    console = Console(file=sys.stderr)
    for doc in docs:
        console.print(_table(doc))
    plots = plot_eval(docs, args.plots) if args.plots else []
    for p in plots:
        console.print(f"plot: {p}")
    if args.out:
        write_json(args.out, {**docs[0], **common} if len(docs) == 1 else {"datasets": docs, **common})
        md = Path(args.out).with_suffix(".md")
        md.write_text(eval_markdown(docs, common, [os.path.relpath(p, md.parent) for p in plots]))
        console.print(f"summary: {md}")
    return 0
