"""The sandbox's trust boundary, read from the source: which code may import which.

`sandbox/` is laid out by the process its code runs in (docs/architecture.md):

- `protocol/` what every process shares (candidates, evaluation records, the wire format, tensor
  conventions, source loading); imports nothing else of the sandbox.
- `confine/` the operating system's confinement (Landlock, seccomp, limits, the pids cgroup).
- `driver/` the cuforge process: supervisor, executors, jail plans. Starts the worker and the hosts
  by module name and never imports the judge's or the host's code.
- `judge/` the jailed worker: inputs, reference, comparison, timing, verdict. It reaches the
  candidate host only through its runners: `hosts.py` (the host process, over the wire) or, for the
  in-process judge, the modules in IN_WORKER_RUNNERS, which call host/monitor.py in the worker.
- `host/` the candidate host, beside candidate code: imports only the protocol and confine, so
  nothing a candidate can reach there decides a verdict.

Every import counts, at module level, inside functions and under TYPE_CHECKING alike. The rules are
checked on the real tree and, so that a broken rule cannot pass unnoticed, on trees with one
forbidden edge added.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
SANDBOX = "cuforge.sandbox."
LAYERS = ("protocol", "confine", "driver", "judge", "host")
# Which layers each layer may import (besides its own).
MAY_IMPORT = {
    "protocol": set(),
    "confine": {"protocol"},
    "driver": {"protocol", "confine"},
    "judge": {"protocol", "confine"},
    "host": {"protocol", "confine"},
}
# The in-process judge runs candidates in the worker through the host's monitor: these judge modules,
# and only these, may import host code.
IN_WORKER_RUNNERS = {"cuforge.sandbox.judge.in_worker", "cuforge.sandbox.judge.worker"}
# The judge's core and the modules that hold a candidate for it (its runners and the host pool).
JUDGE_CORE = "cuforge.sandbox.judge.core"
RUNNER_MODULES = {"cuforge.sandbox.judge.in_worker", "cuforge.sandbox.judge.in_host", "cuforge.sandbox.judge.hosts"}
# Outside the sandbox, code uses the sandbox through the driver and the shared records only.
OUTSIDE_MAY_IMPORT = {"protocol", "driver", "confine"}


def module_files(root: Path = SRC) -> dict[str, Path]:
    """Every module of the cuforge package (generated templates and problem data excluded)."""
    out = {}
    for p in (root / "cuforge").rglob("*.py"):
        rel = p.relative_to(root)
        if "builtin" in rel.parts or "torch_runtime" in rel.parts:
            continue
        name = ".".join(rel.with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(source: str, modules: dict[str, Path], self_name: str) -> set[str]:
    """The cuforge modules `source` imports, wherever in the file the import stands."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` names a module; `from mod import name` names the module
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                       for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            if t.startswith("cuforge"):
                resolved = _resolve(t, modules)
                if resolved and resolved != self_name and not self_name.startswith(resolved + "."):
                    out.add(resolved)
    return out


