"""Prompts: jinja2 templates shipped in the package (agent/prompts/*.j2), overridable with
--prompt-dir. Stable parts come first (system rules, reference, hardware) and volatile parts last
(inspirations, parent, feedback), so provider-side prompt caching hits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from cuforge.fmt import si as _si

from cuforge.problems.problem import Problem

PACKAGE_PROMPTS = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    system: str
    stable: str  # the reference and the hardware: the same for every request on a problem
    volatile: str  # inspirations, parent, feedback, task

    @property
    def user(self) -> str:
        return self.stable + self.volatile

    @property
    def chars(self) -> int:
        return len(self.system) + len(self.user)


def environment(prompt_dir: Path | None = None) -> jinja2.Environment:
    search = [str(prompt_dir)] if prompt_dir else []
    search.append(str(PACKAGE_PROMPTS))
    return jinja2.Environment(loader=jinja2.FileSystemLoader(search), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def hardware_facts(device: dict[str, Any] | None, ceilings: dict[str, Any] | None = None) -> str:
    if not device or not device.get("name"):
        return "GPU not known yet (compile-only run): write portable code for sm_80 and newer."
    facts = [f"{device['name']}, compute capability {device.get('compute_capability', '?')}, "
             f"{device.get('sm_count', '?')} SMs, L2 {(device.get('l2_bytes') or 0) / 2**20:.0f} MiB."]
    if ceilings:
        rates = ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in ceilings.get("flops_per_s", {}).items())
        facts.append(f"Measured ceilings: {ceilings['bytes_per_s'] / 1e12:.2f} TB/s copy bandwidth; matmul {rates}.")
    facts.append("Shared memory: up to 227 KiB per block after raising the dynamic limit (the runtime does it "
                 "when shared_mem > 48 KiB)." if device.get("compute_capability") == "9.0" else
                 "Shared memory: raise the dynamic limit above 48 KiB via shared_mem (the runtime does it).")
    return "\n".join(facts)


def render(problem: Problem, mode: str, parent: Any = None, inspirations: list[Any] | None = None,
           device: dict[str, Any] | None = None, ceilings: dict[str, Any] | None = None,
           baseline: str = "torch", prompt_dir: Path | None = None, notice: str = "", partial: Any = None) -> Prompt:
    """The prompt for one request; `partial` (agent.partial.PartialCover) shows the kernel cuforge already
    has for the head of the graph and names the ops left to write."""
    env = environment(prompt_dir)
    tol = problem.meta.tolerance
    arch = f"sm_{device['compute_capability'].replace('.', '')}" if device and device.get("compute_capability") else "the GPU's arch"
    system = env.get_template("system.j2").render(
        policy=problem.meta.policy, arch=arch + ("a" if arch == "sm_90" else ""),
        tolerance=f"atol {tol.atol:g}, rtol {tol.rtol:g} and relative error norm {tol.rel_norm:g}")
    m = problem.meta
    stable = env.get_template("task.j2").render(
        problem=problem, shapes=problem.shapes_summary(), flops=_si(m.flops) if m.flops else None,
        nbytes=_si(m.bytes) + "B" if m.bytes else None,
        intensity=f"{m.arithmetic_intensity:.2f}" if m.arithmetic_intensity else "?",
        hardware=hardware_facts(device, ceilings), partial=partial)
    volatile = env.get_template("feedback.j2").render(
        inspirations=inspirations or [], parent=parent, mode=mode, baseline=baseline, notice=notice)
    return Prompt(system, stable, volatile)
