"""Entry points of a search: config -> store, runtime, mutator, seeds -> Engine -> summary.

``evo search`` calls :func:`run_search` (or :func:`dry_run` with ``--dry-run``). This module
wires the pieces together from a validated config; the scheduling itself lives in
:mod:`evo.engine.engine`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from evo.engine.background import BackgroundCall
from evo.engine.early_ray import EarlyRay, exit_on_sigterm
from evo.engine.local_ray import LocalRaySettings
from evo.engine.engine import Engine, EngineSettings, SearchError, SearchSummary
from evo.engine.startup import StartupClock
from evo.core.records import Candidate

__all__ = ["run_search", "dry_run", "make_mutator", "engine_settings", "MUTATOR_KINDS", "SearchError",
           "SearchSummary", "seed_for", "seeds_for"]

log = logging.getLogger(__name__)


def engine_settings(cfg) -> EngineSettings:
    """The engine's record of ``cfg`` (:meth:`evo.config.Config.engine_settings`)."""
    return cfg.engine_settings()


MUTATOR_KINDS = ("knobs", "llm")


def make_mutator(cfg, *, store=None, run_id: str = "", rng: random.Random | None = None, task_registry=None):
    """Build the configured mutator. The LLM mutator records every call in ``llm_calls``,
    every attempt as an ``llm_attempt`` event of the run and links each call whose answer
    became a child to it (:class:`evo.engine.llm_records.LLMRecorder`; the store is the
    driver's); its prompts describe the tasks of ``task_registry`` (None: the built-in tasks)."""
    kind = cfg.mutator.kind
    if kind == "knobs":
        from mutators.knobs import KnobsMutator

        return KnobsMutator.from_settings(cfg.knobs_settings())
    if kind == "llm":
        return _make_llm_mutator(cfg, store=store, run_id=run_id, rng=rng or random.Random(0),
                                 task_registry=task_registry)
    raise SearchError(f"mutator.kind = {kind!r}: unknown; known: {', '.join(MUTATOR_KINDS)}")


def _make_llm_mutator(cfg, *, store, run_id: str, rng: random.Random, task_registry):
    from evo.engine.llm_context import StoreContextProvider
    from evo.engine.llm_records import ATTEMPT_EVENT, LLMRecorder
    from mutators.llm.replay.cassette import CassetteRecorder, ReplayClient
    from mutators.llm.client.budget import Budget
    from mutators.llm.client.chat import LLMClient
    from mutators.llm.client.model_spec import ModelSpec
    from mutators.llm.client.health import ModelHealth
    from mutators.llm.mutator import LLMMutator, LLMMutatorSettings
    from mutators.llm.prompt.tokens import default_counter

    from mutators.llm.client.model_spec import LLMConfigError
    from mutators.llm.client.served import with_server_windows

    L = cfg.llm
    # [[llm.models]] keys map one to one onto ModelSpec fields (tests/test_llm_config.py).
    models = [ModelSpec(**m.model_dump()) for m in L.models]
    if not L.replay_run:  # a window left unset is read from the server's model list (vLLM's max_model_len)
        try:
            models = with_server_windows(models)
        except LLMConfigError as e:
            raise SearchError(str(e)) from None

    recorder = LLMRecorder(store, run_id)
    sink = CassetteRecorder(str(L.cassette), then=recorder.call) if L.cassette else recorder.call
    # On resume the money already spent by this run counts against the budget.
    spent = float(store.llm_totals(run_id).get("cost") or 0.0)
    budget = Budget(L.budget_usd, spent=spent)
    if L.replay_run:
        attempts = [e["payload"] for e in store.events(L.replay_run, ATTEMPT_EVENT)]
        client = ReplayClient.from_run(store.llm_calls(L.replay_run), attempts, budget=budget, sink=sink)
    else:
        client = LLMClient(models, timeout_s=L.timeout_s, max_attempts=L.max_retries + 1,
                           backoff_base_s=L.backoff_base_s, concurrency=L.concurrency,
                           max_response_bytes=L.max_response_kb * 1024, budget=budget, sink=sink,
                           rng=random.Random(rng.randrange(2**31)))

    health = ModelHealth(models, failures=L.breaker_failures, cooldown_s=L.breaker_cooldown_s,
                         trips=L.breaker_trips, on_stop=recorder.model_stopped)
    provider = StoreContextProvider(store, run_id, feedback_after=cfg.profile.feedback_after,
                                    gpu_name=None if cfg.run.gpu == "auto" else cfg.run.gpu,
                                    task_registry=task_registry)
    settings = LLMMutatorSettings(max_response_kb=L.max_response_kb, n_inspirations=L.inspirations,
                                  repair_rounds=L.repair_rounds, repair_per_lineage=L.repair_per_lineage,
                                  concurrency=L.concurrency, max_failed_attempts=L.max_failed_attempts)
    # prompts are counted where a tokenizer is known (a vLLM server's /tokenize, bpe-openai's
    # OpenAI encodings); a replay asks no server
    counter = default_counter(server=not L.replay_run)
    return LLMMutator(client, models, provider, settings, health=health, attempt_sink=recorder.attempt,
                      token_counter=counter)


