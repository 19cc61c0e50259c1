"""Running a traced op graph (Problem.graph) with PyTorch on the CPU: each node's aten op called on the
values its refs name. The tests use it to check that cutting a graph into stages - and feeding each
stage the tensors its part reads - computes what the forward computes, without a GPU."""

import importlib.util

import torch

from cuforge.op_graph import is_ref


def model_and_inputs(problem, seed=0):
    """The problem file's Model (built under `seed`) and one draw of its inputs, on the CPU."""
    spec = importlib.util.spec_from_file_location("graph_eval_problem", problem.path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
    torch.manual_seed(seed + 1)
    return model, list(module.get_inputs())


def _value(x, env):
    if isinstance(x, tuple):
        return tuple(_value(v, env) for v in x)
    if is_ref(x):
        transposed = x.endswith(".T")
        base = x[:-2] if transposed else x
        v = env[base]
        return v.transpose(-1, -2) if transposed else v
    if isinstance(x, str) and x.startswith("torch.") and hasattr(torch, x[6:]):
        return getattr(torch, x[6:])  # a dtype or layout, kept as its repr
    if isinstance(x, str) and x.startswith("device("):
        return torch.device("cpu")  # traced on the meta device
    return x


def run_graph(graph, outputs, inputs, params):
    """The graph's outputs for these inputs and parameters (refs in0..., param0...)."""
    env = {f"in{i}": t for i, t in enumerate(inputs)} | {f"param{i}": t for i, t in enumerate(params)}
    for node in graph:
        name, kwargs = node.op, {k: _value(v, env) for k, v in node.kwargs}
        if name == "gelu_tanh":
            name, kwargs = "gelu", {**kwargs, "approximate": "tanh"}
        name = name.removesuffix("_lastdim")
        args = _value(node.args, env)
        if name in ("minimum", "maximum"):  # a literal constant the graph took from a 0-dim tensor
            args = tuple(torch.tensor(a) if isinstance(a, (int, float)) else a for a in args)
        out = getattr(torch.ops.aten, name)(*args, **kwargs)
        if isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                env[f"{node.out}.{i}"] = o
            out = out[0]
        env[node.out] = out
    return [env[o] for o in outputs]


def params_of(model):
    return list(model.parameters()) + list(model.buffers())


def stages_of(family, problem):
    """(graph, outputs, feed) per kernel of a staged or pipeline candidate, fed as its module feeds them
    (("in", j): the forward's input j; ("stage", k): stage k's result); None for a one-kernel family."""
    if family.name == "pipeline":
        return [(s.problem.graph, s.problem.graph_outputs, list(s.feed)) for s in family.matched(problem)]
    if family.name.startswith("staged:"):
        cut = family.matched(problem)
        return [(cut.head.graph, cut.head.graph_outputs, [("in", j) for j in range(len(problem.inputs))]),
                (cut.tail.graph, cut.tail.graph_outputs, [("stage", 0)] + [("in", j) for j in cut.tail_inputs])]
    return None


def run_stages(stages, inputs, params):
    """The last stage's result, each stage's graph run with torch on what its feed names."""
    results = []
    for graph, outputs, feed in stages:
        results.append(run_graph(graph, outputs, [inputs[j] if kind == "in" else results[j] for kind, j in feed], params)[0])
    return results[-1]


def assert_stages_compute_forward(family, problem, tol=1e-5):
    """The candidate's stages, each part of the graph run with torch and chained as its module chains its
    kernels, equal the model's own forward on the same inputs (the model built twice from one seed, so
    that batch norms start from fresh running statistics both times; the generators reseeded before each)."""
    model, xs = model_and_inputs(problem)
    with torch.no_grad():
        torch.manual_seed(7)  # a training-mode dropout draws the same mask in both
        want = model(*xs)
        model, xs = model_and_inputs(problem)
        torch.manual_seed(7)
        got = run_stages(stages_of(family, problem), xs, params_of(model))
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
