"""Template kernels compiled ahead of their evaluation on a real GPU (protocol/prebuilt_cubins.py): while
another process holds the GPU's turn, the supervisor has its compile-only worker compile a candidate's
kernels, and the evaluation that follows loads those cubins and judges the candidate as it would have;
the search's executor does the same ahead of its queue."""

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.families import families_for
from cuforge.sandbox.driver.executor import LocalExecutor
from cuforge.sandbox.driver.gpu_turn import physical_gpu
from cuforge.sandbox.driver.supervisor import Supervisor
from cuforge.sandbox.protocol.prebuilt_cubins import kernel_sources
from template_helpers import CFG, conv_problem, problem_from_expr, skip_unless_sm90
from turn_helpers import hold

pytestmark = pytest.mark.gpu


def test_kernels_compiled_while_another_process_has_the_gpu_are_loaded_and_judged(sup, tmp_path):
    skip_unless_sm90(sup, "the convolution template is wgmma")
    relu = problem_from_expr(tmp_path, "torch.relu(a)", "torch.randn(4096, 1024)", args="a")
    conv = conv_problem(tmp_path, "nn.Conv2d(64, 128, 3)", "(2, 64, 34, 35)", "torch.relu(y) + self.bias")
    cases = [(families_for(relu)[0][0], relu), (ConvTf32x3Sm90(), conv)]
    for fam, problem in cases:
        cand = fam.render(fam.seeds(problem)[-1], problem)
        holder = hold(physical_gpu(sup.gpu), 5)  # another cuforge process evaluating meanwhile
        try:
            ev = sup.evaluate(problem, cand, CFG)
        finally:
            holder.kill()
            holder.wait()
        assert ev.status == "ok", (fam.name, ev.status, ev.message)
        assert ev.correctness.get("prebuilt_cubins") == len(kernel_sources(cand)) >= 1, (fam.name, ev.correctness)
    assert sup.kernel_builder is not None and sup.kernel_builder.spawns == 1  # one compile-only worker for both


def test_the_search_executor_compiles_ahead_of_its_queue(tmp_path):
    problem = problem_from_expr(tmp_path, "torch.tanh(a) * 2", "torch.randn(2048, 512)", args="a")
    fam = families_for(problem)[0][0]
    executor = LocalExecutor(["0"], supervisors=[Supervisor(gpu=0, judge="inprocess")])
    try:
        executor.supervisors[0].start()
        for config in fam.seeds(problem)[:2]:
            cand = fam.render(config, problem)
            packed = executor.build_ahead(problem, cand, CFG)
            assert packed, "nothing compiled ahead"
            ev = executor.evaluate(problem, cand, CFG, packed)
            assert ev.status == "ok", (ev.status, ev.message)
            assert ev.correctness.get("prebuilt_cubins") == len(kernel_sources(cand)) >= 1, ev.correctness
    finally:
        executor.close()
