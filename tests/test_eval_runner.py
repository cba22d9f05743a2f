"""The eval runner on real tiny models (conftest): two-turn MT-Bench, HumanEval grading in the sandbox,
skipped over-long prompts, the gamma sweep, plots, and the ``eval`` handler with ``--gamma`` as a sweep."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.core.lookahead import LookaheadReasoner, LROptions
from lookahead_reasoning.core.verifiers import VerifierConfig
from lookahead_reasoning.evaluation.answers import EvalItem, load_items
from lookahead_reasoning.evaluation.runner import (
    ModeReport,
    bootstrap_speedup_ci,
    format_speedup,
    load_warning,
    measurement_block,
    plot_eval,
    report_json,
    run_eval,
    run_gamma_sweep,
    run_mode,
    uses_chat_template,
)

OPTS = LROptions(judge=VerifierConfig(name="exact"), max_tokens=6, gamma=2)


class RecordingReasoner(LookaheadReasoner):
    """A real reasoner that also records the inputs of each request, and its mode and generated tokens in
    ``log``."""

    calls: list
    log: list

    def run(self, prompt=None, messages=None, options=None):
        self.calls.append((prompt, None if messages is None else [dict(m) for m in messages]))
        res = super().run(prompt, messages, options)
        self.log.append((options.mode, res.metrics.generated_tokens))
        return res


@pytest.fixture(scope="module")
def reasoner(tiny_model_dir, tiny_draft_dir):
    draft = PortableEngine.from_pretrained(str(tiny_draft_dir), num_threads=1)
    target = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1)
    r = RecordingReasoner(target, draft, None, defaults=OPTS)
    r.calls, r.log = [], []
    yield r
    target.close()
    draft.close()


def test_mt_bench_two_turns_humaneval_graded_and_long_prompts_skipped(reasoner):
    assert uses_chat_template(reasoner)
    mt = load_items("mt_bench", 1)
    he = load_items("humaneval", 1)
    long_item = EvalItem("long", "synthetic", "Step 1: 2 + 2 = 4. " * 400, None, "4")
    reasoner.calls.clear()
    reports = run_eval(reasoner, mt + he + [long_item], ["ar"], OPTS, keep_outputs=True, warmup=0)
    rep = reports["ar"]
    assert rep.n == 2 and rep.skipped == 1 and rep.turns == 3  # MT-Bench: 2 turns; HumanEval: 1
    (_, turn1), (_, turn2) = reasoner.calls[:2]
    assert turn1 == [{"role": "user", "content": mt[0].turns[0]}]
    answer = rep.outputs[0]["text"][0]
    assert turn2 == turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": mt[0].turns[1]}]
    assert reasoner.calls[2][1][0]["content"].startswith("Complete the following Python function")  # chat form
    assert rep.graded == 1 and rep.outputs[1]["correct"] is False  # a random tiny model fails HumanEval/0
    doc = report_json("mixed", reports)
    assert doc["modes"]["ar"]["skipped_too_long"] == 1 and doc["modes"]["ar"]["turns"] == 3
    # steps per answer: the last turn of each measured item, split at the step delimiter
    last = [rep.outputs[0]["text"][-1], rep.outputs[1]["text"]]
    want = sum(len([s for s in t.split("\n\n")[:-1]]) + (1 if t and not t.endswith("\n\n") else 0) for t in last) / 2
    assert doc["modes"]["ar"]["steps_per_answer"] == pytest.approx(want)


def test_gamma_sweep_and_plots(reasoner, tmp_path):
    items = load_items("synthetic", 2)
    reports = run_eval(reasoner, items, ["ar", "lr"], OPTS)
    rows = run_gamma_sweep(reasoner, items, "lr", [1, 2], OPTS, baseline=reports["ar"], done={2: reports["lr"]})
    assert [r["gamma"] for r in rows] == [1, 2]
    assert rows[1]["tokens_per_s"] == reports["lr"].tokens_per_s  # reused, not rerun
    assert all(r["speedup_vs_ar"] > 0 and len(r["acceptance_by_depth"]) <= r["gamma"] for r in rows)
    doc = report_json("synthetic", reports, {"gamma_sweep": {"lr": rows}})
    pngs = plot_eval([doc], tmp_path)
    assert [p.name for p in pngs] == ["acceptance_by_depth.png", "speedup_vs_gamma.png"]


def test_eval_handler_with_gamma_sweep(tiny_model_dir, tiny_draft_dir, tmp_path):
    from lookahead_reasoning.cli import build_parser
    from lookahead_reasoning.evaluation.eval_cli import cmd_eval, parse_gammas

    assert parse_gammas("1,2,2,4") == [1, 2, 4]
    with pytest.raises(ValueError, match="--gamma"):
        parse_gammas("1,x")
    with pytest.raises(ValueError, match="--gamma: values must be integers >= 1"):
        parse_gammas("0,2")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "tiny", "target": {"path": str(tiny_model_dir)}, "draft": {"path": str(tiny_draft_dir)},
        "options": {"judge": {"name": "exact"}, "max_tokens": 4, "gamma": 2, "max_gamma": 4}}))
    # the eval parser as cli.py builds it: the request's flags without --gamma, which eval takes as a list
    p = build_parser()
    out = tmp_path / "eval.json"
    args = p.parse_args(["eval", "--config", str(cfg), "--dataset", "synthetic,gsm8k", "--limit", "1", "--modes",
                         "ar,lr", "--gamma", "1,2", "--out", str(out), "--plots", str(tmp_path / "plots")])
    assert cmd_eval(args) == 0
    doc = json.loads(out.read_text())
    assert [d["dataset"] for d in doc["datasets"]] == ["synthetic", "gsm8k"]
    assert [r["gamma"] for r in doc["datasets"][1]["gamma_sweep"]["lr"]] == [1, 2]
    assert {"date", "machine", "command", "cost_model"} <= set(doc)
    modes = doc["datasets"][0]["modes"]  # estimates are predicted speedups vs ar: ar's own is exactly 1
    assert modes["ar"]["speedup_estimate"] == pytest.approx(1.0) and modes["lr"]["speedup_estimate"] > 0
    assert (tmp_path / "plots" / "speedup_vs_gamma.png").exists()
    md = (tmp_path / "eval.md").read_text()
    assert "## gsm8k (1 items)" in md and "| lr |" in md and "gamma sweep" in md and "plots/speedup_vs_gamma.png" in md
    too_big = p.parse_args(["eval", "--config", str(cfg), "--gamma", "2,8"])
    with pytest.raises(ValueError, match="cap of 4"):
        cmd_eval(too_big)


def _asked(call) -> str:
    """The question of a recorded or built request: the plain prompt, else the last message's content."""
    prompt, messages = call
    return prompt if prompt is not None else messages[-1]["content"]


