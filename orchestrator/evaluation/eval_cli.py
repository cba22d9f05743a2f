"""The ``eval`` command's handler: several datasets, a ``--gamma`` sweep, plots (argument handling only).

Wiring in :mod:`..cli`: the request's flags without those ``eval`` sets itself (:data:`EVAL_SKIP`: the prompt
comes from the datasets, the modes from ``--modes``, and ``--gamma`` is a list here), then
:func:`add_eval_arguments`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .answers import DATASETS

#: Request fields the ``eval`` command does not take as request flags.
EVAL_SKIP = ("prompt", "messages", "mode", "gamma", "include_stop_str_in_output")  # eval grades the raw answers


def add_eval_arguments(e: argparse.ArgumentParser) -> None:
    """``--dataset`` (comma-separated names or JSONL paths), ``--gamma`` (one value or a sweep), ``--plots``."""
    e.add_argument("--dataset", default="synthetic",
                   help=f"comma-separated datasets: {', '.join(DATASETS)}, or JSONL files")
    e.add_argument("--gamma", default=None,
                   help="lookahead depth; a comma-separated list (e.g. 1,2,4,6,8) also sweeps it for the speculative "
                        "modes (the main table then uses the profile's gamma)")
    e.add_argument("--plots", default=None, help="write PNG plots (acceptance by depth, speedup vs gamma) here")
    e.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")


def parse_gammas(text: str | None) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (integers >= 1: LR drafts gamma steps per cycle; duplicates dropped);
    ValueError naming ``--gamma``."""
    if text is None:
        return []
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gamma: {text!r} is not an integer or a comma-separated list of integers") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"--gamma: values must be integers >= 1, got {text!r}")
    return list(dict.fromkeys(vals))


def _table(doc: dict):
    from rich.table import Table

    from .runner import format_speedup

    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    table = Table(title=f"{doc['dataset']}: {doc['n']} items")
    for col in ("mode", "accuracy", "tok/s", "speedup vs ar [95% CI]", "acceptance", "estimate"):
        table.add_column(col)
    for mode, row in doc["modes"].items():
        acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.3f} ± {row['accuracy_stderr']:.3f}"
        table.add_row(mode, acc, f"{row['tokens_per_s']:.1f}",
                      format_speedup(row["speedup_vs_ar"], row.get("speedup_vs_ar_ci95")),
                      fmt(row["acceptance_rate"]), fmt(row["speedup_estimate"]))
    for mode, rows in (doc.get("gamma_sweep") or {}).items():
        table.add_row(f"{mode} sweep", "", "",
                      "  ".join(f"γ{r['gamma']}:{format_speedup(r['speedup_vs_ar'], r.get('speedup_vs_ar_ci95'))}"
                                for r in rows),
                      "  ".join(f"γ{r['gamma']}:{fmt(r['acceptance_rate'])}" for r in rows), "")
    return table


def eval_markdown(docs: list[dict], common: dict, plots: list | None = None) -> str:
    """Markdown headline tables (per dataset: one row per mode, then the gamma sweep) with date, machine,
    command and how speed was measured (``common["measurement"]``, with its load warning), for
    ``benchmarks/RESULTS.md``. Speedups read ``"1.23 [1.10, 1.35]"``: the point estimate and its 95% interval."""
    from ..reporting import measurement_lines
    from .runner import format_speedup

    f = lambda x, d=2: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    m = common.get("machine", {})
    lines = ["# Accuracy and speed", "", f"- date: {common.get('date')}",
             f"- machine: {m.get('cpu')} x{m.get('cpus')}; GPUs: {', '.join(m.get('gpus') or []) or 'none'}",
             f"- command: `{common.get('command')}`",
             *measurement_lines(common.get("measurement")),
             "- tok/s = generated tokens / seconds, one request at a time; speedup = tok/s over ar's [95% paired "
             "bootstrap interval over items]; acceptance = "
             "accepted / verified drafted steps; estimate = the speed model's predicted speedup vs ar (equation (1) "
             "of lookahead_reasoning.core.metrics for the mode over the same for ar, with the run's counts)", ""]
    for doc in docs:
        lines += [f"## {doc['dataset']} ({doc['n']} items)", "",
                  "| mode | accuracy | tok/s | speedup vs ar | acceptance | estimate |", "|---|---|---|---|---|---|"]
        for mode, r in doc["modes"].items():
            acc = "n/a" if r["accuracy"] is None else f"{r['accuracy']:.3f} ± {r['accuracy_stderr']:.3f}"
            lines.append(f"| {mode} | {acc} | {f(r['tokens_per_s'], 1)} "
                         f"| {format_speedup(r['speedup_vs_ar'], r.get('speedup_vs_ar_ci95'))} "
                         f"| {f(r['acceptance_rate'])} | {f(r['speedup_estimate'])} |")
        for mode, rows in (doc.get("gamma_sweep") or {}).items():
            lines += ["", f"{mode}, gamma sweep:", "", "| gamma | speedup vs ar | acceptance | accuracy | estimate |",
                      "|---|---|---|---|---|"]
            lines += [f"| {r['gamma']} | {format_speedup(r['speedup_vs_ar'], r.get('speedup_vs_ar_ci95'))} "
                      f"| {f(r['acceptance_rate'])} | {f(r['accuracy'], 3)} "
                      f"| {f(r['speedup_estimate'])} |" for r in rows]
        lines.append("")
    lines += [f"![{Path(p).stem}]({p})" for p in plots or []]
    return "\n".join(lines) + "\n"


