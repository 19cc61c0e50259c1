"""Problems: built-in suites, metadata (FLOPs and bytes checked on small sizes), bad files."""

import json
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import DATA, run_cli
from cuforge.problems.hgemm import hgemm_problem, hgemm_shapes, parse_hgemm_id
from cuforge.problems.loader import load_files, validate_files
from cuforge.problems.problem import ProblemError
from cuforge.problems.suites import BUILTIN_DIR, load_problem, load_suite


def test_hgemm_grid_and_subsets():
    grid = hgemm_shapes("hgemm")
    assert len(grid) == 1000 and len(set(grid)) == 1000
    small = hgemm_shapes("hgemm-small")
    assert len(small) == 125 and all(max(s) <= 1024 for s in small)
    assert len(hgemm_shapes("hgemm-125")) == 125
    large = hgemm_shapes("hgemm-large")
    assert large and all(m * n * k >= 2**40 for m, n, k in large)
    assert len(large) == sum(1 for m, n, k in grid if m * n * k >= 2**40)


def test_hgemm_problem_metadata():
    p = hgemm_problem(1024, 512, 64)
    assert p.id == "hgemm/1024_512_64"
    assert p.meta.flops == 2 * 1024 * 512 * 64
    assert p.meta.bytes == 2 * (1024 * 64 + 64 * 512 + 1024 * 512)
    assert [t.shape for t in p.inputs] == [(1024, 64), (64, 512)]
    assert p.outputs[0].shape == (1024, 512) and p.outputs[0].dtype == "float16"
    assert "cublaslt" in p.meta.baselines and p.meta.policy == "custom"
    assert parse_hgemm_id("hgemm/7_8_9") == (7, 8, 9)
    assert parse_hgemm_id("hgemm/7_8") is None and parse_hgemm_id("hgemm/0_8_9") is None


def test_hgemm_source_agrees_with_its_metadata(tmp_path):
    # The generated source goes through the same subprocess inspector as user files.
    f = tmp_path / "h.py"
    f.write_text(hgemm_problem(128, 256, 64).source)
    (loaded,), skipped = load_files([f])
    assert not skipped
    ref = hgemm_problem(128, 256, 64)
    assert loaded.meta.flops == ref.meta.flops and loaded.meta.bytes == ref.meta.bytes
    assert loaded.inputs == ref.inputs and loaded.outputs == ref.outputs


def test_builtin_suites_load_with_full_metadata():
    l1, l2 = load_suite("level1"), load_suite("level2")
    assert not l1.skipped and not l2.skipped
    assert len(l1.problems) >= 20 and len(l2.problems) >= 10
    for p in l1.problems + l2.problems:
        assert p.meta.flops and p.meta.bytes and p.meta.dtype and p.meta.families, p.id
        assert not p.meta.unknown, (p.id, p.meta.unknown)
        assert p.outputs, p.id
        assert p.meta.small, f"{p.id} declares no scaled-down sizes"
    assert all("fused" in p.meta.families for p in l2.problems)


@pytest.mark.parametrize("suite", ["level1", "level2"])
def test_builtin_flops_and_bytes_on_small_sizes(suite):
    """Declared FLOPs and bytes, evaluated at the small sizes, match a real CPU run of the reference."""
    paths = sorted((BUILTIN_DIR / suite).glob("*.py"))
    for path, ok, msg, data in validate_files(paths):
        assert ok, f"{path.name}: {msg}"
        chk = data["small_check"]
        declared = chk["declared"]
        # Bytes: every input, parameter and output moved exactly once.
        assert declared["bytes"] == chk["actual_bytes"], path.name
        fams = set(declared["families"])
        counted = chk["counted_flops"]
        if fams & {"gemm", "conv"}:
            # Matmul/conv FLOPs as torch's counter sees them, plus a few per output for epilogues.
            extra = declared["flops"] - counted
            assert counted > 0 and 0 <= extra <= 20 * chk["output_numel"] + 20 * chk["input_numel"], path.name
        else:
            # Elementwise/reduction/norm conventions: a whole number of FLOPs per element.
            ratios = [declared["flops"] / n for n in (chk["input_numel"], chk["output_numel"])]
            assert any(r >= 1 and abs(r - round(r)) < 1e-9 for r in ratios), path.name


