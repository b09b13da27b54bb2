"""docs/prompts/ and the prompt-size table of docs/llm.md show what the code renders today.

Both are written by ``python benchmarks/prompt_sizes.py --write``; a change to a template,
the card, the trimming or a seed makes these fail until they are rewritten. The table's
token columns need a tokenizer this machine may not have, so its characters column is what
is checked (the tokens are counted from the same texts).
"""

from __future__ import annotations

import pytest

from benchmarks.prompt_sizes import (DOCS_LLM, DOCS_PROMPTS, EXAMPLE_TASKS, committed_table, prompt_files, rows,
                                     table_chars)

FIX = "rerun `python benchmarks/prompt_sizes.py --write`"


@pytest.fixture(scope="module")
def rendered():
    """Both renderings at once (one worker, one warm-up of the task facts)."""
    return prompt_files(), rows()


def test_docs_prompts_are_what_the_code_renders(rendered):
    files = rendered[0]
    assert set(files) == {"system.md"} | {f"{t}.{k}.md" for t in EXAMPLE_TASKS for k in ("genesis", "optimize", "repair")}
    committed = {p.name: p.read_text(encoding="utf-8") for p in DOCS_PROMPTS.glob("*.md")}
    stale = sorted(n for n in files if committed.get(n) != files[n])
    assert not stale, f"docs/prompts/ is stale ({', '.join(stale)}): {FIX}"
    extra = sorted(set(committed) - set(files))
    assert not extra, f"docs/prompts/ holds files the script does not write: {extra}"
    # what a reader is promised: the card in the system message, the trimmed relu source,
    # every policy violation in the repair prompt
    assert "# CuTe reference card" in files["system.md"]
    assert "[elided: lines" in files["kb19_relu.optimize.md"] and "log1pf(expf(x))" not in files[
        "kb19_relu.optimize.md"]
    assert "[include-allowlist]" in files["kb01_square.repair.md"] and "[no-host-file-io]" in files[
        "kb01_square.repair.md"]


def test_the_size_table_is_current(rendered):
    table = committed_table(DOCS_LLM.read_text(encoding="utf-8"))
    assert table, "docs/llm.md has no <!-- prompt-sizes --> block"
    current = {f"{r.family} ({r.task})": (len(r.before), len(r.carded)) for r in rendered[1]}
    assert table_chars(table) == current, f"docs/llm.md's prompt-size table is stale: {FIX}"