#: The speculative modes: a ``--gamma`` sweep runs them at each gamma, and they need the calibrated cost model.
_SPECULATIVE = ("lr", "lr+sd")


def _eval_runs(base, modes: list[str], gammas: list[int]) -> dict:
    """The named option sets every item runs under: one per mode and, with a ``--gamma`` sweep (several gammas),
    ``ar`` (the sweep's baseline) and ``"<mode> gamma=<g>"`` for each speculative mode at each other gamma, all
    interleaved item by item."""
    from .runner import sweep_options

    runs = {mode: base.model_copy(update={"mode": mode}) for mode in modes}
    if len(gammas) > 1:
        runs.setdefault("ar", base.model_copy(update={"mode": "ar"}))
        runs.update({f"{m} gamma={g}": sweep_options(base, m, g)
                     for m in modes if m in _SPECULATIVE for g in gammas if g != base.gamma})
    return runs


def _calibrate(reasoner, loaded: dict, base, gammas: list[int]):
    """Calibrate ``reasoner``'s cost model on the first item of the first non-empty dataset, for every lookahead
    depth the run uses; sets and returns it."""
    from ..core.calibration import calibrate_reasoner
    from .runner import uses_chat_template

    first = next(it for its, _ in loaded.values() for it in its)
    cost = calibrate_reasoner(reasoner, *first.request(uses_chat_template(reasoner)),
                              ns=tuple(range(2, max(gammas + [base.gamma]) + 2)))
    reasoner.cost_model = cost
    return cost


def _evaluate_datasets(reasoner, loaded: dict, runs: dict, modes: list[str], gammas: list[int], base_gamma: int,
                       no_progress: bool, keep_outputs: bool) -> list[dict]:
    """Each dataset's report document (:func:`.runner.report_json` of ``modes``, with a ``gamma_sweep`` when
    sweeping): its warm-up on the spare item, then ``runs`` interleaved item by item, under one progress bar."""
    from tqdm import tqdm

    from .runner import WARMUP_REQUESTS, gamma_row, report_json, run_interleaved

    docs = []
    total = sum(len(its) for its, _ in loaded.values()) * len(runs)
    with tqdm(total=total, desc="eval", unit="req", file=sys.stderr, disable=no_progress) as bar:
        for name, (its, spare) in loaded.items():
            reports = run_interleaved(reasoner, its, runs, progress=bar.update, keep_outputs=keep_outputs,
                                      warmup=WARMUP_REQUESTS, warmup_item=spare)
            extra = {}
            if len(gammas) > 1:
                extra["gamma_sweep"] = {
                    m: [gamma_row(g, reports[m] if g == base_gamma else reports[f"{m} gamma={g}"], reports["ar"])
                        for g in gammas]
                    for m in modes if m in _SPECULATIVE}
            docs.append(report_json(name, {m: reports[m] for m in modes}, extra))
    return docs


