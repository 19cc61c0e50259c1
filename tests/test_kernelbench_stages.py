"""The multi-kernel candidates of KernelBench's level2 files checked on the CPU: for every file a staged pair
or a pipeline covers, its copy with batch_size 2 is matched again, each stage's part of the traced graph
is run with torch (fed as the candidate module feeds its kernels), and the last stage's result must equal
the model's own forward. This checks where the graph is cut and what each stage reads - not the kernels,
which the GPU tests and the search judge. Skips where ../shared/kernelbench is absent."""

import re
from pathlib import Path

import pytest

from cuforge.kernels.families import families_for
from cuforge.problems.loader import load_files
from graph_eval import assert_stages_compute_forward, stages_of

ROOT = Path(__file__).resolve().parents[1]
KB = next((p for p in (ROOT.parent / "shared" / "kernelbench", ROOT / ".kb") if p.is_dir()),
          ROOT.parent / "shared" / "kernelbench")
pytestmark = pytest.mark.skipif(not KB.is_dir(), reason="../shared/kernelbench is absent")

FILES = sorted((KB / "level2").glob("*.py")) if KB.is_dir() else []


# A module-level size above this is cut to it: a GEMM of 32768 x 32768 features (level2/55) builds 4 GB of
# weights twice and multiplies 137 GFLOP twice on the CPU, and a smaller one is cut the same way.
MAX_SIZE = 4096


def shrunk(tmp_path, path, batch):
    """The file's problem with batch_size `batch` and no module-level size over MAX_SIZE (None where it
    has no batch_size)."""
    text, n = re.subn(r"^batch_size\s*=\s*\d+", f"batch_size = {batch}", path.read_text(), count=1, flags=re.M)
    if not n:
        return None
    text = re.sub(r"^(\w+)(\s*=\s*)(\d+)\s*$", lambda m: f"{m[1]}{m[2]}{min(int(m[3]), MAX_SIZE)}", text, flags=re.M)
    small = tmp_path / f"b{batch}_{path.name}"
    small.write_text(text)
    problems, skipped = load_files([small])
    assert not skipped, skipped
    return problems[0]


@pytest.mark.parametrize("path", FILES, ids=[p.name.split("_")[0] for p in FILES])
def test_the_stages_of_a_kernelbench_file_compute_its_forward(tmp_path, path):
    # Batch 2 keeps the convolutions cheap; a GEMM of 2 rows is another family's, so those go at 128.
    for batch in (2, 128):
        problem = shrunk(tmp_path, path, batch)
        fams = families_for(problem)[0] if problem is not None else []
        stages = stages_of(fams[0], problem) if fams else None
        if stages is not None:
            break
    else:
        pytest.skip("one kernel or not covered")
    assert_stages_compute_forward(fams[0], problem, tol=1e-4)
