"""The kernel ABI on the Python side: ``EvoTensor`` as a ctypes struct and the .so loader.

The C header ``evaluators/abi/evo_abi.h`` is the source of the ABI; this module is its one
Python statement: the struct's fields (:data:`EVO_TENSOR_FIELDS`), the dtype codes
(:data:`EVO_DTYPES`) and the entry points' signatures (:data:`LAUNCH_ARGS` and friends), as
plain data. :class:`EvoTensor` and :func:`load_kernel` are built from that data, and so is the
copy of the struct in every exported ``op.py`` (``evo/results/export/render.py`` renders it
from here); ``tests/test_abi_header.py`` parses the header and fails on any difference.
Change the header, then this data, never the struct anywhere else.

The runner (``evaluators/runner/evo_runner.cpp``) is the only process of the engine that loads a
candidate's shared object; :func:`load_kernel` serves the kernel lab's in-process tools
(benchmarks/lab/) and the tests, on kernels the user trusts, never the judge.

Nothing here initialises CUDA. :func:`describe` takes anything tensor-like
(``data_ptr()``, ``dtype``, ``shape``, ``stride()``), so torch is imported lazily and only
for the dtype table.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = [
    "ABI_VERSION",
    "MAX_DIMS",
    "EVO_DTYPES",
    "EVO_TENSOR_FIELDS",
    "LAUNCH_ARGS",
    "LAUNCH_RESTYPE",
    "WORKSPACE_ARGS",
    "WORKSPACE_RESTYPE",
    "EvoTensor",
    "ctype",
    "KernelLibrary",
    "describe",
    "dtype_code",
    "load_kernel",
    "KernelLoadError",
    "WORKSPACE_POISON",
]

#: ``launch``'s default for ``workspace``: allocate (and poison) one if the kernel asks.
AUTO = object()

log = logging.getLogger(__name__)

ABI_VERSION = 1
MAX_DIMS = 8

#: torch dtype name -> EvoDType code (``enum EvoDType`` in evo_abi.h).
EVO_DTYPES: dict[str, int] = {
    "float32": 0,
    "float16": 1,
    "bfloat16": 2,
    "float64": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,   # only the optional workspace tensor
    "bool": 7,    # one byte per element, 0 or 1
}

#: Byte every workspace is filled with before a harness call: NaN in fp32, fp16 and bf16.
WORKSPACE_POISON = 0xFF


#: ``struct EvoTensor`` of evo_abi.h, member by member: ``(name, ctypes type name, array
#: length or None)``. Strides are in elements, as torch reports them.
EVO_TENSOR_FIELDS: tuple[tuple[str, str, int | None], ...] = (
    ("data", "c_void_p", None),
    ("dtype", "c_int32", None),       # EvoDType
    ("ndim", "c_int32", None),
    ("shape", "c_int64", MAX_DIMS),
    ("strides", "c_int64", MAX_DIMS),
)

#: ``evo_launch``'s parameter types, in order, as ctypes names (``EvoTensor*``: pointer to the
#: struct; ``c_double*``: pointer to double; ``cudaStream_t`` travels as ``c_void_p``).
LAUNCH_ARGS: tuple[str, ...] = ("EvoTensor*", "c_int", "EvoTensor*", "c_int", "c_double*", "c_int", "c_void_p")
LAUNCH_RESTYPE = "c_int"
#: ``evo_workspace_bytes`` (optional): evo_launch's parameters without the stream.
WORKSPACE_ARGS: tuple[str, ...] = LAUNCH_ARGS[:-1]
WORKSPACE_RESTYPE = "c_int64"


def ctype(name: str) -> Any:
    """The ctypes type of a type name of this module's tables (``"c_int64"``, ``"EvoTensor*"``)."""
    if name == "EvoTensor*":
        return ctypes.POINTER(EvoTensor)
    if name.endswith("*"):
        return ctypes.POINTER(getattr(ctypes, name[:-1]))
    return getattr(ctypes, name)


