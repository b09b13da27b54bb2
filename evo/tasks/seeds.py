"""Seed kernels: the starting CuTe source of every task, rendered from a few templates.

Each task's seed is a :class:`SeedSpec` (template + ``#define`` lines + optional per-task
tunable defaults; see :mod:`evo.tasks.seedspec`). The memory-bound families live here:

- ``elementwise``: unary activations and scaling, fp32 and bf16, plus the row-scale
  ``kb12_diag`` (``EVO_ROWSCALE``);
- ``rowreduce``: softmax, log-softmax (fp32, bf16) and RMSNorm (bf16) over the last dim;
- ``matvec``: ``kb04_matvec``.

GEMM seeds come from :mod:`evo.tasks.gemm_seeds` (``GEMM_SEEDS``). The registry ``SEEDS`` is
their union; an unknown name raises :class:`UnknownSeedError` (a ``KeyError``) listing the
valid names.

**Cold seeds.** Every seed also exists cold: the same template and task-config ``#define``
lines, but each tunable at its first declared value instead of the hand-chosen default (the
seed's ``tunable_defaults`` and the template's own ``#ifndef`` defaults were both set from
hand sweeps, so neither is neutral). Where the first values break a ``@constraint``, the
tunables named in a violated constraint fall back to their template default one at a time,
in declaration order, until every constraint holds (:func:`cold_params`). A cold seed is
named ``"<seed>:cold"`` (:data:`COLD_SUFFIX`) wherever a seed name is accepted (a Task's
``seed``, :func:`seed_source`, :func:`seed_params`); :func:`cold_task` is a built-in task
renamed ``<task>_cold`` that starts from its cold seed, for a user task file
(``benchmarks/search_power.py`` writes one), so a search of the cold task and a bench of the
hand-tuned one can run side by side.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace

from evo.tasks.seedspec import SeedSpec, render
from evo.core.tunables import TunableError, parse_constraints, parse_tunables, violated_constraints

__all__ = [
    "SeedSpec",
    "UnknownSeedError",
    "ELEMENTWISE_SEEDS",
    "ROWREDUCE_SEEDS",
    "MATVEC_SEEDS",
    "SEEDS",
    "seed_names",
    "seed_spec",
    "seed_source",
    "seed_params",
    "template_names",
    "render",
    "COLD_SUFFIX",
    "cold_params",
    "cold_spec",
    "cold_task",
]

log = logging.getLogger(__name__)

_F32 = (("EVO_DTYPE", "float"), ("EVO_ELEM_BYTES", "4"), ("EVO_DTYPE_CODE", "EVO_F32"))
_BF16 = (("EVO_DTYPE", "__nv_bfloat16"), ("EVO_ELEM_BYTES", "2"), ("EVO_DTYPE_CODE", "EVO_BF16"))
_BF16_VEC = (("VEC", "8"),)
#: Ops costing more than a few instructions per element keep two 16-byte loads in flight per
#: thread (why: docs/kernels.md, "Seed defaults").
_ITEMS2 = (("ITEMS", "2"),)


def _unary(op: str, description: str, dtype=_F32, s0: float | None = None, s1: float | None = None,
           tunable_defaults: tuple[tuple[str, str], ...] = ()) -> SeedSpec:
    defines = dtype + ((f"EVO_OP_{op}", "1"),)
    if s0 is not None:
        defines += (("EVO_S0_DEFAULT", repr(float(s0))),)
    if s1 is not None:
        defines += (("EVO_S1_DEFAULT", repr(float(s1))),)
    return SeedSpec("elementwise", defines, description, tunable_defaults)


ELEMENTWISE_SEEDS: dict[str, SeedSpec] = {
    "kb05_scalar": _unary("SCALE", "out = A * scalars[0] (exact double multiply, one rounding)", s0=3.14),
    "kb19_relu": _unary("RELU", "ReLU, NaN-propagating"),
    "kb20_leaky_relu": _unary("LEAKY_RELU", "LeakyReLU, slope = scalars[0] (0.01)", s0=0.01),
    "kb21_sigmoid": _unary("SIGMOID", "sigmoid = 1 / (1 + expf(-x))", tunable_defaults=_ITEMS2),
    "kb22_tanh": _unary("TANH", "tanhf", tunable_defaults=_ITEMS2),
    "kb25_swish": _unary("SWISH", "x * sigmoid(x), one pass", tunable_defaults=_ITEMS2),
    "kb26_gelu": _unary("GELU", "erf GELU by an A&S erfc with fast exp (FAST_MATH 1): no cancellation for x << 0",
                       tunable_defaults=_ITEMS2 + (("FAST_MATH", "1"),)),
    "kb27_selu": _unary("SELU", "SELU with torch's alpha and scale, expm1f", tunable_defaults=_ITEMS2),
    "kb28_hardsigmoid": _unary("HARDSIGMOID", "relu6(x + 3) / 6"),
    "kb29_softplus": _unary("SOFTPLUS", "x > 20 ? x : log1p(exp(x)) (beta 1, threshold 20)",
                            tunable_defaults=_ITEMS2),
    "kb30_softsign": _unary("SOFTSIGN", "x / (1 + |x|), one pass", tunable_defaults=_ITEMS2),
    "kb31_elu": _unary("ELU", "ELU, alpha = scalars[0] (1.0), expm1f", s0=1.0, tunable_defaults=_ITEMS2),
    "kb32_hardtanh": _unary("HARDTANH", "clamp(x, scalars[0], scalars[1]) = (-1, 1)", s0=-1.0, s1=1.0),
    "gelu_bf16": _unary("GELU", "GELU, bf16 in/out, fp32 maths: tanh form on the hardware tanh (FAST_MATH 2)",
                       dtype=_BF16, tunable_defaults=_BF16_VEC + _ITEMS2 + (("FAST_MATH", "2"),)),
    "silu_bf16": _unary("SWISH", "SiLU x * sigmoid(x), bf16 in/out, fp32 maths, __expf (FAST_MATH 1)",
                       dtype=_BF16, tunable_defaults=_BF16_VEC + _ITEMS2 + (("FAST_MATH", "1"),)),
    "kb12_diag": SeedSpec(
        "elementwise", _F32 + (("EVO_ROWSCALE", "1"),),
        "diag(A) @ B as a row scale: out[i, j] = A[i] * B[i, j]",
    ),
}

#: Row reductions: hardware exp (FAST_MATH); kb23 / kb24 stream rows through persistent clusters
#: (STREAM); softmax_bf16 keeps a row in one 128-thread CTA, one exp per element
#: (why: docs/kernels.md, "Seed defaults").
ROWREDUCE_SEEDS: dict[str, SeedSpec] = {
    "kb23_softmax": SeedSpec(
        "rowreduce", _F32 + (("EVO_OP_SOFTMAX", "1"),),
        "softmax over dim 1: rows split over clusters, persistent clusters streaming rows through shared"
        " memory (online max/sum pass, then a write pass overlapping the next row's loads)",
        (("BLOCK", "512"), ("FAST_MATH", "1"), ("STREAM", "1")),
    ),
    "kb24_log_softmax": SeedSpec(
        "rowreduce", _F32 + (("EVO_OP_LOG_SOFTMAX", "1"),),
        "log-softmax over dim 1: same structure as kb23_softmax",
        (("BLOCK", "512"), ("FAST_MATH", "1"), ("STREAM", "1")),
    ),
    "softmax_bf16": SeedSpec(
        "rowreduce", _BF16 + (("EVO_OP_SOFTMAX", "1"),),
        "softmax over the last dim, bf16 in/out, fp32 maths; a row lives in one 128-thread CTA's "
        "registers, with one exp per element (pass 1's exps kept for pass 2)",
        (("VEC", "8"), ("REG_VECS", "4"), ("BLOCK", "128"), ("FAST_MATH", "1"), ("KEEP_EXP", "1")),
    ),
    "rmsnorm_bf16": SeedSpec(
        "rowreduce", _BF16 + (("EVO_OP_RMSNORM", "1"), ("EVO_S0_DEFAULT", "1e-06")),
        "RMSNorm with weight, eps = scalars[0], bf16 in/out, fp32 maths",
        (("VEC", "8"), ("REG_VECS", "2")),
    ),
}

MATVEC_SEEDS: dict[str, SeedSpec] = {
    "kb04_matvec": SeedSpec(
        "matvec", (), "A @ b: one CTA per row, 128-bit streaming of A, deterministic CTA reduction"
    ),
}


def _gemm_seeds() -> dict[str, SeedSpec]:
    try:
        from evo.tasks.gemm_seeds import GEMM_SEEDS
    except ModuleNotFoundError as exc:
        if exc.name != "evo.tasks.gemm_seeds":
            raise
        log.warning("evo.tasks.gemm_seeds is missing: the registry has no GEMM seeds")
        return {}
    return dict(GEMM_SEEDS)


SEEDS: dict[str, SeedSpec] = {**ELEMENTWISE_SEEDS, **ROWREDUCE_SEEDS, **MATVEC_SEEDS, **_gemm_seeds()}


class UnknownSeedError(KeyError):
    """No seed of that name; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown seed"


