"""Suites: built-in generated families (hgemm), built-in directories (level1, level2), user dirs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cuforge.problems.hgemm import HGEMM_SUITES, hgemm_problem, hgemm_shapes, parse_hgemm_id
from cuforge.problems.loader import DEFAULT_TIMEOUT_S, load_files, problem_files_in
from cuforge.problems.problem import Problem, ProblemError, SkippedProblem

BUILTIN_DIR = Path(__file__).parent / "builtin"
DIR_SUITES = ("level1", "level2", "models")


@dataclass
class Suite:
    name: str
    problems: list[Problem]
    skipped: list[SkippedProblem] = field(default_factory=list)


def builtin_suite_names() -> list[str]:
    return [*HGEMM_SUITES, *DIR_SUITES]


def suite_description(name: str) -> str:
    return {
        "hgemm": "fp16 GEMM over the 1000-shape grid M, N, K in {64 .. 16384}",
        "hgemm-small": "hgemm shapes with every dim <= 1024 (125 shapes)",
        "hgemm-125": "hgemm shapes with each dim in {64, 256, 1024, 4096, 16384}",
        "hgemm-large": "hgemm shapes with M*N*K >= 2^40",
        "level1": "single-op problems: matmuls, activations, softmax, norms, reductions, scan, conv",
        "level2": "fused problems: GEMM epilogues, norm chains, softmax after matmul",
        "models": "operators of real models (LLaMA, GPT-2, ViT, ResNet, MobileNetV2, ConvNeXt, LSTM/GRU) in fp32, bf16, fp16",
    }.get(name, "")


def load_suite(
    name: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_file: Callable[[Path], None] | None = None,
) -> Suite:
    """A built-in suite name, or a directory of problem files."""
    if name in HGEMM_SUITES:
        return Suite(name, [hgemm_problem(*s, suite=name) for s in hgemm_shapes(name)])
    if name in DIR_SUITES:
        problems, skipped = load_files(problem_files_in(BUILTIN_DIR / name), name, name, timeout_s, on_file)
        return Suite(name, problems, skipped)
    path = Path(name)
    if path.is_dir():
        problems, skipped = load_files(problem_files_in(path), str(path), path.name, timeout_s, on_file)
        return Suite(path.name, problems, skipped)
    raise ProblemError(
        f"unknown suite {name!r}: not a built-in ({', '.join(builtin_suite_names())}) and not a directory"
    )


def load_problem(ref: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Problem:
    """'hgemm/M_N_K', 'level1/<name>', or a path to a problem file."""
    if ref.startswith("hgemm/"):
        dims = parse_hgemm_id(ref)
        if dims is None:
            raise ProblemError(f"bad hgemm id {ref!r}: expected hgemm/M_N_K with positive integers")
        return hgemm_problem(*dims)
    suite, _, stem = ref.partition("/")
    stem, _, variant = stem.partition("@")  # models/NAME@bf16: one dtype of a file that lists several
    if suite in DIR_SUITES and stem:
        path = BUILTIN_DIR / suite / f"{stem}.py"
        if not path.exists():
            known = ", ".join(p.stem for p in problem_files_in(BUILTIN_DIR / suite))
            raise ProblemError(f"no problem {stem!r} in {suite}; known: {known}")
        prefix: str | None = suite
    else:
        path, variant = Path(ref), ""
        if not path.is_file():
            raise ProblemError(f"no problem {ref!r}: not a built-in id (hgemm/M_N_K, level1/NAME) and not a file")
        prefix = None
    problems, skipped = load_files([path], prefix, prefix, timeout_s)
    if skipped:
        raise ProblemError(f"{skipped[0].path}: {skipped[0].reason}")
    if variant:
        found = [p for p in problems if p.id == f"{suite}/{stem}@{variant}"]
        if not found:
            raise ProblemError(f"no problem {ref!r}: {stem} comes as {', '.join(p.id for p in problems)}")
        return found[0]
    return problems[0]
