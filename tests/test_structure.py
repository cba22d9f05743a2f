"""Arrows one way: the engine layer (``orchestrator/backends``) never imports the serving layer, and no module
of the package imports itself back through others (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
BACKENDS = PACKAGE / "backends"


def module_name(path: Path) -> str:
    """``orchestrator/serving/client.py`` -> ``lookahead_reasoning.serving.client`` (``__init__`` -> the package)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["lookahead_reasoning", *parts])


def _imports(path: Path) -> set[str]:
    """Module names ``path`` imports anywhere in it, relative imports resolved against its package; for
    ``from X import name`` both ``X`` and ``X.name`` (a submodule, when it is one)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    """Package module -> the package modules it imports."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {x for x in _imports(p) if x in files and x != m} for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_backends_do_not_import_serving():
    offenders = {p.name: sorted(m for m in _imports(p) if m.startswith("lookahead_reasoning.serving"))
                 for p in BACKENDS.glob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}
    # the check resolves relative imports: a known relative import is seen
    assert "lookahead_reasoning.backends.role_tensors" in _imports(BACKENDS / "triton_bls.py")


def test_no_import_cycles():
    graph = import_graph()
    assert "lookahead_reasoning.core.lookahead" in graph["lookahead_reasoning.core.request"]  # the walk sees imports
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_scheduler_contract_is_abstract_and_both_engines_keep_it():
    """BatchScheduler's subclass contract is its abstract methods: a backend missing one cannot be built."""
    import pytest
    from lookahead_reasoning.backends.llamacpp import LlamaCppEngine
    from lookahead_reasoning.backends.portable import PortableEngine
    from lookahead_reasoning.backends.scheduler import BatchScheduler

    assert BatchScheduler.__abstractmethods__ == {"validate", "_setup", "_admit", "_step", "_release", "_reset_batch",
                                                  "reset_prefix_cache"}
    assert not PortableEngine.__abstractmethods__ and not LlamaCppEngine.__abstractmethods__

    class Partial(BatchScheduler):
        def validate(self, req) -> None:
            pass

    with pytest.raises(TypeError, match="_admit"):
        Partial()
