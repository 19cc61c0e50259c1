"""Built-in problems on the GPU: every reference runs on CUDA at its small size and agrees with
the CPU run; doctor sees the GPU."""

import json

import pytest
import torch

from conftest import run_cli
from cuforge.problems.suites import BUILTIN_DIR
from cuforge.sandbox.protocol.loading import module_from_source

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("path", sorted(BUILTIN_DIR.glob("level*/*.py")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_builtin_reference_runs_on_cuda_like_on_cpu(path):
    mod = module_from_source(path.read_text(), f"gpu_check_{path.parent.name}_{path.stem}")
    for k, v in mod.CUFORGE["small"].items():
        setattr(mod, k, v)
    torch.manual_seed(0)
    inputs = mod.get_inputs()
    torch.manual_seed(1)
    model = mod.Model(*mod.get_init_inputs())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        cpu = model(*inputs)
        gpu = model.cuda()(*[x.cuda() for x in inputs]).cpu()
    if cpu.is_floating_point():
        tol = 2e-2 if cpu.dtype in (torch.float16, torch.bfloat16) else 1e-4
        torch.testing.assert_close(gpu.float(), cpu.float(), rtol=tol, atol=tol)
    else:
        assert torch.equal(gpu, cpu)


def test_doctor_sees_the_gpu():
    r = run_cli("doctor", "--json")
    report = json.loads(r.stdout)
    assert report["gpus"] and report["gpus"][0]["sm_count"] > 0
    assert {c["name"]: c["ok"] for c in report["checks"]}["cuda"]