def test_kernelbench_file_loads_unchanged_with_derived_metadata():
    p = load_problem(str(DATA / "kb_style_matmul_relu.py"))
    assert p.inputs[0].shape == (16, 32) and p.outputs[0].shape == (16, 24)
    assert p.meta.flops == 2 * 16 * 32 * 24  # counted by torch's FLOP counter on the meta device
    assert p.meta.bytes == 4 * (16 * 32 + 24 * 32 + 24 + 16 * 24)
    assert set(p.meta.families) == {"gemm", "elementwise", "fused"}
    assert p.meta.dtype == "float32" and p.init_inputs == (32, 24)
    assert {"flops", "bytes", "dtype", "families"} <= set(p.meta.derived)


BAD_FILES = {
    "syntax.py": ("def broken(:\n", "syntax error at line 1"),
    "no_inputs.py": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x): return x\n"
                     "def get_init_inputs(): return []\n", "missing get_inputs"),
    "nontensor.py": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x): return x\n"
                     "def get_inputs(): return [torch.randn(4), 'three']\ndef get_init_inputs(): return []\n",
                     "a str at position 1: inputs must be tensors, numbers or booleans"),
    "missing_mod.py": ("import torch\nimport not_a_real_module_xyz\n", "imports missing module 'not_a_real_module_xyz'"),
    "raises.py": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x): raise ValueError('boom')\n"
                  "def get_inputs(): return [torch.randn(4)]\ndef get_init_inputs(): return []\n",
                  "forward raised ValueError: boom"),
    "hangs.py": ("import time\nwhile True:\n    time.sleep(1)\n", "hangs: no answer within 8 s"),
    "bad_meta.py": ("import torch\nCUFORGE = {'policy': 'whatever'}\nclass Model(torch.nn.Module):\n"
                    "    def forward(self, x): return x\ndef get_inputs(): return [torch.randn(4)]\n"
                    "def get_init_inputs(): return []\n", "policy 'whatever'"),
}


def test_bad_files_are_skipped_with_one_line_causes(tmp_path):
    for name, (src, _) in BAD_FILES.items():
        (tmp_path / name).write_text(src)
    (tmp_path / "good.py").write_text((DATA / "kb_style_matmul_relu.py").read_text())
    suite = load_suite(str(tmp_path), timeout_s=8)
    assert [p.name for p in suite.problems] == ["good"]
    reasons = {Path(s.path).name: s.reason for s in suite.skipped}
    assert set(reasons) == set(BAD_FILES)
    for name, (_, expected) in BAD_FILES.items():
        assert expected in reasons[name], (name, reasons[name])
        assert "\n" not in reasons[name]


def test_kernelbench_idioms_load(tmp_path):
    """Numbers among the inputs, .cuda() in get_inputs, an __init__ that needs real values."""
    (tmp_path / "scalar.py").write_text(
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, A, s): return A * s\n"
        "def get_inputs(): return [torch.randn(64, 32).cuda(), 3.5]\ndef get_init_inputs(): return []\n")
    (tmp_path / "item_init.py").write_text(
        "import torch\nclass Model(torch.nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
        "        self.k = int(torch.linspace(0, n, n).sum().item()) % 7 + 1\n"
        "        self.lin = torch.nn.Linear(n, self.k, device='cuda')\n"
        "    def forward(self, x): return self.lin(x)\n"
        "def get_inputs(): return [torch.randn(8, 16, device='cuda')]\ndef get_init_inputs(): return [16]\n")
    suite = load_suite(str(tmp_path), timeout_s=60)
    assert not suite.skipped, [s.reason for s in suite.skipped]
    by = {p.name: p for p in suite.problems}
    assert [t.describe() for t in by["scalar"].inputs] == ["float32[64, 32]", "float=3.5"]
    assert by["scalar"].meta.policy == "mixed"  # plain KernelBench format: KernelBench's rule
    k = int(torch.linspace(0, 16, 16).sum().item()) % 7 + 1
    assert by["item_init"].outputs[0].shape == (8, k)


def test_unknown_problem_refs_are_clear():
    with pytest.raises(ProblemError, match="no problem 'nope' in level1"):
        load_problem("level1/nope")
    with pytest.raises(ProblemError, match="bad hgemm id"):
        load_problem("hgemm/1_2")
    with pytest.raises(ProblemError, match="unknown suite"):
        load_suite("no-such-suite")