class EvoTensor(ctypes.Structure):
    """``struct EvoTensor`` of evo_abi.h: pointer, dtype code, rank, shape and strides (elements).

    Its ``_fields_`` come from :data:`EVO_TENSOR_FIELDS`."""

    _fields_ = [(n, getattr(ctypes, t) * k if k else getattr(ctypes, t)) for n, t, k in EVO_TENSOR_FIELDS]


class KernelLoadError(RuntimeError):
    """The shared object could not be loaded or lacks ``evo_launch`` (a candidate failure)."""


def dtype_code(dtype: Any) -> int:
    """EvoDType code of a torch dtype (or its name); raises ``ValueError`` naming valid ones."""
    name = str(dtype).removeprefix("torch.")
    try:
        return EVO_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"dtype {name!r} has no EvoDType code; the ABI supports {sorted(EVO_DTYPES)}"
        ) from None


def describe(t: Any) -> EvoTensor:
    """An :class:`EvoTensor` for a tensor-like (pointer, dtype, shape, strides in elements)."""
    shape = tuple(int(s) for s in t.shape)
    strides = tuple(int(s) for s in t.stride())
    if len(shape) > MAX_DIMS:
        raise ValueError(f"tensor of rank {len(shape)} exceeds the ABI's EVO_MAX_DIMS={MAX_DIMS}")
    e = EvoTensor()
    e.data = ctypes.c_void_p(int(t.data_ptr()))
    e.dtype = dtype_code(t.dtype)
    e.ndim = len(shape)
    for i, (s, st) in enumerate(zip(shape, strides)):
        e.shape[i] = s
        e.strides[i] = st
    return e


@dataclass
class KernelLibrary:
    """A loaded candidate: ``launch`` calls its ``evo_launch``; ``last_error`` its runtime's error.

    Workspace (evo_abi.h, "device scratch"): when the candidate exports
    ``evo_workspace_bytes`` and it asks for bytes, :meth:`launch` appends one uint8 tensor
    of that size to the outputs. Callers that time the call make it beforehand with
    :meth:`make_workspace` (the 0xFF fill must not be timed) and pass it in; everyone else
    lets :meth:`launch` make a fresh, poisoned one per call.

    ``last_error()`` calls ``cudaGetLastError`` as the candidate's own CUDA runtime sees it
    (nvcc links cudart statically by default, so the candidate's runtime state is separate
    from torch's). When the symbol is not reachable through the library it returns ``None``
    and the harness relies on device synchronisation and output poisoning instead.
    """

    path: str
    _lib: Any
    _launch: Any
    _get_last_error: Any
    _error_name: Any
    _workspace_bytes: Any = None

    def workspace_bytes(self, inputs: Sequence[Any], outputs: Sequence[Any], scalars: Sequence[float]) -> int:
        """Bytes of scratch the candidate asks for these tensors (0: none or not exported).

        A negative answer means "inputs outside my contract"; it is reported as 0 so that
        ``evo_launch`` itself rejects the inputs with its error code.
        """
        if self._workspace_bytes is None:
            return 0
        ins, n_in, outs, n_out, sc, n_sc = _pack(inputs, outputs, scalars)
        return max(int(self._workspace_bytes(ins, n_in, outs, n_out, sc, n_sc)), 0)

    def make_workspace(self, inputs: Sequence[Any], outputs: Sequence[Any], scalars: Sequence[float]) -> Any:
        """A fresh workspace filled with :data:`WORKSPACE_POISON` on the current stream, or None."""
        n = self.workspace_bytes(inputs, outputs, scalars)
        if n <= 0:
            return None
        import torch

        device = (list(outputs) or list(inputs))[0].device
        return torch.full((n,), WORKSPACE_POISON, dtype=torch.uint8, device=device)

    def launch(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        scalars: Sequence[float],
        stream: int,
        workspace: Any = AUTO,
    ) -> int:
        """Call ``evo_launch`` with EvoTensors describing ``inputs``/``outputs``; returns its code.

        ``workspace``: :data:`AUTO` (default) makes a poisoned one when the kernel asks for
        it; otherwise a tensor from :meth:`make_workspace` (or None when it returned None).
        Raises ``ValueError`` if a given workspace is smaller than the kernel asks for.
        """
        if workspace is AUTO:
            workspace = self.make_workspace(inputs, outputs, scalars)
            if workspace is not None and workspace.is_cuda:
                import torch

                # freed when this returns: keep the block until `stream` has run the kernel
                workspace.record_stream(torch.cuda.ExternalStream(int(stream)))
        elif workspace is not None:
            need = self.workspace_bytes(inputs, outputs, scalars)
            if workspace.numel() < need:
                raise ValueError(f"workspace of {workspace.numel()} bytes, the kernel asks for {need}")
        outs_all = list(outputs) + ([workspace] if workspace is not None else [])
        ins, n_in, outs, n_out, sc, n_sc = _pack(inputs, outs_all, scalars)
        return int(self._launch(ins, n_in, outs, n_out, sc, n_sc, ctypes.c_void_p(int(stream))))

    def last_error(self) -> int | None:
        if self._get_last_error is None:
            return None
        return int(self._get_last_error())

    def error_name(self, code: int) -> str:
        """``cudaGetErrorName`` of the candidate's runtime, or ``cudaError <code>``."""
        if self._error_name is not None:
            try:
                raw = self._error_name(int(code))
                if raw:
                    return raw.decode("ascii", "replace")
            except Exception:  # pragma: no cover - defensive: names are best-effort
                pass
        return f"cudaError {code}"