def _task_registry(cfg, task_registry):
    """``task_registry`` (the CLI passes :func:`evo.config.load_tasks`'s), else the built-in
    tasks plus the config's ``tasks.files``; a file that fails to load is a :class:`SearchError`."""
    if task_registry is not None:
        return task_registry
    from evo.tasks.registry import BUILTIN_TASKS
    from evo.tasks.user import TaskFileError

    try:
        return BUILTIN_TASKS.with_files(cfg.tasks.files)
    except TaskFileError as e:
        raise SearchError(f"tasks.files: {e}") from None


def _task_names(cfg, task_registry) -> list[str]:
    try:
        return [t.name for t in task_registry.select(list(cfg.tasks.include))]
    except KeyError as e:  # an include entry none of the task files defines
        raise SearchError(f"tasks.include: {e}") from None


def seed_for(task_name: str, task_registry=None) -> tuple[str, dict[str, str]] | None:
    """The seed kernel (source, params at their declared defaults) of a task, or None.

    ``Task.seed`` is a ``.cu`` path (the user-task loader made it absolute, relative to the
    task file), the name of a built-in seed (``evo.tasks.seeds``), or empty: a built-in task
    then uses the seed named like itself, and a user task has none (the LLM mutator writes
    the first kernel: genesis). Raises :class:`SearchError` naming the task and the fix.
    ``task_registry``: where the task is looked up (None: the built-in tasks).
    """
    from pathlib import Path

    from evo.tasks.registry import BUILTIN_TASKS
    from evo.tasks.seeds import SEEDS, UnknownSeedError, seed_params, seed_source
    from evo.core.tunables import resolve_params

    task = (BUILTIN_TASKS if task_registry is None else task_registry).get(task_name)
    if task.seed and task.seed.endswith(".cu"):
        try:
            src = Path(task.seed).read_text()
        except OSError as e:
            raise SearchError(f"task {task_name!r}: cannot read its seed kernel {task.seed}: "
                              f"{e.strerror or e}; fix the task's `seed` path (relative to the task file)") from e
        return src, resolve_params(src, {})
    name = task.seed or (task_name if task_name in SEEDS else "")
    if not name:
        return None
    try:
        return seed_source(name), seed_params(name)
    except UnknownSeedError as e:
        raise SearchError(f"task {task_name!r}: seed {name!r} is neither a .cu file nor a built-in seed; "
                          f"give `seed = \"file.cu\"` (relative to the task file), a built-in seed name "
                          f"({', '.join(sorted(SEEDS)[:6])}, ...: `evo tasks` lists them), or no seed "
                          f"with the llm mutator") from e


