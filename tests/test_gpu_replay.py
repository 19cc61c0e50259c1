"""A partition's forward replayed from a CUDA graph on a real GPU (the wrapper's _Replay): each call
computes its own forward exactly once, on its own inputs, into memory no later call overwrites; new
parameter storage is captured anew; a forward that waits for the device runs eagerly for good; and
judged through the sandbox, a network's partition with REPLAY is `ok`."""

import types

import pytest
import torch
from torch import nn

from cuforge.kernels.families import PARTITION
from cuforge.sandbox.protocol.candidate import TorchGraph, wrap_stages
from partition_cases import CASES
from template_helpers import CFG, problem_from_expr, skip_unless_sm90

pytestmark = pytest.mark.gpu


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)


CONV = TorchGraph("def part(inputs, params):\n    return (torch.conv2d(inputs[0], params[0], params[1], padding=1),)\n", "conv")
NORM = TorchGraph("def part(inputs, params):\n"
                  "    return (torch.relu(torch.batch_norm(inputs[0], params[2], params[3], params[4], params[5], True, 0.1, 1e-5, False)),)\n",
                  "train-mode batch norm, relu")
WAITS = TorchGraph("def part(inputs, params):\n    return (inputs[0] * float(inputs[0].abs().max()),)\n", "scaled by its max")


def module(stages, feeds):
    ns = {"__cuforge_problem__": types.SimpleNamespace(Model=Block)}
    exec(compile(wrap_stages(stages, feeds, replay=True), "<replayed>", "exec"), ns)
    torch.manual_seed(0)
    return ns["ModelNew"]().cuda()


def reference(model, x):
    ref = model.ref
    return torch.relu(torch.batch_norm(torch.conv2d(x, ref.conv.weight, ref.conv.bias, padding=1), ref.bn.weight, ref.bn.bias,
                                       None, None, True, 0.1, 1e-5, False))


def test_each_call_computes_its_own_forward_once_into_fresh_memory():
    model = module([CONV, NORM], [None, [("stage", 0, 0)]])
    replay = model.__dict__["_replay"]
    outs = []
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(2, 8, 12, 12, device="cuda")
            before = model.ref.bn.running_mean.clone()
            out = model(x)[0]  # a PyTorch part returns a tuple
            # training-mode batch norm moves its running mean once a call, eager or replayed
            assert not torch.equal(model.ref.bn.running_mean, before)
            torch.testing.assert_close(out, reference(model, x))
            outs.append((x, out))
            assert (replay.graph is not None) == (i >= 1), i  # the first call eager, captured at the second
        for x, out in outs:  # no replay wrote over an earlier call's output
            torch.testing.assert_close(out, reference(model, x))
        model.ref.conv.weight = nn.Parameter(torch.randn_like(model.ref.conv.weight))  # new storage
        x = torch.randn(2, 8, 12, 12, device="cuda")
        torch.testing.assert_close(model(x)[0], reference(model, x))
        assert replay.graph is not None and replay.key != replay.seen  # eager on the new weight first
        torch.testing.assert_close(model(x)[0], reference(model, x))
        assert replay.key == replay.seen  # then captured anew


def test_a_forward_that_waits_for_the_device_stays_eager():
    model = module([CONV, WAITS], [None, [("stage", 0, 0)]])
    replay = model.__dict__["_replay"]
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8, 12, 12, device="cuda")
            y = torch.conv2d(x, model.ref.conv.weight, model.ref.conv.bias, padding=1)
            torch.testing.assert_close(model(x)[0], y * float(y.abs().max()))
    assert replay.off and replay.graph is None


def test_inside_a_callers_capture_the_stages_are_recorded_as_they_are():
    # A judge times small calls by capturing them in a graph of its own: the forward must record
    # into that graph (neither capture nor replay its own meanwhile) and compute right when replayed.
    model = module([CONV, NORM], [None, [("stage", 0, 0)]])
    replay = model.__dict__["_replay"]
    x = torch.randn(2, 8, 12, 12, device="cuda")
    with torch.no_grad():
        model(x), model(x)  # eager, then captured by the forward itself
        assert replay.graph is not None
        mine = replay.graph
        outer = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            static = torch.randn_like(x)
            with torch.cuda.graph(outer, stream=stream):
                out = model(static)[0]
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(2):
            static.copy_(torch.randn_like(x))
            outer.replay()
            torch.testing.assert_close(out, reference(model, static))
    assert replay.graph is mine and not replay.off


@pytest.mark.parametrize("expr, inputs, init", CASES[:2])
def test_a_replayed_partition_is_judged_ok(sup, tmp_path, expr, inputs, init):
    skip_unless_sm90(sup, "most kernel parts are wgmma kernels: sm_90a")
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    config = {**PARTITION.seeds(p)[0], "REPLAY": 1}
    ev = sup.evaluate(p, PARTITION.render(config, p), CFG)
    assert ev.status == "ok", (expr[:60], ev.status, ev.message)
