"""The eval runner on real tiny models (conftest): two-turn MT-Bench, HumanEval grading in the sandbox,
skipped over-long prompts, the gamma sweep, plots, and the ``eval`` handler with ``--gamma`` as a sweep."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from lookahead_reasoning.answers import EvalItem, load_items
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.evaluation import plot_eval, report_json, run_eval, run_gamma_sweep, uses_chat_template
from lookahead_reasoning.lookahead import LookaheadReasoner, LROptions
from lookahead_reasoning.verifiers import VerifierConfig

OPTS = LROptions(judge=VerifierConfig(name="exact"), max_tokens=6, gamma=2)


class RecordingReasoner(LookaheadReasoner):
    """A real reasoner that also records the inputs of each request."""

    calls: list

    def run(self, prompt=None, messages=None, options=None):
        self.calls.append((prompt, None if messages is None else [dict(m) for m in messages]))
        return super().run(prompt, messages, options)


@pytest.fixture(scope="module")
def reasoner(tiny_model_dir, tiny_draft_dir):
    draft = PortableEngine.from_pretrained(str(tiny_draft_dir), num_threads=1)
    target = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1)
    r = RecordingReasoner(target, draft, None, defaults=OPTS)
    r.calls = []
    yield r
    target.close()
    draft.close()


def test_mt_bench_two_turns_humaneval_graded_and_long_prompts_skipped(reasoner):
    assert uses_chat_template(reasoner)
    mt = load_items("mt_bench", 1)
    he = load_items("humaneval", 1)
    long_item = EvalItem("long", "synthetic", "Step 1: 2 + 2 = 4. " * 400, None, "4")
    reasoner.calls.clear()
    reports = run_eval(reasoner, mt + he + [long_item], ["ar"], OPTS, keep_outputs=True)
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
    from lookahead_reasoning.cli import _common
    from lookahead_reasoning.eval_cli import add_eval_arguments, cmd_eval, parse_gammas

    assert parse_gammas("1,2,2,4") == [1, 2, 4]
    with pytest.raises(ValueError, match="--gamma"):
        parse_gammas("1,x")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "tiny", "target": {"path": str(tiny_model_dir)}, "draft": {"path": str(tiny_draft_dir)},
        "options": {"judge": {"name": "exact"}, "max_tokens": 4, "gamma": 2}, "max_gamma_cap": 4}))
    # the eval parser as cli.py builds it, with this module's flags replacing --gamma / --dataset
    p = argparse.ArgumentParser(conflict_handler="resolve")
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--modes", default="ar,sd,lr,lr+sd")
    p.add_argument("--out", default=None)
    p.add_argument("--keep-outputs", action="store_true")
    _common(p)
    add_eval_arguments(p)
    out = tmp_path / "eval.json"
    args = p.parse_args(["--config", str(cfg), "--dataset", "synthetic,gsm8k", "--limit", "1", "--modes", "ar,lr",
                         "--gamma", "1,2", "--out", str(out), "--plots", str(tmp_path / "plots")])
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
    too_big = p.parse_args(["--config", str(cfg), "--gamma", "2,8"])
    with pytest.raises(ValueError, match="cap of 4"):
        cmd_eval(too_big)