def _eval_measurement(load_start: float | None, loaded: dict) -> dict:
    """The JSON's ``measurement`` block (:func:`.runner.measurement_block`): warm-up requests and the warm-up item
    of each dataset, order, prefix cache, bootstrap, and the load at start and now."""
    from .runner import (
        BOOTSTRAP_RESAMPLES,
        BOOTSTRAP_SEED,
        INTERLEAVED_ORDER,
        PREFIX_CACHE_NOTE,
        WARMUP_REQUESTS,
        measurement_block,
    )

    return measurement_block(
        load_start, warmup_requests_per_mode=WARMUP_REQUESTS,
        warmup_items={d: (f"{spare.id} (not measured)" if spare else f"{its[0].id} (the first measured item, once "
                          "more untimed)") if its else None for d, (its, spare) in loaded.items()},
        order=INTERLEAVED_ORDER, prefix_cache=PREFIX_CACHE_NOTE,
        bootstrap_resamples=BOOTSTRAP_RESAMPLES, bootstrap_seed=BOOTSTRAP_SEED,
        interval="speedup_vs_ar_ci95: 2.5th-97.5th percentiles of the paired bootstrap over items")


def _write_reports(docs: list[dict], common: dict, plots_dir: str | None, out: str | None) -> None:
    """Print each dataset's table and a load warning to stderr; write the plots into ``plots_dir`` and, with
    ``out``, the JSON there and its markdown summary beside it (``.md``)."""
    from rich.console import Console

    from .runner import plot_eval, write_json

    console = Console(file=sys.stderr)
    for doc in docs:
        console.print(_table(doc))
    if common["measurement"].get("warning"):
        print(f"warning: {common['measurement']['warning']}", file=sys.stderr)
    plots = plot_eval(docs, plots_dir) if plots_dir else []
    for p in plots:
        console.print(f"plot: {p}")
    if out:
        write_json(out, {**docs[0], **common} if len(docs) == 1 else {"datasets": docs, **common})
        md = Path(out).with_suffix(".md")
        md.write_text(eval_markdown(docs, common, [os.path.relpath(p, md.parent) for p in plots]))
        console.print(f"summary: {md}")


def cmd_eval(args) -> int:
    """Validate everything, start the engines once, evaluate each dataset, write JSON and plots.

    Speed is measured as :mod:`.runner` describes: per dataset one untimed warm-up request per run on a
    spare item (item ``limit + 1``; the first item when there is none), then the modes (and, with a
    ``--gamma`` sweep, the speculative modes at each other gamma, and ``ar``) interleaved per item in a rotated
    order. The JSON gets a ``measurement`` block (see :func:`.runner.measurement_block`); a high load at
    the start is also printed to stderr and put in the markdown."""
    from ..core.lookahead import parse_modes
    from ..core.request import parse_request, request_values
    from ..profiles import build_reasoner_for, close_reasoner, load_profile
    from ..reporting import environment
    from .runner import load_average, load_with_spare

    load_start = load_average()  # before this process loads the CPU: the 1-minute average counts it too

    modes = parse_modes(args.modes)
    if args.limit is not None and args.limit <= 0:
        raise ValueError("--limit: must be > 0")
    gammas = parse_gammas(args.gamma)
    profile = load_profile(args.profile, args.config)
    cap = profile.options.max_gamma  # sweep_options would raise it: a sweep stays within the profile's cap
    if any(g > cap for g in gammas):
        raise ValueError(f"--gamma: {max(gammas)} exceeds this profile's cap of {cap} (options.max_gamma)")
    datasets = [d.strip() for d in args.dataset.split(",") if d.strip()]
    if not datasets:
        raise ValueError("--dataset: no dataset given")
    loaded = {d: load_with_spare(d, args.limit) for d in datasets}
    values = request_values(args, skip=EVAL_SKIP)
    values.update({"mode": modes[0], "gamma": None if len(gammas) > 1 or not gammas else gammas[0]})
    _, base = parse_request(values, profile.options, require_input=False)
    reasoner = build_reasoner_for(profile, base, modes)
    runs = _eval_runs(base, modes, gammas)
    try:
        cost = _calibrate(reasoner, loaded, base, gammas) if any(m in _SPECULATIVE for m in modes) else None
        docs = _evaluate_datasets(reasoner, loaded, runs, modes, gammas, base.gamma, args.no_progress,
                                  args.keep_outputs)
    finally:
        close_reasoner(reasoner)
    measurement = _eval_measurement(load_start, loaded)
    common = {"cost_model": cost.to_dict() if cost else None, "options": base.model_dump(mode="json"),
              "measurement": measurement, **environment()}
    _write_reports(docs, common, args.plots, args.out)
    return 0
