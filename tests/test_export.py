"""Exports on the CPU: the plan read from a fixture store, the torch package built with nvcc,
installed with pip and exercised (registration, fake shapes, torch.compile, its own generated
tests), the CMake library configured and built with nvcc (static, shared, C++ test), NVRTC
fallback compiling, reproducibility, no secrets, and clear refusals."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import export_fixture
from conftest import run_cli

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="exports need nvcc")
SECRET = "sk-live-do-not-leak-4242"


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("export-store")
    export_fixture.build(d / "cuforge.db", d).close()
    return d / "cuforge.db"


@pytest.fixture(scope="module")
def torch_export(store_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("torch-export") / "pkg"
    r = run_cli("export", export_fixture.RUN_ID, "--format", "torch", "--to", str(out), "--name", "fixture_ops",
                "--results", str(store_path), "--json", env={"OPENAI_API_KEY": SECRET})
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_plan_keeps_winners_and_says_why_the_rest_fall_back(store_path):
    from cuforge.export.select import build_plan
    from cuforge.results.store import Store

    plan = build_plan(Store(store_path, create=False), export_fixture.RUN_ID)
    ops = {op.name: op for op in plan.ops}
    assert set(ops) == {"hgemm", "softmax_small"}
    hgemm = ops["hgemm"]
    assert [e.shapes for e in hgemm.entries] == [((64, 64), (64, 64)), ((128, 64), (64, 256))]
    assert hgemm.entries[0].speedups["cublas"] == 1.25  # the fastest exportable 64^3 kernel won
    assert len(hgemm.notes) == 1 and "1.600x" in hgemm.notes[0] and "TMA descriptors" in hgemm.notes[0]
    assert hgemm.entries[0].symbol != hgemm.entries[1].symbol and len(plan.kernels) == 3
    (lost,) = hgemm.skipped
    assert lost["problem_id"] == "hgemm/1024_1024_1024" and "fallback is faster" in lost["reason"]
    assert "Python module" in lost["reason"]
    (softmax,) = ops["softmax_small"].entries
    assert softmax.grid == (16, 1, 1) and [(a.kind, a.value) for a in softmax.args] == \
        [("input", 0), ("output", 0), ("scalar", 64), ("scalar", 1000)]
    assert softmax.outputs == (((64, 1000), "float32"),)
    # A stricter bar leaves the 1.08x shape to cuBLAS.
    strict = build_plan(Store(store_path, create=False), export_fixture.RUN_ID, min_speedup=1.1)
    assert [e.shapes for e in {o.name: o for o in strict.ops}["hgemm"].entries] == [((64, 64), (64, 64))]


def test_torch_package_installs_registers_and_passes_its_own_cpu_tests(torch_export, tmp_path):
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--target",
                          str(site), str(torch_export)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    installed = site / "fixture_ops"
    assert sorted(p.suffix for p in (installed / "kernels").iterdir()).count(".fatbin") == 3
    env = dict(os.environ, PYTHONPATH=str(site))
    probe = ("import torch, fixture_ops as f\n"
             "print(sorted(f.OPS))\n"
             "print(torch.ops.fixture_ops.hgemm.default._schema)\n"
             "x = torch.randn(64, 1000)\n"
             "torch.testing.assert_close(f.softmax_small(x), torch.softmax(x, -1))\n"
             "print(f.dispatch_info('softmax_small', x))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "['hgemm', 'softmax_small']" in r.stdout and "hgemm(Tensor A, Tensor B) -> Tensor" in r.stdout
    assert "reference (inputs not on one CUDA device)" in r.stdout
    # The package's generated tests: CPU ones pass here, GPU ones skip without a GPU.
    t = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(torch_export / "tests")],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert t.returncode == 0, t.stdout[-3000:] + t.stderr[-2000:]
    assert " passed" in t.stdout and "skipped" in t.stdout


def test_package_readme_records_provenance_and_no_secrets(torch_export):
    readme = (torch_export / "README.md").read_text()
    assert export_fixture.RUN_ID in readme and export_fixture.GPU in readme and "1.250x" in readme
    assert "hgemm/1024_1024_1024" in readme and "fallback is faster" in readme
    for p in torch_export.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_export_is_reproducible(store_path, torch_export, tmp_path):
    again = tmp_path / "again"
    r = run_cli("export", export_fixture.RUN_ID, "--format", "torch", "--to", str(again), "--name", "fixture_ops",
                "--results", str(store_path))
    assert r.returncode == 0, r.stderr[-2000:]
    # (pip leaves build/ and *.egg-info/ in the first export's tree; they are not export output)
    first = {k: v for k, v in tree_digest(torch_export).items()
             if not any(part in k for part in ("__pycache__", ".pytest", "build/", ".egg-info"))}
    assert tree_digest(again) == first


def test_cmake_library_builds_static_shared_and_its_cpp_test(store_path, tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    out = tmp_path / "lib"
    r = run_cli("export", export_fixture.RUN_ID, "--format", "cmake", "--to", str(out), "--arch", "sm_90a",
                "--results", str(store_path))
    assert r.returncode == 0, r.stderr[-3000:]
    header = (out / "include" / "cuforge.h").read_text()
    assert ("int cuforge_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K, cudaStream_t stream);"
            in header)
    assert "int cuforge_softmax_small(const float* in0, int64_t in0_d0, int64_t in0_d1, float* out0," in header
    build = tmp_path / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = subprocess.run(["cmake", "-S", str(out), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release"],
                         capture_output=True, text=True, timeout=600)
    assert cfg.returncode == 0, cfg.stdout[-2000:] + cfg.stderr[-2000:]
    b = subprocess.run(["cmake", "--build", str(build), "-j", "2"], capture_output=True, text=True, timeout=1200)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-2000:]
    assert (build / "libcuforge.so").exists() and (build / "libcuforge_static.a").exists()
    syms = subprocess.run(["nm", "-D", "--defined-only", str(build / "libcuforge.so")], capture_output=True, text=True).stdout
    assert "cuforge_hgemm" in syms and "cuforge_softmax_small" in syms and "cuforge_provenance" in syms
    # The C++ test links and runs; with no GPU it reports itself skipped (exit 77).
    t = subprocess.run([str(build / "test_cuforge")], capture_output=True, text=True, timeout=120)
    assert t.returncode == 77 and "skipped" in t.stdout


def test_nvrtc_fallback_compiles_an_exported_kernel_for_another_arch(torch_export):
    sys.path.insert(0, str(torch_export))
    try:
        from fixture_ops import _loader  # noqa: PLC0415 - the generated package, imported in place
    finally:
        sys.path.pop(0)
    src = next((torch_export / "fixture_ops" / "kernels").glob("softmax_rows_*.cu")).read_text()
    cubin = _loader.nvrtc_compile(src, "sm_86")
    assert cubin[:4] == b"\x7fELF"
    with pytest.raises(_loader.CudaError, match="NVRTC could not compile"):
        _loader.nvrtc_compile(src.replace("return v;", "return v", 1), "sm_86")


def test_clear_refusals(store_path, tmp_path):
    r = run_cli("export", export_fixture.RUN_ID, "--format", "wheel", "--to", str(tmp_path / "x"), "--results", str(store_path))
    assert r.returncode == 2 and "unknown format 'wheel'" in r.stderr
    r = run_cli("export", export_fixture.RUN_ID, "--arch", "hopper", "--to", str(tmp_path / "x"), "--results", str(store_path))
    assert r.returncode == 2 and "--arch takes archs like sm_90a,sm_80" in r.stderr
    r = run_cli("export", export_fixture.RUN_ID, "--name", "My-Ops", "--to", str(tmp_path / "x"), "--results", str(store_path))
    assert r.returncode == 2 and "must be a lowercase Python identifier" in r.stderr
    r = run_cli("export", "run-nope", "--to", str(tmp_path / "x"), "--results", str(store_path))
    assert r.returncode == 2 and "no run 'run-nope'" in r.stderr
    r = run_cli("export", export_fixture.RUN_ID, "--min-speedup", "5", "--to", str(tmp_path / "x"), "--results",
                str(store_path))
    assert r.returncode == 2 and "has no exportable kernel" in r.stderr and "fallback is faster" in r.stderr