def import_graph(modules: dict[str, Path], extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the modules it imports; `extra` adds source lines to a module (the negative checks)."""
    graph = {}
    for name, path in modules.items():
        source = path.read_text() + ("\n" + extra[name] if extra and name in extra else "")
        graph[name] = imports_of(source, modules, name)
    return graph


def layer(module: str) -> str | None:
    if not module.startswith(SANDBOX):
        return None
    part = module[len(SANDBOX):].split(".")[0]
    return part if part in LAYERS else "?"


def broken_rules(graph: dict[str, set[str]]) -> list[str]:
    """One line per import that crosses a boundary it may not."""
    out = []
    for src, targets in sorted(graph.items()):
        src_layer = layer(src)
        for dst in sorted(targets):
            dst_layer = layer(dst)
            if dst_layer is None or dst_layer == src_layer:
                continue
            if src_layer is None:
                if dst_layer not in OUTSIDE_MAY_IMPORT:
                    out.append(f"{src} -> {dst}: outside the sandbox, use the driver or the protocol")
            elif src_layer == "?" or dst_layer == "?":
                out.append(f"{src} -> {dst}: every sandbox module belongs to one of {', '.join(LAYERS)}")
            elif dst_layer == "host" and src_layer == "judge" and src in IN_WORKER_RUNNERS:
                continue
            elif dst_layer not in MAY_IMPORT[src_layer]:
                out.append(f"{src} -> {dst}: {src_layer} may not import {dst_layer}")
    # One judge core, two interchangeable runners: the core reaches the candidate only through the
    # Runner it is handed, never a runner's module or the host pool.
    for dst in sorted(graph.get(JUDGE_CORE, set()) & RUNNER_MODULES):
        out.append(f"{JUDGE_CORE} -> {dst}: the judge core may not import a runner")
    for src, targets in sorted(graph.items()):  # back-edges: what the sandbox uses must not use the sandbox
        if layer(src) is not None:
            continue
        if any(layer(d) not in (None, "protocol") for d in targets) and any(
                src in graph[m] and layer(m) in ("judge", "host", "protocol", "confine") for m in graph):
            out.append(f"{src}: imported by the judge, the host or the protocol, and imports the sandbox back")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return module_files()


def test_the_sandbox_is_laid_out_by_process(modules):
    names = {m[len(SANDBOX):] for m in modules if m.startswith(SANDBOX)}
    loose = sorted(n for n in names if n.split(".")[0] not in LAYERS)
    assert not loose, f"sandbox modules outside the five process packages: {loose}"
    for needed in ("protocol.wire", "driver.supervisor", "judge.worker", "host.host", "host.monitor"):
        assert needed in names


def test_every_import_keeps_the_trust_boundary(modules):
    assert broken_rules(import_graph(modules)) == []


def test_no_module_imports_itself_back_through_others(modules):
    assert cycles(import_graph(modules)) == []


# Each edge a past layout had, or an easy slip would add; every one must be caught.
FORBIDDEN = [
    ("cuforge.sandbox.host.host", "from cuforge.sandbox.judge.in_worker import build_models", "host may not import judge"),
    ("cuforge.sandbox.host.monitor", "from cuforge.sandbox.judge import verify", "host may not import judge"),
    ("cuforge.sandbox.host.host", "from cuforge.sandbox.driver import supervisor", "host may not import driver"),
    ("cuforge.sandbox.judge.in_host", "from cuforge.sandbox.host.monitor import Guard", "judge may not import host"),
    ("cuforge.sandbox.judge.cheats", "from cuforge.sandbox.host import monitor", "judge may not import host"),
    ("cuforge.sandbox.driver.evaluate", "from cuforge.sandbox.judge.worker import main", "driver may not import judge"),
    ("cuforge.sandbox.protocol.evaluation", "from cuforge.sandbox.confine.isolation import Limits",
     "protocol may not import confine"),
    ("cuforge.cli.eval_cmd", "from cuforge.sandbox.judge.profile import build_profile", "outside the sandbox"),
    ("cuforge.runtime", "from cuforge.sandbox.judge.timing import Event", "imports the sandbox back"),
    ("cuforge.sandbox.judge.core", "from cuforge.sandbox.judge.in_host import HostRunner", "may not import a runner"),
    ("cuforge.sandbox.judge.core", "from cuforge.sandbox.judge import hosts", "may not import a runner"),
]


@pytest.mark.parametrize("module, line, why", FORBIDDEN, ids=[f"{m.rsplit('.', 1)[1]}:{w}" for m, _, w in FORBIDDEN])
def test_each_forbidden_edge_is_caught(modules, module, line, why):
    broken = broken_rules(import_graph(modules, {module: "def _probe():\n    " + line}))
    assert any(why in b for b in broken), broken


@pytest.mark.parametrize("module, line", [
    ("cuforge.sandbox.driver.executor", "from cuforge.sandbox.driver.executor_choice import make_executor"),
    ("cuforge.tma", "from cuforge.runtime import compile_to_cubin"),
    ("cuforge.sandbox.judge.output_judge", "from cuforge.sandbox.judge.in_worker import InWorkerRunner"),
])
def test_a_circle_is_caught_even_through_a_lazy_import(modules, module, line):
    graph = import_graph(modules, {module: "def _probe():\n    " + line})
    assert any(module in c for c in cycles(graph))