def test_run_eval_warms_up_then_interleaves_modes_per_item_in_rotated_order(reasoner):
    *items, spare = load_items("synthetic", 4)
    chat = uses_chat_template(reasoner)
    modes = ["ar", "lr", "lr+sd"]
    reasoner.calls.clear()
    reasoner.log.clear()
    reports = run_eval(reasoner, items, modes, OPTS, warmup_item=spare)
    order = [(mode, _asked(call)) for (mode, _), call in zip(reasoner.log, reasoner.calls, strict=False)]
    warm = [(m, _asked(spare.request(chat))) for m in modes]
    timed = [(m, _asked(it.request(chat))) for i, it in enumerate(items) for m in modes[i % 3:] + modes[:i % 3]]
    assert order == warm + timed  # item 0: ar, lr, lr+sd; item 1: lr, lr+sd, ar; item 2: lr+sd, ar, lr
    assert list(reports) == modes
    # the warm-up requests are in no report: items, per-item rows and tokens come from the timed calls only
    assert sum(t for _, t in reasoner.log[:3]) > 0
    for mode, rep in reports.items():
        timed_tokens = [t for m, t in reasoner.log[3:] if m == mode]
        assert rep.n == len(items) == len(rep.per_item) and [i for i, _, _ in rep.per_item] == [0, 1, 2]
        assert rep.tokens == sum(timed_tokens) == sum(t for _, t, _ in rep.per_item)
        assert rep.seconds == pytest.approx(sum(s for _, _, s in rep.per_item))
        assert rep.turns == len(items)


def test_warmup_on_the_first_item_is_not_counted_and_run_mode_has_none_by_default(reasoner):
    items = load_items("synthetic", 2)
    reasoner.log.clear()
    rep = run_eval(reasoner, items, ["ar"], OPTS)["ar"]  # no spare: the first item once more, untimed
    assert len(reasoner.log) == 3 and rep.n == 2 and rep.turns == 2
    assert rep.tokens == sum(t for _, t in reasoner.log[1:])
    reasoner.log.clear()
    assert run_mode(reasoner, items, OPTS.model_copy(update={"mode": "ar"})).n == 2 and len(reasoner.log) == 2


