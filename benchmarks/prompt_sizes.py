"""Prompt sizes per seed template family, and the rendered prompts of docs/prompts/.

For one task per template family (:data:`FAMILIES`) this script renders the optimize prompt
of the task's seed three ways, with the real prompt code (:func:`mutators.llm.prompt.fields.
prompt_fields` and :func:`mutators.llm.prompt.templates.render_prompt`):

- **before**: the parent's whole source, no CuTe reference card (the prompts as they were);
- **trimmed**: the source with its unreachable branches elided (:mod:`mutators.llm.prompt.elide`);
- **+ card**: trimmed, plus the CuTe reference card (what is sent today);

and the genesis prompt (card and example kernel included). Tokens are counted with OpenAI's
``o200k_base`` encoding when a tokenizer package that ships its tables is importable
(``bpe_openai``, or ``tiktoken`` with its tables already cached), else estimated as
characters / 3 (the LLM mutator's conservative budget estimate,
:data:`mutators.llm.prompt.templates.BUDGET_CHARS_PER_TOKEN`); the output says which. A
prompt "fits" a window when its tokens plus :data:`OUTPUT_RESERVE` answer tokens do.

``--write`` also rewrites docs/prompts/ (the optimize, repair and genesis prompts of
:data:`EXAMPLE_TASKS`, exactly as a model receives them) and the table in docs/llm.md
(between ``<!-- prompt-sizes -->`` and ``<!-- end prompt-sizes -->``).
tests/test_prompt_docs.py checks that both are what the code renders today (characters,
which need no tokenizer)::

    python benchmarks/prompt_sizes.py            # print the table
    python benchmarks/prompt_sizes.py --write    # and rewrite docs/prompts/ and the table
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evo.core.records import Candidate, Member, Status  # noqa: E402
from mutators.base import MutationContext  # noqa: E402
from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo  # noqa: E402
from mutators.llm.prompt.templates import BUDGET_CHARS_PER_TOKEN, render_prompt  # noqa: E402

#: One task per seed template (the template's name, the task whose seed is rendered).
FAMILIES: tuple[tuple[str, str], ...] = (
    ("elementwise", "kb19_relu"),
    ("rowreduce", "kb23_softmax"),
    ("matvec", "kb04_matvec"),
    ("gemm_f32 (FFMA)", "kb01_square"),
    ("gemm_f32_3xtf32", "kb01_square"),
    ("gemm_bf16_sm90", "gemm_bf16"),
)
#: The tasks of docs/prompts/: an activation, a softmax, a GEMM.
EXAMPLE_TASKS = ("kb19_relu", "kb23_softmax", "kb01_square")
#: Windows of the table (tokens) and the answer tokens a prompt must leave room for.
WINDOWS = (("8k", 8192), ("32k", 32768), ("128k", 131072), ("200k", 200000))
OUTPUT_RESERVE = 4096
#: Measured seed times (H200, benchmarks/results_h200/RESULTS.md, commit cbba868): (shape, ours ms, torch ms, % of SOL).
MEASURED = {
    "kb19_relu": ("R=4096 C=393216", 2.9941, 3.0263, 89.7),
    "kb23_softmax": ("R=4096 C=393216", 3.4367, 6.1758, 78.1),
    "kb01_square": ("M=4096 N=4096 K=4096", 1.1927, 2.6998, 23.3),
}
GPU = "H200"
DOCS_PROMPTS = ROOT / "docs" / "prompts"
DOCS_LLM = ROOT / "docs" / "llm.md"
#: The debugging print a repair prompt's kernel carries: a policy rejection (every violation
#: is listed), computed by the real policy when the prompt is rendered.
DEBUG_PRINT = '  fprintf(stderr, "evo_launch: n_in = %d\\n", n_in);'


_TABLE_RE = re.compile(r"(<!-- prompt-sizes -->\n)(?:.*?\n)?(<!-- end prompt-sizes -->)", re.DOTALL)


def tokenizer() -> tuple[str, Callable[[str], int]]:
    """(name, count) of the best token counter available here (module docstring)."""
    try:
        import bpe_openai

        enc = bpe_openai.get_encoding("o200k_base")
        return f"o200k_base (bpe_openai {bpe_openai.__version__})", lambda s: len(enc.encode(s))
    except Exception:  # not installed, or its tables not loadable
        pass
    try:
        import tiktoken

        enc = tiktoken.get_encoding("o200k_base")  # works only with its tables already cached
        return f"o200k_base (tiktoken {tiktoken.__version__})", lambda s: len(enc.encode(s))
    except Exception:
        pass
    return (f"estimate: characters / {BUDGET_CHARS_PER_TOKEN:g} (no offline tokenizer importable)",
            lambda s: int(len(s) / BUDGET_CHARS_PER_TOKEN))


def _measured(task: str, family: str):
    """The seed's measured times (None for the FFMA GEMM, which RESULTS.md did not time)."""
    return None if family.startswith("gemm_f32 ") else MEASURED.get(task)