def _pack(inputs: Sequence[Any], outputs: Sequence[Any], scalars: Sequence[float]) -> tuple[Any, ...]:
    """The ctypes argument arrays (and counts) of evo_launch / evo_workspace_bytes."""
    n_in, n_out, n_sc = len(inputs), len(outputs), len(scalars)
    ins = (EvoTensor * max(n_in, 1))(*[describe(t) for t in inputs])
    outs = (EvoTensor * max(n_out, 1))(*[describe(t) for t in outputs])
    sc = (ctypes.c_double * max(n_sc, 1))(*[float(s) for s in scalars])
    return ins, n_in, outs, n_out, sc, n_sc


def load_kernel(path: str | Path) -> KernelLibrary:
    """dlopen a candidate's .so and bind ``evo_launch``; :class:`KernelLoadError` if impossible."""
    p = str(path)
    try:
        lib = ctypes.CDLL(p, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise KernelLoadError(f"could not load the compiled kernel {Path(p).name}: {e}") from e
    try:
        fn = lib.evo_launch
    except AttributeError:
        raise KernelLoadError(
            "the shared object exports no `evo_launch`; define it with EVO_EXPORT "
            "(extern \"C\") exactly as evo_abi.h declares it"
        ) from None
    fn.argtypes = [ctype(t) for t in LAUNCH_ARGS]
    fn.restype = ctype(LAUNCH_RESTYPE)
    get_err = getattr(lib, "cudaGetLastError", None)
    if get_err is not None:
        get_err.argtypes = []
        get_err.restype = ctypes.c_int
    else:
        log.info("%s: cudaGetLastError not reachable; relying on sync + poison", Path(p).name)
    err_name = getattr(lib, "cudaGetErrorName", None)
    if err_name is not None:
        err_name.argtypes = [ctypes.c_int]
        err_name.restype = ctypes.c_char_p
    ws = getattr(lib, "evo_workspace_bytes", None)
    if ws is not None:
        ws.argtypes = [ctype(t) for t in WORKSPACE_ARGS]
        ws.restype = ctype(WORKSPACE_RESTYPE)
    return KernelLibrary(path=p, _lib=lib, _launch=fn, _get_last_error=get_err, _error_name=err_name,
                         _workspace_bytes=ws)