def seed_names() -> list[str]:
    """All registered seed names, sorted."""
    return sorted(SEEDS)


def template_names() -> list[str]:
    """The templates the registered seeds use, sorted."""
    return sorted({spec.template for spec in SEEDS.values()})


def seed_spec(task_name: str) -> SeedSpec:
    """The SeedSpec of ``task_name`` (``"<name>:cold"``: its cold seed, :func:`cold_spec`);
    UnknownSeedError lists the valid names."""
    if task_name.endswith(COLD_SUFFIX):
        return cold_spec(task_name[: -len(COLD_SUFFIX)])
    return _hand_spec(task_name)


def _hand_spec(name: str) -> SeedSpec:
    try:
        return SEEDS[name]
    except KeyError:
        raise UnknownSeedError(
            f"no seed kernel for {name!r}; valid names: {', '.join(seed_names())} "
            f"(each also as '<name>{COLD_SUFFIX}')") from None


#: Suffix of a cold seed's name: ``"kb19_relu:cold"`` (module docstring, "Cold seeds").
COLD_SUFFIX = ":cold"
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def cold_params(name: str) -> dict[str, str]:
    """The cold tunable values of seed ``name`` (module docstring, "Cold seeds").

    Raises :class:`UnknownSeedError` for an unknown seed and :class:`evo.core.tunables.TunableError`
    when even the template's defaults break a constraint (the template must be fixed).
    """
    spec = _hand_spec(name)
    source = render(replace(spec, tunable_defaults=()))
    tunables = parse_tunables(source)
    values = {t.name: t.choices[0] for t in tunables}
    constraints = {c.line: c.expr for c in parse_constraints(source)}
    while True:
        violated = violated_constraints(source, values)
        if not violated:
            return values
        named = set()
        for v in violated:
            line = int(v.split(":", 1)[0].removeprefix("line "))
            named.update(_IDENT_RE.findall(constraints[line]))
        movable = [t for t in tunables if t.name in named and values[t.name] != t.default]
        if not movable:
            raise TunableError(
                f"seed {name!r}: no cold assignment satisfies its constraints ({'; '.join(violated)}), "
                f"not even the template defaults of the tunables they name; fix template {spec.template!r}")
        values[movable[0].name] = movable[0].default


def cold_spec(name: str) -> SeedSpec:
    """Seed ``name`` with its tunable defaults moved to :func:`cold_params`."""
    spec = _hand_spec(name)
    return replace(spec, description=f"{spec.description} [cold: tunables at neutral values]",
                   tunable_defaults=tuple(cold_params(name).items()))


def cold_task(name: str):
    """Built-in task ``name`` as ``<name>_cold``, whose seed is ``"<seed>:cold"`` (for a user
    task file: ``TASKS = [cold_task("kb19_relu")]``). Same reference, inputs, shapes and
    tolerance; UnknownSeedError when the task has no built-in seed."""
    from evo.tasks.registry import get_task

    task = get_task(name)
    seed = task.seed or name
    _hand_spec(seed)
    return replace(task, name=f"{name}_cold", seed=seed + COLD_SUFFIX)


def seed_source(task_name: str) -> str:
    """The rendered, self-contained seed source of ``task_name``."""
    return render(seed_spec(task_name))


def seed_params(task_name: str) -> dict[str, str]:
    """The seed's tunables at their defaults (the seed candidate's params)."""
    return {t.name: t.default for t in parse_tunables(seed_source(task_name))}