def test_cli_problems_commands(tmp_path):
    r = run_cli("problems", "list", "--suite", "hgemm-small", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert len(data["problems"]) == 125 and data["skipped"] == []
    r = run_cli("problems", "show", "level2/gemm_bias_gelu", "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["meta"]["families"] == ["gemm", "elementwise", "fused"] and "class Model" in shown["source"]
    r = run_cli("problems", "show", "level1/nope")
    assert r.returncode == 2 and "no problem 'nope'" in r.stderr
    (tmp_path / "good.py").write_text((DATA / "kb_style_matmul_relu.py").read_text())
    (tmp_path / "raises.py").write_text(BAD_FILES["raises.py"][0])
    r = run_cli("problems", "validate", str(tmp_path), "--json")
    assert r.returncode == 1
    verdicts = {Path(v["path"]).name: v for v in json.loads(r.stdout)}
    assert verdicts["good.py"]["ok"] and "reference ok (full size)" in verdicts["good.py"]["message"]
    assert not verdicts["raises.py"]["ok"] and "boom" in verdicts["raises.py"]["message"]
    r = run_cli("problems", "validate", str(tmp_path / "good.py"))
    assert r.returncode == 0 and "1 valid, 0 invalid" in r.stdout


def test_validate_skips_huge_full_size_reference_without_small(tmp_path):
    f = tmp_path / "big.py"
    f.write_text(textwrap.dedent("""
        import torch
        N = 1 << 28
        class Model(torch.nn.Module):
            def forward(self, x): return x * 2
        def get_inputs(): return [torch.randn(N)]
        def get_init_inputs(): return []
    """))
    ((path, ok, msg, _),) = validate_files([f])
    assert ok and "skipped: inputs are 1024 MiB" in msg


def test_a_reference_too_slow_for_the_cpu_still_validates(tmp_path):
    """KernelBench's bidirectional GRUs outlast the CPU limit at full size: valid, reference not run."""
    from cuforge.problems.loader import validate_files

    (tmp_path / "slow.py").write_text(
        "import time, torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        if x.device.type == 'cpu':\n            time.sleep(60)\n        return x * 2\n"
        "def get_inputs(): return [torch.randn(8)]\ndef get_init_inputs(): return []\n")
    (tmp_path / "hangs.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    # The limit leaves a loaded machine time to start an inspector (import torch) twice over.
    results = {p.name: (ok, msg) for p, ok, msg, _ in validate_files(sorted(tmp_path.glob("*.py")), timeout_s=15)}
    assert results["slow.py"][0] and "reference not run on the CPU: over 15 s" in results["slow.py"][1], results
    assert not results["hangs.py"][0] and "hangs" in results["hangs.py"][1]


def test_roofline_bytes_count_only_what_a_kernel_must_read(tmp_path):
    """The impossible-speedup floor is a lower bound: a table only gathered from, a tensor only sliced,
    a parameter never used are not bytes a kernel has to move (an honest embedding bag over a 51 MB
    table reads 20 rows per bag), while a tensor any op reads whole, and every output, are."""
    from template_helpers import problem_from_expr

    f32 = 4
    bag = problem_from_expr(tmp_path, "self.bag(a, b)", "torch.randint(0, 100000, (640,)), torch.arange(0, 640, 20)",
                            init="        self.bag = nn.EmbeddingBag(100000, 128, mode='sum')")
    assert bag.meta.bytes == 640 * 8 + 32 * 8 + 32 * 128 * f32
    sliced = problem_from_expr(tmp_path, "a[:, :8] * 2", "torch.randn(64, 1024)", args="a")
    assert sliced.meta.bytes == 64 * 8 * f32
    unused = problem_from_expr(tmp_path, "a + 1", "torch.randn(256)", args="a",
                               init="        self.w = nn.Parameter(torch.randn(4096))")
    assert unused.meta.bytes == 2 * 256 * f32
    # A tensor both sliced and read whole counts whole; the index tensor of a gather counts whole.
    both = problem_from_expr(tmp_path, "a[:, :8].sum() + a.sum()", "torch.randn(64, 1024)", args="a")
    assert both.meta.bytes == 64 * 1024 * f32 + f32
    picked = problem_from_expr(tmp_path, "torch.index_select(a, 0, b)", "torch.randn(4096, 64), torch.arange(16)")
    assert picked.meta.bytes == 16 * 8 + 16 * 64 * f32
