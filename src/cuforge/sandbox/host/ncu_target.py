"""Runs under ncu: builds the candidate like the worker does, warms up, then runs one forward
inside the NVTX range that ncu is told to profile (named in the request)."""

from __future__ import annotations

import json
import sys

import torch

from cuforge.sandbox.protocol.loading import candidate_class, cast_module, problem_module
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.precision import set_strict_precision
from cuforge.sandbox.protocol.tensors import make_inputs


def main(path: str) -> None:
    req = json.loads(open(path).read())
    set_strict_precision()
    cand = Candidate.from_dict(req["candidate"])
    cast = req["problem"]["meta"].get("cast")
    module = problem_module(req["problem"]["source"], None, cast)
    cls = candidate_class(cand.module_source(), module, cand.id)
    torch.manual_seed(0)
    model = cls(*module.get_init_inputs()).cuda()
    if cast:
        model = cast_module(model, getattr(torch, cast))
    device = torch.device("cuda")
    inputs = make_inputs(module, 1, device, gaussian=False)
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(req["range"])
        model(*inputs)
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