def seeds_for(names: list[str], mutator_kind: str, task_registry=None) -> dict[str, tuple[str, dict[str, str]]]:
    """Seeds of every task that has one (looked up in ``task_registry``; None: the built-in
    tasks); a task without a seed needs a mutator that can write the first kernel (``llm``),
    else :class:`SearchError` says how to give a seed."""
    seeds: dict[str, tuple[str, dict[str, str]]] = {}
    for name in names:
        got = seed_for(name, task_registry)
        if got is not None:
            seeds[name] = got
        elif mutator_kind != "llm":
            raise SearchError(
                f"task {name!r} has no seed kernel, and the {mutator_kind} mutator only changes an "
                f"existing kernel: add `seed = \"my_kernel.cu\"` (relative to the task file) or a "
                f"built-in seed name to the Task, or use `[mutator] kind = \"llm\"` so the model "
                f"writes the first kernel")
    return seeds


def _check_llm_keys(cfg) -> None:
    """:class:`SearchError` with one line per model whose key variable is unset (and the fix)."""
    from evo.engine.llm_check import missing_keys

    missing = missing_keys(cfg)
    if missing:
        raise SearchError("; ".join(missing))


def dry_run(cfg, *, resume: str | None = None, on_progress=None, probe: bool = True, task_registry=None,
            on_probes=None) -> dict:
    """Everything a search does before the GPU: config, tasks, seeds, policy, compile, and
    for the ``llm`` mutator its models and prompts (:mod:`evo.engine.llm_check`).

    Checks first, before any compile, and raises :class:`SearchError` with one line when
    the database location cannot be used (:func:`evo.core.paths.check_db_location`) or
    ``resume`` names no run of that database. ``on_progress(task, done, total)`` is called
    before each seed's policy check and compile and once with ``done == total`` at the end
    (the CLI draws a progress bar from it; the compiles take most of a dry run's time).
    ``task_registry``: the config's tasks (:func:`evo.config.load_tasks`; None: the built-in
    tasks plus ``cfg.tasks.files``).

    With the ``llm`` mutator the models are probed next, still before any compile, and
    ``on_probes(probes)`` is called at once with the result (the CLI prints their lines): a
    model whose probe fails for good (a wrong key, an unknown model id, a setting the model
    refuses: not a transient failure a real run retries) stops the dry run there, with no
    seed compiled, so the fix is known in seconds rather than after the compiles.

    Returns ``{"ok", "seeds", "plan", "probes", "prompts", "counters"}``: with the ``llm``
    mutator, ``probes`` holds one :class:`evo.engine.llm_check.ModelProbe` per model (one tiny
    request each; none with ``probe=False``), ``prompts`` one
    :class:`evo.engine.llm_check.PromptSize` per task and ``counters`` one line per model
    saying what counts its prompts' tokens (:func:`evo.engine.llm_check.counter_lines`); all
    are empty for the ``knobs`` mutator, and ``seeds`` is empty when a probe stopped the dry
    run. ``ok`` is False when a seed fails policy or compile, a probed model fails (not for a
    transient failure), or a task's starting prompt fits no model.
    """
    from evaluators.compile import compile_candidate
    from evaluators.policy import check_policy
    from evo.core.paths import LocationError, check_db_location

    try:
        check_db_location(cfg.run.db)
    except LocationError as e:
        raise SearchError(f"run.db: {e}") from None
    _check_llm_keys(cfg)  # before any compile, with or without --no-probe
    resumed = ""
    if resume:
        from pathlib import Path

        from evo.results.status import resolve_run
        from evo.store import Store, StoreError

        if not Path(cfg.run.db).is_file():
            raise SearchError(f"--resume {resume}: the database {cfg.run.db} does not exist yet, so it has no "
                              "run to resume; drop --resume to start a new run (or pass the right --db)")
        try:
            with Store.open_reader(cfg.run.db) as store:
                rid = resolve_run(store, resume)
                n_done = len(store.evaluated_ids(rid))
                same = store.get_run(rid).get("config_hash") in (None, "", cfg.hash())
        except StoreError as e:
            raise SearchError(f"--resume {resume}: {e}") from None
        resumed = (f" Resumes run {rid} ({n_done} evaluations done"
                   + ("" if same else "; its config differs from this one, the new one is used") + ").")
    rows, ok = [], True
    task_registry = _task_registry(cfg, task_registry)
    names = _task_names(cfg, task_registry)
    cs = cfg.compile_settings()
    seeds = seeds_for(names, cfg.mutator.kind, task_registry)
    probes, prompts, counters = [], [], []
    if cfg.mutator.kind == "llm" and probe:  # before any compile: a wrong key or model id shows in seconds
        from evo.engine.llm_check import probe_models

        probes = probe_models(cfg)
        if on_probes is not None:
            on_probes(probes)
        if not all(p.ok for p in probes):
            return {"ok": False, "seeds": [], "probes": probes, "prompts": [], "counters": [],
                    "plan": "dry run stopped before compiling the seeds: fix the model(s) whose probe FAILED "
                            "(each line names its fix), then run it again."}
    for i, name in enumerate(names):
        if on_progress is not None:
            on_progress(name, i, len(names))
        if name not in seeds:
            rows.append({"task": name, "policy": "-", "compile": "-",
                         "note": "genesis: the first kernel will be written by the model"})
            continue
        src, params = seeds[name]
        pol = check_policy(src)
        row = {"task": name, "policy": pol.status.value, "compile": "-", "note": pol.reason}
        if pol.passed:
            out = compile_candidate(Candidate.create(name, src, params), cs)
            row["compile"] = out.result.status.value + (" (cached)" if out.cached else "")
            row["seconds"] = out.result.seconds
            row["note"] = out.result.reason
            ok &= out.result.passed
        else:
            ok = False
        rows.append(row)
    if on_progress is not None:
        on_progress("", len(names), len(names))
    if cfg.mutator.kind == "llm":
        from evo.engine.llm_check import counter_lines, prompt_sizes, token_counter

        # the run's counter; --no-probe (or a replayed run) sends no request to count tokens either
        counter = token_counter(server=probe and not cfg.llm.replay_run)
        prompts = prompt_sizes(cfg, seeds, names, windows={p.model: p.window for p in probes if p.window},
                               task_registry=task_registry, counter=counter)
        counters = counter_lines(cfg, counter)
        ok &= all(p.fits_any for p in prompts)
    s = engine_settings(cfg)
    plan = (f"plan: {len(names)} task(s) x {s.islands_per_task} island(s), budget "
            f"{s.max_evaluations} evaluations or {s.max_wall_seconds / 60:.1f} min, mutator "
            f"{cfg.mutator.kind}, db {cfg.run.db}.{resumed} No GPU was used; run without --dry-run on a "
            "machine with an NVIDIA GPU to search.")
    return {"ok": ok, "seeds": rows, "plan": plan, "probes": probes, "prompts": prompts, "counters": counters}