def _synthetic_runs(n: int, seed: int = 1):
    """Per-item (tokens, seconds) of a mode 1.5x faster than ar, with 20% per-item timing noise."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(50, 400, size=n).astype(float)
    ar_sec = tokens / 50 * rng.lognormal(0, 0.2, size=n)
    sec = tokens / 75 * rng.lognormal(0, 0.2, size=n)
    return tokens, sec, tokens, ar_sec


def test_bootstrap_interval_contains_the_estimate_and_narrows_with_more_items():
    widths = {}
    for n in (8, 200):
        tok, sec, ar_tok, ar_sec = _synthetic_runs(n)
        point = (tok.sum() / sec.sum()) / (ar_tok.sum() / ar_sec.sum())
        lo, hi = bootstrap_speedup_ci(tok, sec, ar_tok, ar_sec)
        assert lo < point < hi
        assert bootstrap_speedup_ci(tok, sec, ar_tok, ar_sec) == [lo, hi]  # fixed seed: reproducible
        widths[n] = hi - lo
    assert widths[200] < 0.5 * widths[8]
    lo, hi = bootstrap_speedup_ci(*_synthetic_runs(200))
    assert lo < 1.5 < hi  # the true speedup
    tok, _, _, ar_sec = _synthetic_runs(5)
    assert bootstrap_speedup_ci(tok, ar_sec, tok, ar_sec) == pytest.approx([1.0, 1.0])  # a run against itself
    assert bootstrap_speedup_ci([], [], [], []) is None
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_speedup_ci([1, 2], [1, 2], [1], [1])
    with pytest.raises(ValueError, match="level"):
        bootstrap_speedup_ci([1], [1], [1], [1], level=1.0)


def test_speedup_interval_pairs_items_by_index_and_formats():
    ar = ModeReport("ar", per_item=[(0, 100, 2.0), (1, 100, 2.0), (2, 100, 2.0)])
    lr = ModeReport("lr", per_item=[(0, 100, 1.0), (2, 100, 1.0)])  # item 1 skipped in this run
    assert lr.speedup_ci(ar) == pytest.approx([2.0, 2.0])
    assert lr.speedup_ci(None) is None
    assert format_speedup(1.234, [1.1, 1.349]) == "1.23 [1.10, 1.35]" and format_speedup(None) == "n/a"
    assert load_warning(0.9, cpus=2) is None and "1.10" in load_warning(1.1, cpus=2)
    m = measurement_block(None, order="x")
    assert m["order"] == "x" and "warning" not in m and m["cpu_count"] >= 1



def test_solved_changes_pair_graded_items_by_index():
    ar = ModeReport("ar", per_item=[(0, 9, 1.0), (1, 9, 1.0), (2, 9, 1.0), (3, 9, 1.0)],
                    item_correct={0: True, 1: True, 2: False, 3: True})
    lr = ModeReport("lr", per_item=[(0, 9, 1.0), (1, 9, 1.0), (2, 9, 1.0), (4, 9, 1.0)],
                    item_correct={0: True, 1: False, 2: True, 4: False})  # item 3 not run, item 4 not in ar
    assert lr.solved_changes(ar) == {"lost": 1, "gained": 1} and lr.solved_changes(None) is None
    assert lr.per_item_json()["correct"] == [True, False, True, False]
    assert ModeReport("x", per_item=[(7, 1, 1.0)]).per_item_json()["correct"] == [None]  # not graded

def test_eval_command_reports_measurement_intervals_and_load_warning(tiny_model_dir, tiny_draft_dir, tmp_path,
                                                                    monkeypatch, capsys):
    import os

    from lookahead_reasoning.cli import main

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "tiny", "target": {"path": str(tiny_model_dir)}, "draft": {"path": str(tiny_draft_dir)},
        "options": {"judge": {"name": "exact"}, "max_tokens": 4, "gamma": 2, "max_gamma": 4}}))
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 1.0, 1.0))  # a busy machine
    out = tmp_path / "eval.json"
    assert main(["eval", "--config", str(cfg), "--dataset", "synthetic", "--limit", "2", "--modes", "lr,ar",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    m = doc["measurement"]
    assert m["warmup_requests_per_mode"] == 1 and m["order"] == "interleaved per item, rotated"
    assert m["bootstrap_resamples"] == 2000 and m["cpu_count"] == os.cpu_count()
    assert m["load_avg_1min_start"] == 64.0 and m["load_avg_1min_end"] == 64.0
    assert m["warmup_items"] == {"synthetic": "synthetic-2 (not measured)"}
    assert "64.00" in m["warning"]
    assert doc["cost_model"]["load_avg_1min_start"] == 64.0
    assert doc["n"] == 2 and list(doc["modes"]) == ["lr", "ar"]
    for row in doc["modes"].values():
        lo, hi = row["speedup_vs_ar_ci95"]
        assert lo <= row["speedup_vs_ar"] <= hi
        assert len(row["per_item"]["seconds"]) == 2
        assert sum(row["per_item"]["generated_tokens"]) == row["generated_tokens"]
    assert doc["modes"]["ar"]["speedup_vs_ar_ci95"] == pytest.approx([1.0, 1.0])
    assert "warning: the 1-minute load average was 64.00" in capsys.readouterr().err
    md = (tmp_path / "eval.md").read_text()
    ci = doc["modes"]["lr"]["speedup_vs_ar_ci95"]
    assert f"| {doc['modes']['lr']['speedup_vs_ar']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] |" in md
    assert "**warning: the 1-minute load average was 64.00" in md and "interleaved per item, rotated" in md
