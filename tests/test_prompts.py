from cuforge.agent.population import Member
from cuforge.agent.prompts import render
from cuforge.problems.hgemm import hgemm_problem

DEVICE = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 50 * 2**20}


def test_prompt_orders_stable_parts_first_and_carries_feedback():
    p = hgemm_problem(1024, 1024, 1024)
    parent = Member(7, "k", "wrong_output", -2.0, None, 0, 1, ("plain",), source="class ModelNew: ...",
                    feedback="trial 0, output 0: 52 of 1048576 elements outside atol=0.01; sample (0, 5): got 3.1 expected 2.9")
    better = Member(3, "k3", "ok", 0.4, 1.5, 0, 1, ("shared_memory", "regs<=64"))
    worse = Member(4, "k4", "ok", 0.1, 1.1, 0, 1, ("plain", "regs:?"))
    prompt = render(p, "FIX", parent, [(better, worse)], DEVICE)
    assert "custom" not in prompt.system and "No library compute" in prompt.system and "sm_90a" in prompt.system
    u = prompt.user
    assert u.index("Reference operator") < u.index("Hardware") < u.index("What has worked") < u.index("Parent program")
    assert "torch.matmul(A, B)" in u and "132 SMs" in u and "1.500x" in u and "got 3.1 expected 2.9" in u
    assert "Fix it so it is correct" in u


def test_seed_prompt_without_device_and_prompt_dir_override(tmp_path):
    p = hgemm_problem(64, 64, 64)
    prompt = render(p, "SEED")
    assert "compile-only run" in prompt.user and "Write a first correct" in prompt.user
    (tmp_path / "system.j2").write_text("custom system for {{ policy }}")
    assert render(p, "SEED", prompt_dir=tmp_path).system == "custom system for custom"