def run_search(cfg, *, address: str | None = None, resume: str | None = None,
               progress: bool = True, stages=None, task_registry=None,
               startup: StartupClock | None = None, early_ray: EarlyRay | None = None) -> SearchSummary:
    """Open the store, start the runtime, run the engine, shut down. The CLI calls this.
    ``task_registry``: the config's tasks (:func:`evo.config.load_tasks`; None: the built-in
    tasks plus ``cfg.tasks.files``). ``startup``: the clock the caller's earlier steps were
    marked on (the CLI's); this marks the rest, and the ``start`` event records them all
    (:class:`evo.engine.startup.StartupRecord`).

    Everything that can refuse the search quickly (tasks, seeds, keys, the database, the run
    to resume and its writer lease) is checked before the runtime starts. A local Ray
    instance (no ``address``, no ``RAY_ADDRESS``) then starts on a thread of its own while
    this thread probes the sandbox (the seed compiles run on threads already); a failed start raises
    :class:`SearchError` with its one line, and any failure leaves the run ``failed``,
    never ``running``, with what was started stopped.

    ``early_ray``: a local instance whose start the caller began before the config was
    validated (:mod:`evo.engine.early_ray`; ``evo search`` does): the runtime takes it over
    when it serves this config (:meth:`~evo.engine.early_ray.EarlyRay.hand_over`), else it is
    shut down and Ray starts as it would have without it. It is closed before this returns or
    raises, whatever happened.
    """
    try:
        return _run_search(cfg, address=address, resume=resume, progress=progress, stages=stages,
                           task_registry=task_registry, startup=startup, early_ray=early_ray)
    finally:
        if early_ray is not None:
            early_ray.close()


