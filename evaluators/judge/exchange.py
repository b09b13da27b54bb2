"""The exchange: memory the judge owns and a runner maps, one buffer per tensor.

Each input and output of a call lives in a buffer of its own, allocated by the judge for that
tensor alone, so mapping it shows the runner that tensor and nothing else: no reference
output, no other candidate's data, no allocator neighbour. The judge writes inputs and poison
into the buffers, the runner's candidate writes outputs, and the judge reads them back, all
without any copy through the runner.

Two backends (:class:`Exchange`):

- :class:`IpcExchange` (GPU): each buffer is one ``cuMemAlloc`` of the judge's context, and
  the runner opens it by its CUDA IPC handle. The judge poisons outputs, writes inputs and
  flushes the L2 on the same device memory the candidate reads, right before each call, so
  no step the timing relies on happens inside the candidate's process.
- :class:`HostExchange` (the CPU stand-in of the tests): each buffer is a file in a
  directory the runner may open, mapped shared by both processes.

Why not staging through shared host memory on the GPU: the runner would then copy inputs to
its own device memory, and the last write to the inputs before a timed call (which leaves them
in L2 unless something flushes afterwards) would happen in the candidate's process, where no
flush can be trusted.
"""

from __future__ import annotations

import abc
import ctypes
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluators import protocol

__all__ = ["Buffer", "Exchange", "HostExchange", "IpcExchange", "ExchangeError"]


class ExchangeError(RuntimeError):
    """The judge could not allocate or share a buffer: our failure, never the candidate's."""


@dataclass(eq=False)
class Buffer:
    """One judge-owned allocation shared with runners.

    ``view(dtype, shape)`` is a contiguous tensor at the start of the buffer (the judge's
    handle on it); ``map_line()`` is the runner's ``MAP`` command for it.
    """

    buf: int
    nbytes: int
    _raw: Any = field(repr=False)          # uint8 tensor over the whole buffer
    _map: str = field(repr=False)
    _keep: Any = field(default=None, repr=False)

    def view(self, dtype: Any, shape: tuple[int, ...]) -> Any:
        import torch

        n = 1
        for s in shape:
            n *= int(s)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if n * itemsize > self.nbytes:
            raise ExchangeError(f"buffer {self.buf} holds {self.nbytes} bytes, a {tuple(shape)} "
                                f"{dtype} view needs {n * itemsize}")
        return self._raw[: n * itemsize].view(dtype).view(tuple(int(s) for s in shape))

    def map_line(self) -> str:
        return self._map


class Exchange(abc.ABC):
    """Allocates buffers a runner can map. Called by the judge only, one thread at a time.

    ``backend`` names the runner backend that can map these buffers (``cuda`` or ``host``);
    ``device`` is where the judge's views of them live. :meth:`alloc` raises
    :class:`ExchangeError` when memory is short (our failure); :meth:`free` releases a buffer
    that no live runner maps any more.
    """

    backend: str
    device: Any

    def __init__(self) -> None:
        self._next = 0
        self._free_ids: list[int] = []
        self.live_bytes = 0

    def _id(self) -> int:
        """The smallest free buffer id: ids stay below the number of live buffers (a
        runner accepts a bounded range)."""
        if self._free_ids:
            self._free_ids.sort()
            return self._free_ids.pop(0)
        self._next += 1
        return self._next

    def _release_id(self, bid: int) -> None:
        self._free_ids.append(bid)

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> Buffer: ...

    @abc.abstractmethod
    def free(self, b: Buffer) -> None: ...


class HostExchange(Exchange):
    """Buffers as files in ``directory`` (mapped shared): the CPU stand-in's exchange."""

    backend = "host"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__()
        import torch

        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.device = torch.device("cpu")

    def alloc(self, nbytes: int) -> Buffer:
        import torch

        n = max(int(nbytes), 1)
        bid = self._id()
        path = self.dir / f"buf{bid}.bin"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, n)
            mm = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=n)
        self.live_bytes += n
        return Buffer(bid, n, raw, protocol.map_host(bid, str(path), n), (mm, path))

    def free(self, b: Buffer) -> None:
        mm, path = b._keep
        b._raw = None
        try:
            mm.close()
        except BufferError:   # a view is still alive somewhere; the file goes anyway
            pass
        Path(path).unlink(missing_ok=True)
        self.live_bytes -= b.nbytes
        self._release_id(b.buf)


class _CudaArray:
    """``__cuda_array_interface__`` over raw device memory, so torch can view it."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


class IpcExchange(Exchange):
    """Buffers as single ``cuMemAlloc`` allocations of the current CUDA context, shared by
    IPC handle. The caller has made torch's context current on this thread (any CUDA
    operation does)."""

    backend = "cuda"

    def __init__(self) -> None:
        super().__init__()
        import torch

        self.device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.synchronize()   # the primary context exists and is current
        try:
            self._cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise ExchangeError(f"the CUDA driver library cannot be loaded ({e})") from e
        # torch's (primary) context, made current again on whichever thread allocates later
        self._ctx = ctypes.c_void_p()
        self._check(self._cu.cuCtxGetCurrent(ctypes.byref(self._ctx)), "cuCtxGetCurrent")
        if not self._ctx.value:
            raise ExchangeError("no CUDA context is current after torch initialised CUDA")

    def _current(self) -> None:
        self._check(self._cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self._cu.cuGetErrorName(rc, ctypes.byref(name))
            msg = name.value.decode() if name.value else f"CUresult {rc}"
            raise ExchangeError(f"{what} failed: {msg}")

    def alloc(self, nbytes: int) -> Buffer:
        import torch

        n = max(int(nbytes), 1)
        self._current()
        ptr = ctypes.c_uint64()
        self._check(self._cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)), f"cuMemAlloc of {n} bytes")
        handle = (ctypes.c_char * 64)()
        try:
            self._check(self._cu.cuIpcGetMemHandle(ctypes.byref(handle), ptr), "cuIpcGetMemHandle")
        except ExchangeError:
            self._cu.cuMemFree_v2(ptr)
            raise
        raw = torch.as_tensor(_CudaArray(ptr.value, n), device=self.device)
        bid = self._id()
        self.live_bytes += n
        return Buffer(bid, n, raw, protocol.map_ipc(bid, bytes(handle), n), ptr)

    def free(self, b: Buffer) -> None:
        import torch

        torch.cuda.synchronize()
        b._raw = None
        self._current()
        self._cu.cuMemFree_v2(b._keep)
        self.live_bytes -= b.nbytes
        self._release_id(b.buf)
