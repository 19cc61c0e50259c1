"""The public door of the sandbox: evaluate(problem, candidate, config) -> Evaluation."""

from __future__ import annotations

import atexit
from pathlib import Path

from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.driver.supervisor import Supervisor
from cuforge.sandbox.protocol.judges import judge_for

_SUPERVISORS: dict[tuple[int | None, bool, str], Supervisor] = {}


def supervisor_for(config: EvalConfig, gpu: int | None = 0, untrusted: bool = True) -> Supervisor:
    """This GPU's worker. Candidates from outside cuforge (a file, a caller's code) go to the split
    judge, the problem's own reference (`cuforge baseline`) to the in-process one, unless
    CUFORGE_JUDGE says otherwise (protocol/judges.py)."""
    cpu = config.device == "cpu"
    judge = judge_for(untrusted)
    key = (None if cpu else gpu, cpu, judge)
    sup = _SUPERVISORS.get(key)
    if sup is None:
        sup = _SUPERVISORS[key] = Supervisor(gpu=gpu, cpu_mode=cpu, judge=judge)
    return sup


def evaluate(problem: Problem, candidate: Candidate, config: EvalConfig | None = None, gpu: int | None = 0) -> Evaluation:
    """Compile, verify, time and profile one candidate in this GPU's long-lived worker."""
    config = config or EvalConfig(baselines=applicable_baselines(problem))
    return supervisor_for(config, gpu).evaluate(problem, candidate, config)


def applicable_baselines(problem: Problem) -> tuple[str, ...]:
    return tuple(problem.meta.baselines)


class CandidateFileError(ValueError):
    """A candidate file that cannot be used; the message names the file and the cause."""


def candidate_from_file(path: Path) -> Candidate:
    """A format-A candidate: a Python file defining ModelNew."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise CandidateFileError(f"{path}: is a directory, not a Python file") from None
    except FileNotFoundError:
        raise CandidateFileError(f"{path}: no such file") from None
    except PermissionError:
        raise CandidateFileError(f"{path}: permission denied") from None
    except OSError as e:
        raise CandidateFileError(f"{path}: cannot read ({e.strerror or e})") from None
    if b"\x00" in data:
        raise CandidateFileError(f"{path}: a binary file, not Python source")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CandidateFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if "ModelNew" not in text:
        raise CandidateFileError(f"{path}: defines no ModelNew (a candidate is a Python file with class ModelNew)")
    return Candidate(text, "module", proposer="file")


@atexit.register
def _close_all() -> None:
    for sup in _SUPERVISORS.values():
        sup.close()