def _run_search(cfg, *, address: str | None, resume: str | None, progress: bool, stages, task_registry,
                startup: StartupClock | None, early_ray: EarlyRay | None) -> SearchSummary:
    from pathlib import Path

    from evaluators.policy import check_policy
    from evaluators.sandbox import describe as sandbox_describe
    from evo.store import Store, StoreError

    from evo.core.paths import LocationError, check_db_location
    from evo.results.status import resolve_run

    clock = startup or StartupClock("search")
    task_registry = _task_registry(cfg, task_registry)
    names = _task_names(cfg, task_registry)
    seeds = seeds_for(names, cfg.mutator.kind, task_registry)  # before any run exists: a seedless task fails here
    if early_ray is not None and cfg.llm is not None:
        early_ray.wait()  # the keys are out of the environment while the instance starts
    _check_llm_keys(cfg)
    try:
        check_db_location(cfg.run.db)
    except LocationError as e:
        raise SearchError(f"run.db: {e}") from None
    clock.mark("seeds")
    local = not (address or os.environ.get("RAY_ADDRESS"))
    if early_ray is not None and not local:  # the validated config names a cluster after all
        early_ray.close()
    builds: dict = {}
    if stages is None and not resume and local:
        # first, on threads: the seeds' compiles are the longest step before the first
        # evaluation, and need nothing of the store or the runtime
        builds = precompile_seeds(seeds, cfg.compile_settings())   # real compiles, on this machine's cache
        prebuild_runner()
    Path(cfg.run.db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.run.db)
    run_id = None
    ray_start: BackgroundCall | None = None   # a local instance's start, on its own thread
    rt = None
    try:
        if resume:
            try:
                run = store.get_run(resolve_run(store, resume))  # an id or a unique prefix
                store.acquire_lease(run["id"])  # one writer per run: RunLeasedError names the live one
            except StoreError as e:
                raise SearchError(str(e)) from e
            run_id = run["id"]
            if run.get("config_hash") and run["config_hash"] != cfg.hash():
                log.warning("config differs from the one run %s started with; continuing with the new one", run_id)
            seed = int(run.get("seed", cfg.run.seed))
            store.set_run_status(run_id, "running")
        else:
            run_id = store.create_run(cfg.run.name, cfg.to_dict(), seed=cfg.run.seed, config_hash=cfg.hash())
            seed = cfg.run.seed  # create_run took the new run's writer lease
        n_done = len(store.evaluated_ids(run_id)) if resume else 0
        rng = random.Random(f"{seed}:{n_done}")
        clock.mark("store")
        start = functools.partial(_start_runtime, cfg, names, stages=stages, address=address, builds=builds)
        early = early_ray if early_ray is not None and not early_ray.closed else None
        if local and early is None:
            clock.mark("ray_start")
            ray_start = BackgroundCall(start, "evo-ray-start", hold=True)
        # Probed here, on the driver's machine: the GPU actors' own logs do not reach the
        # terminal, and a missing layer (no network namespace) must be visible at start.
        sandbox = sandbox_describe()
        if "NO " in sandbox:
            log.warning("candidate sandbox on this machine: %s", sandbox)
        else:
            log.info("candidate sandbox: %s", sandbox)
        clock.mark("prepared")
        ray_s = early.hand_over(LocalRaySettings.of_config(cfg)) if early is not None else None
        if early is not None and ray_s is None:  # it could not serve and was shut down: start as without it
            clock.mark("ray_start")
            ray_start = BackgroundCall(start, "evo-ray-start", hold=True)
        if ray_s is not None:  # the early instance, taken over: only the workers are created here
            rt, runtime_s = start(adopt=True)
            runtime_s = round(ray_s + runtime_s, 3)
        elif ray_start is None:
            clock.mark("ray_start")
            rt, runtime_s = start()
        else:
            rt, runtime_s = ray_start.result()
        if getattr(rt, "started_ray", False):
            exit_on_sigterm()
        clock.mark("ray_ready")
        record = clock.record(runtime_s, ray_overlapped=ray_start is not None or ray_s is not None,
                              ray_early=ray_s is not None)
        view = None
        try:
            descriptor = _descriptor_fn()
            cb = None
            if progress:
                from evo.engine.progress import LiveProgress

                view = LiveProgress(run_id)
                view.start()
                cb = view.update
            settings = engine_settings(cfg)
            if settings.tuning is not None:
                from dataclasses import replace

                from evo.tuning.tuning import journal_path

                settings = replace(settings, tuning_storage=str(journal_path(cfg.run.db, run_id)))
            eng = Engine(store=store, runtime=rt, mutator=make_mutator(cfg, store=store, run_id=run_id, rng=rng,
                                                                       task_registry=task_registry),
                         run_id=run_id, tasks=names, task_registry=task_registry,
                         seeds=seeds, settings=settings, rng=rng, policy=check_policy,
                         descriptor=descriptor, on_progress=cb)
            store.log_event(run_id, "start" if not resume else "resume_start",
                            {"tasks": names, "gpus": rt.n_gpus, "cpus": rt.n_cpus, "sandbox": sandbox,
                             "startup": record.to_json()})
            return eng.run(resume=bool(resume))
        finally:
            if view is not None:
                view.stop()
            rt.shutdown()
    except BaseException as e:
        if ray_start is not None and rt is None:
            _stop_when_started(ray_start)
        if run_id is not None:  # a failed start or search leaves no phantom `running` run
            store.abort_run(run_id, e)
        raise
    finally:
        if ray_start is not None:
            ray_start.release()  # after the instance it started was shut down
        store.close()


