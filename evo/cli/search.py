"""Search commands of the ``evo`` CLI: ``search`` (a run, or its ``--dry-run``) and
``fake-llm`` (the local fake endpoint a search's LLM mutator can talk to); registered by
:mod:`evo.cli.commands`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

import typer

from evo.cli.common import console
from evo.cli.common import fail as _fail
from evo.results.tables import fmt as _fmt

__all__ = ["search", "fake_llm"]

log = logging.getLogger(__name__)


def search(
    config: Path = typer.Argument(..., help="TOML config, e.g. configs/demo.toml."),
    address: Optional[str] = typer.Option(
        None, "--address", help="Join an existing Ray cluster (also $RAY_ADDRESS); default: start a local one."
    ),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue run RUN from its database."),
    max_evals: Optional[int] = typer.Option(None, "--max-evals", help="Override search.max_evaluations."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Validate config, render seeds, run policy and compile them; no GPU needed."
    ),
    probe: bool = typer.Option(
        True, "--probe/--no-probe",
        help="With --dry-run and the llm mutator: send each model one tiny request (--no-probe: none)."),
    db: Optional[str] = typer.Option(None, "--db", help="Override run.db."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Live progress table."),
) -> None:
    """Run an evolutionary search over the config's tasks (the main job).

    Starts a local Ray instance unless --address/RAY_ADDRESS names a cluster (its start
    begins at once, while the config loads, on a machine with nvidia-smi), seeds one or
    more islands per task, and keeps GPUs busy until the evaluation or time budget is spent.
    Ctrl-C stops gracefully: in-flight work is recorded, nothing is half-written, and
    `--resume RUN` continues later.

    Example: evo search configs/demo.toml --max-evals 50
    """
    from evo.engine.early_ray import begin_early_ray
    from evo.engine.startup import StartupClock

    clock = StartupClock("cli")
    # first of all: a local Ray instance's start (seconds) overlaps the config's load (torch)
    early_ray = begin_early_ray(config, dry_run=dry_run, address=address)
    prewarm = None
    if early_ray is not None:
        clock.mark("ray_start")
        # a local GPU will judge this run: its judge's Triton kernels are built beside Ray's start
        from evaluators.judge.prewarm import begin_prewarm

        prewarm = begin_prewarm(secret_env=early_ray.settings.secret_env)
    try:
        _search(config, address=address, resume=resume, max_evals=max_evals, dry_run=dry_run, probe=probe,
                db=db, progress=progress, clock=clock, early_ray=early_ray)
    finally:  # every way out (an error line, Ctrl-C, SIGTERM): no Ray process outlives the command
        if early_ray is not None:
            early_ray.close()
        if prewarm is not None:
            from evaluators.judge.prewarm import end_prewarm

            end_prewarm(prewarm)


def _search(config: Path, *, address: str | None, resume: str | None, max_evals: int | None, dry_run: bool,
            probe: bool, db: str | None, progress: bool, clock, early_ray) -> None:
    """The search command's body, with its start-up ``clock`` and the ``early_ray`` instance
    begun at entry (None: none; handed to run_search, which takes it over or closes it)."""
    gpu_probe = None if dry_run else _start_gpu_probe(address)
    from evo.config import ConfigError, load_config, load_tasks

    overrides: dict[str, Any] = {}
    if max_evals is not None:
        overrides["search.max_evaluations"] = max_evals
    if db is not None:
        overrides["run.db"] = db
    try:
        cfg = load_config(config, overrides)
        clock.mark("config")
        task_registry = load_tasks(cfg)  # the built-ins plus [tasks] files, this search's alone
        clock.mark("tasks")
    except ConfigError as e:
        _fail(str(e))

    from evo.engine import search as engine_mod

    if dry_run:
        from evo.engine.progress import StepProgress, progress_enabled

        try:
            with StepProgress("dry run: policy + nvcc", len(cfg.tasks.include) or 1,
                              enabled=progress_enabled(progress)) as bar:
                report = engine_mod.dry_run(cfg, resume=resume, probe=probe, task_registry=task_registry,
                                            on_progress=lambda t, i, n: bar.update(t, i, n),
                                            on_probes=_print_probes)
        except engine_mod.SearchError as e:
            _fail(str(e))
        _print_dry_run(report, cfg, probe)
        raise typer.Exit(0 if report["ok"] else 1)

    addr = address or os.environ.get("RAY_ADDRESS") or cfg.ray.address
    if not addr:  # no cluster named: the probe started above (no --address, no RAY_ADDRESS)
        gpu_found = gpu_probe is not None and gpu_probe.result()
        clock.mark("gpu")
        if not gpu_found:
            _fail(
                "no CUDA GPU found on this machine (nvidia-smi lists none), and no Ray cluster was "
                "named. `evo search` evaluates kernels on GPUs. Options: run on a machine with an "
                "NVIDIA GPU (sm_90a: H100/H200), join a cluster that has GPUs with --address, or "
                f"check the config, seeds and compiler here with: evo search {config} --dry-run"
            )
    try:
        summary = engine_mod.run_search(cfg, address=addr or None, resume=resume, progress=progress,
                                        task_registry=task_registry, startup=clock, early_ray=early_ray)
    except engine_mod.SearchError as e:
        _fail(str(e))
    console.print(f"run [bold]{summary.run_id}[/]: {summary.evaluations} evaluations, "
                  f"{summary.correct} correct, stopped: {summary.stop_reason}")
    _print_best(summary.best)
    console.print(f"inspect: evo top {summary.run_id} --db {cfg.run.db}")


def _start_gpu_probe(address: str | None):
    """The GPU probe (:func:`evaluators.pipeline.gpu_available`: ``nvidia-smi``, and whether
    torch is a CUDA build, read without importing torch) started on a thread, so that it runs
    while the config loads; None when a cluster is named, which needs no local GPU. A
    cluster named only by the config's ``ray.address`` is known after loading: the probe's
    answer is then not waited for."""
    if address or os.environ.get("RAY_ADDRESS"):
        return None
    import evaluators.pipeline as pipeline
    from evo.engine.background import BackgroundCall

    return BackgroundCall(pipeline.gpu_available, "evo-gpu-probe")


def _print_probes(probes: list) -> None:
    """The probe's line per model, printed as soon as the models are probed (before any
    compile; endpoint errors carry [brackets], so no markup)."""
    for p in probes:
        console.print(p.line(), markup=False, highlight=False, soft_wrap=True)


def _print_dry_run(report: dict, cfg, probe: bool) -> None:
    from evo.results.tables import table

    if report["seeds"]:  # none when a failed probe stopped the dry run before the compiles
        t = table("dry run: seeds through policy and compile (no GPU used)",
                  [("task", "id"), ("policy", "word"), ("compile", "word"), ("seconds", "num"), "note"])
        for row in report["seeds"]:
            t.add_row(row["task"], row["policy"], row["compile"], _fmt(row.get("seconds"), 1), row.get("note", ""))
        console.print(t)
    lines: list[str] = []
    if cfg.mutator.kind == "llm":  # one line per model and per task (the probes' lines are out already)
        if not probe:
            lines.append("LLM models: not probed (--no-probe)")
        elif cfg.llm.replay_run:
            lines.append(f"LLM models: not probed: the run replays the calls of run {cfg.llm.replay_run} and "
                         "calls no endpoint")
        lines += report.get("counters", [])
        lines += [s.line() for s in report["prompts"]]
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(report["plan"])


def _print_best(best: dict) -> None:
    if not best:
        return
    from evo.results.tables import table

    t = table("best per task", [("task", "id"), ("candidate", "id"), ("speedup", "num"), "operator"])
    for task, row in sorted(best.items()):
        t.add_row(task, row["id"][:12], _fmt(row["fitness"]), row["operator"])
    console.print(t)


def fake_llm(
    cassette: Path = typer.Option(..., "--cassette", help="JSONL file of scripted answers (docs/llm.md)."),
    port: int = typer.Option(8000, "--port", help="TCP port on 127.0.0.1 (0 = any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    dialect: str = typer.Option("lenient", "--dialect",
                                help="lenient, openai (api.openai.com's parameter rules and error bodies) or vllm."),
    context_tokens: Optional[int] = typer.Option(None, "--context-tokens", help="Answer 400 over this window."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Answer 401 unless this bearer token is sent."),
    models: str = typer.Option("", "--models", help="Comma-separated model ids served (others: 404)."),
    responses_only: str = typer.Option("", "--responses-only",
                                       help="Comma-separated model ids served only by /v1/responses."),
) -> None:
    """Serve a cassette as a local OpenAI-compatible endpoint (demos and tests; no model).

    Point a config's [[llm.models]] base_url at the printed URL. Ctrl-C stops it.

    Example: evo fake-llm --cassette tests/fixtures/llm/lineage.jsonl --port 8011 --dialect openai
    """
    from mutators.llm.replay.fake_server import DIALECTS
    from mutators.llm.replay.fake_server import main as serve

    if not cassette.is_file():
        _fail(f"{cassette}: no such cassette file")
    if dialect not in DIALECTS:
        _fail(f"--dialect {dialect}: unknown; known: {', '.join(DIALECTS)}")
    argv = ["--cassette", str(cassette), "--port", str(port), "--host", host, "--dialect", dialect,
            "--models", models, "--responses-only", responses_only]
    argv += ["--context-tokens", str(context_tokens)] if context_tokens is not None else []
    argv += ["--api-key", api_key] if api_key is not None else []
    raise typer.Exit(serve(argv))