def seed_member(task: str, family: str = "") -> Member:
    """The task's seed as a correct parent, with its measured speedup (the FFMA GEMM family:
    its F32_FFMA_SEEDS entry, unmeasured, shown at 1.000x: its row gives sizes only)."""
    from evo.tasks.seeds import render, seed_params, seed_source

    if family.startswith("gemm_f32 "):
        from evo.tasks.gemm_seeds import F32_FFMA_SEEDS
        from evo.core.tunables import parse_tunables

        source = render(F32_FFMA_SEEDS[task])
        params = {t.name: t.default for t in parse_tunables(source)}
    else:
        source, params = seed_source(task), seed_params(task)
    m = _measured(task, family)
    fitness = m[2] / m[1] if m else 1.0
    return Member(candidate=Candidate.create(task, source, params, operator="seed"), fitness=round(fitness, 3))


def broken_member(seed: Member) -> tuple[Member, tuple[str, str, str]]:
    """The seed with a debugging print (``<cstdio>`` + ``fprintf``) and the real policy's verdict."""
    from evaluators.policy import check_policy

    lines = seed.candidate.source.split("\n")
    start = next(i for i, ln in enumerate(lines) if "evo_launch(" in ln and ln.startswith("EVO_EXPORT"))
    body = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("{"))
    lines.insert(body + 1, DEBUG_PRINT)
    inc = next(i for i, ln in enumerate(lines) if ln.startswith('#include "evo_abi.h"'))
    lines.insert(inc + 1, "#include <cstdio>")
    source = "\n".join(lines)
    pol = check_policy(source, seed.candidate.params)
    assert pol.status is Status.REJECTED, pol
    cand = Candidate.create(seed.candidate.task, source, seed.candidate.params_dict, parents=(seed.id,),
                            operator="llm:example", generation=1)
    return Member(candidate=cand, fitness=None, status=Status.REJECTED), ("policy", "rejected",
                                                                          pol.artifacts["violations"])


def _provider(task: str, info: TaskInfo, seed: Member, failure: tuple[Member, tuple[str, str, str]] | None,
              family: str = ""):
    from mutators.llm.prompt.context import ParentFacts, ShapeTiming

    facts = {}
    if _measured(task, family):
        shape, ms, torch_ms, sol = _measured(task, family)
        facts[seed.id] = ParentFacts((ShapeTiming(shape, ms, torch_ms, sol),))
    failures = {failure[0].id: failure[1]} if failure is not None else {}
    return SimpleContextProvider({task: info}, histories={seed.id: [(0, seed.fitness)]}, facts=facts,
                                 failures=failures)


def prompts(task: str, info: TaskInfo, family: str = "") -> dict[str, list[dict[str, str]]]:
    """The genesis, optimize and repair prompts of ``task`` as the LLM mutator renders them
    (no model window: nothing left out)."""
    from mutators.llm.client.chat import LLMClient
    from mutators.llm.client.model_spec import ModelSpec
    from mutators.llm.mutator import LLMMutator

    seed = seed_member(task, family)
    broken = broken_member(seed)
    spec = ModelSpec("example", "http://127.0.0.1:8000/v1", "example-model")
    mut = LLMMutator(LLMClient(), [spec], _provider(task, info, seed, broken, family))
    ctx = MutationContext(task, 0, 1)
    return {"genesis": mut.render("genesis", None, ctx, chain=f"genesis:{task}").messages,
            "optimize": mut.render("optimize", seed, ctx, chain=seed.id).messages,
            "repair": mut.render("repair", broken[0], ctx, chain=broken[0].id).messages}


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


@dataclass(frozen=True)
class Row:
    """One family's sizes (characters; tokens are counted from the texts)."""

    family: str
    task: str
    source_lines: int
    lines_elided: int
    before: str
    trimmed: str
    carded: str
    genesis: str