def _start_runtime(cfg, names: list[str], *, stages, address: str | None, adopt: bool = False,
                   builds: Mapping[str, Any] | None = None):
    """The cluster runtime of ``cfg`` built and started: (runtime, seconds its start took).
    ``builds``: the seeds' compiles begun in this process (:func:`precompile_seeds`), which
    order the tasks the GPU actors' judges prepare (:func:`warm_order`).

    Runs on the thread that owns a local Ray instance (:class:`evo.engine.background.BackgroundCall`
    with ``hold``), so a start that fails after Ray came up shuts Ray down here, on that thread;
    with ``adopt`` the instance already runs (an early start handed over, whose own thread
    outlives it) and the runtime, which then owns it, only creates its workers. Raises
    :class:`SearchError` with the runtime's one line when the cluster cannot serve the search
    (:class:`evo.engine.runtime.RuntimeError_`).
    """
    from evo.engine.runtime import Runtime, RuntimeError_, real_stages

    local = LocalRaySettings.of_config(cfg)  # secret_env: kept out of Ray
    rt = Runtime(
        stages=stages or real_stages(), compile_settings=cfg.compile_settings(),
        harness_settings=dataclasses.replace(cfg.harness_settings(), warm_tasks=warm_order(names, builds or {})),
        address=address,
        num_cpus=local.num_cpus, num_gpus=local.num_gpus, secret_env=local.secret_env,
        **({"started_ray": True} if adopt else {}),   # only when taking over: the field's default otherwise
    )
    t0 = time.monotonic()
    try:
        rt.start()
    except BaseException as e:
        if getattr(rt, "started_ray", False):
            try:
                rt.shutdown()
            except Exception as stop_error:  # noqa: BLE001 - the start's own error is the one to report
                log.debug("shutting down after a failed start: %s", stop_error)
        if isinstance(e, RuntimeError_):
            raise SearchError(str(e)) from e
        raise
    return rt, round(time.monotonic() - t0, 3)


def _stop_when_started(ray_start: BackgroundCall) -> None:
    """The search failed before it took its runtime: wait for the start to end and shut down
    what it started (a start that failed has cleaned up after itself)."""
    try:
        rt, _ = ray_start.result()
    except BaseException:  # noqa: BLE001 - reported by whoever took the result, or superseded
        return
    rt.shutdown()


def precompile_seeds(seeds: dict, settings) -> dict[str, Any]:
    """Compile the seeds into the compile cache on threads of this process, while the local
    Ray instance and its workers start (seconds): the engine's own compile of a seed, on a
    worker of this machine, then finds it built, or waits on the cache entry's lock while it
    is built, never building it twice. Returns each task's thread (daemons; a failure is only
    logged: the engine's compile meets it again and records it). Nothing without a cache."""
    import threading

    from evaluators.compile import compile_candidate

    if not settings.cache_dir:
        return {}

    def build(cand: Candidate) -> None:
        try:
            compile_candidate(cand, settings)
        except Exception as e:  # noqa: BLE001 - the engine's compile of the seed reports it
            log.debug("precompiling the seed of %s failed: %s", cand.task, e)

    threads = {task: threading.Thread(target=build, args=(Candidate.create(task, src, params),), daemon=True,
                                      name=f"evo-precompile-{task}")
               for task, (src, params) in seeds.items()}
    for t in threads.values():
        t.start()
    return threads


def prebuild_runner(build=None) -> Any:
    """Build the judge's runner (:func:`evaluators.runner.build.runner_binary`) into this
    machine's cache on a thread, while the local Ray instance starts: the GPU actor's judge,
    on this machine, then finds it built (or waits on its lock) instead of building it before
    its first runner starts. Returns the thread (a daemon; a failure is only logged: the judge
    meets it again and reports it as ours). ``build``: the builder (tests)."""
    import threading

    def run() -> None:
        try:
            if build is not None:
                build()
            else:
                from evaluators.runner.build import runner_binary

                runner_binary("cuda")
        except Exception as e:  # noqa: BLE001 - the judge's own build reports it
            log.debug("prebuilding the runner failed: %s", e)

    t = threading.Thread(target=run, daemon=True, name="evo-prebuild-runner")
    t.start()
    return t


def warm_order(names: Sequence[str], builds: Mapping[str, Any]) -> tuple[str, ...]:
    """The order in which a GPU actor's judge prepares the run's tasks (before their first
    candidates): the tasks whose seed is built by now first, since their seeds are the first
    candidates to reach the GPU, then the others; each group in ``names``' order. ``builds``:
    task -> its seed's compile (anything with ``is_alive()``: :func:`precompile_seeds`'s threads);
    a task without one counts as not built."""
    done = [n for n in names if n in builds and not builds[n].is_alive()]
    return (*done, *(n for n in names if n not in done))


def _descriptor_fn():
    try:
        from populations.archive import descriptor_from_params
    except ImportError:  # pragma: no cover - populations is part of the package
        return None
    dims = ("tile", "stages", "vec", "block")
    return lambda params: descriptor_from_params(params, dims)


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0