def family_row(family: str, task: str, info: TaskInfo) -> Row:
    from mutators.llm.prompt.fields import prompt_fields

    seed = seed_member(task, family)
    prov = _provider(task, info, seed, None, family)
    fields, _ = prompt_fields("optimize", seed, MutationContext(task, 0, 1), provider=prov, n_inspirations=0,
                              attempts_text=lambda k: "", feedback=None, failure=lambda m: ("", "", ""))

    def text(**change) -> str:
        return "".join(m["content"] for m in render_prompt("optimize", **{**fields, **change}))

    from mutators.llm.prompt.elide import elide_unreachable
    from mutators.llm.prompt.text import effective_source

    view = effective_source(seed.candidate.source, seed.candidate.params_dict)
    shown = elide_unreachable(view, abi_header=info.abi_text)
    genesis = prompts(task, info, family)["genesis"]
    return Row(family, task, view.count("\n") + 1, shown.lines_elided,
               before=text(card=None, elided=None, parent_source=view.rstrip("\n")), trimmed=text(card=None),
               carded=text(), genesis="".join(m["content"] for m in genesis))


def rows() -> list[Row]:
    from evo.engine.llm_context import task_info

    infos: dict[str, TaskInfo] = {}
    out = []
    for family, task in FAMILIES:
        if task not in infos:
            infos[task] = task_info(task, GPU)
        out.append(family_row(family, task, infos[task]))
    return out


def table(rs: list[Row], name: str, count: Callable[[str], int]) -> str:
    """The markdown table of docs/llm.md for ``rs`` (tokens by ``count``, named ``name``)."""
    head = ("| family (task) | source lines (elided) | optimize prompt tokens: before | trimmed | + card | saved by "
            "trimming | genesis (card + example) | " + " | ".join(f"fits {w}" for w, _ in WINDOWS)
            + " | characters: before / + card |")
    sep = "|" + "---|" * (8 + len(WINDOWS))
    lines = [f"Tokens: {name}. Fits: prompt (+ card) + {OUTPUT_RESERVE:,} answer tokens within the window.", "",
             head, sep]
    for r in rs:
        b, t, c, g = count(r.before), count(r.trimmed), count(r.carded), count(r.genesis)
        fits = " | ".join("yes" if c + OUTPUT_RESERVE <= w else "no" for _, w in WINDOWS)
        lines.append(f"| {r.family} ({r.task}) | {r.source_lines:,} ({r.lines_elided:,}) | {b:,} | {t:,} | {c:,} | "
                     f"{b - t:,} ({100 * (b - t) / b:.0f}%) | {g:,} | {fits} | {len(r.before):,} / {len(r.carded):,} |")
    return "\n".join(lines)


def committed_table(doc: str) -> str:
    """The table between docs/llm.md's prompt-sizes markers ("" when there is none)."""
    m = _TABLE_RE.search(doc)
    return m.group(0) if m else ""


def table_chars(text: str) -> dict[str, tuple[int, int]]:
    """``{"family (task)": (before, + card)}`` characters of a table made by :func:`table`."""
    out = {}
    for m in re.finditer(r"^\| (.+?) \|.*\| ([\d,]+) / ([\d,]+) \|$", text, re.MULTILINE):
        out[m.group(1)] = (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
    return out


def prompt_files(tasks: tuple[str, ...] = EXAMPLE_TASKS) -> dict[str, str]:
    """``{file name: text}`` of docs/prompts/ (the system message once: every prompt shares it)."""
    from evo.engine.llm_context import task_info

    files: dict[str, str] = {}
    systems = set()
    for task in tasks:
        info = task_info(task, GPU)
        for kind, msgs in prompts(task, info).items():
            systems.add(msgs[0]["content"])
            files[f"{task}.{kind}.md"] = (
                f"<!-- {kind} prompt of {task}, rendered by benchmarks/prompt_sizes.py --write; "
                "tests/test_prompt_docs.py checks it is current. The system message is system.md. -->\n"
                f"`````text\n{msgs[1]['content']}`````\n")
    assert len(systems) == 1, "the prompts' system messages differ: write one per prompt"
    files["system.md"] = ("<!-- The system message of every prompt, rendered by benchmarks/prompt_sizes.py --write; "
                          "tests/test_prompt_docs.py checks it is current. -->\n"
                          f"`````text\n{systems.pop()}`````\n")
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite docs/prompts/ and the table in docs/llm.md")
    args = ap.parse_args(argv)
    name, count = tokenizer()
    text = table(rows(), name, count)
    print(text)
    if args.write:
        DOCS_PROMPTS.mkdir(parents=True, exist_ok=True)
        for fname, body in prompt_files().items():
            (DOCS_PROMPTS / fname).write_text(body, encoding="utf-8")
        doc = DOCS_LLM.read_text(encoding="utf-8")
        if not _TABLE_RE.search(doc):
            raise SystemExit("docs/llm.md has no <!-- prompt-sizes --> ... <!-- end prompt-sizes --> block")
        DOCS_LLM.write_text(_TABLE_RE.sub(lambda m: m.group(1) + text + "\n" + m.group(2), doc), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
