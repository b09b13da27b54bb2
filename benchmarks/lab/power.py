"""SM clock and board power of a GEMM seed against its torch reference under sustained load.

    python benchmarks/lab/power.py gemm_silu_mul_bf16 gemm_silu_mul_bf16:DUAL_MMA=1 gemm_bf16 \
        [--seconds 3] [--out DIR]

Why: at 8192^3 an H200 runs bf16 GEMMs at its board power limit, so the SM clock -- and with it
the tensor-core peak -- is set by the energy each kernel spends per flop, not by the boost
clock the "% of speed-of-light" columns assume. This script says, for our seed and for the
torch reference of the same task on the same inputs, how fast each ran, at which clock and
power, and what fraction of the tensor-core peak *at that clock* it reached:

    pipe efficiency = achieved flop/s / (#SMs x 4096 bf16 flop/clk x measured SM clock)

(4096 dense bf16 flop per SM per clock: 989.4 TFLOP/s at 1830 MHz on 132 SMs, the H200's data
sheet peak). A kernel near 100% there is limited by the clock; only less energy per flop (or a
higher power limit) makes it faster.

Per task (its first benchmark shape unless --shape-index): the seed is compiled exactly as a
search builds it (``TASK:NAME=VALUE,NAME=VALUE`` adds tunables to its defaults), then ours and the reference
each run back to back for ``--seconds`` after a one-second warm-up of their own, while
``nvidia-smi --query-gpu=clocks.sm,power.draw,... -lms 20`` samples in the background; a loop's
statistics use only the samples that fall inside it. Inputs are the task's own generator; no L2
flush (sustained throughput of multi-millisecond kernels is the point). Times are loop wall time
/ calls (CUDA events), not the evaluator's per-call medians: use ``evo bench`` for speedups.
A table is printed last and written to ``DIR/power.md``; raw samples to ``DIR/power.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("benchmarks.lab.power")

#: Dense bf16 tensor-core flop per SM per clock on Hopper (H100/H200 data sheet: 989.4 TFLOP/s
#: at 1830 MHz on 132 SMs).
FLOP_PER_SM_CLK = 4096
QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


class Sampler:
    """``nvidia-smi -lms`` in the background; ``samples(t0, t1)`` returns (clock MHz, W, reasons)
    of the rows stamped inside [t0, t1] (host wall clock, seconds since the epoch)."""

    def __init__(self, period_ms: int, device: int) -> None:
        self._file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        self._proc = subprocess.Popen(
            ["nvidia-smi", f"--id={device}", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
             f"-lms={period_ms}"], stdout=self._file, stderr=subprocess.DEVNULL)

    def stop(self) -> list[tuple[float, float, float, str]]:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._file.close()
        rows = parse_rows(Path(self._file.name).read_text())
        os.unlink(self._file.name)
        return rows


def parse_rows(text: str) -> list[tuple[float, float, float, str]]:
    """(epoch seconds, SM clock MHz, power W, event reasons) of each well-formed row of
    ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` output; other lines (a
    "[N/A]" value, a partial last line) are skipped."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            # nvidia-smi stamps "YYYY/MM/DD HH:MM:SS.mmm" in local time
            stamp, _, frac = parts[0].partition(".")
            t = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + (float("0." + frac) if frac else 0.0)
            rows.append((t, float(parts[1]), float(parts[2]), parts[3]))
        except ValueError:
            log.debug("unparsed nvidia-smi row: %r", line)
    return rows


def _loop(fn, seconds: float, stream) -> tuple[int, float, float, float]:
    """Run ``fn`` back to back for about ``seconds``; (calls, ms per call, t0, t1 host wall)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.time()
    start.record(stream)
    calls = 0
    while True:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
        if time.time() - t0 >= seconds:
            break
    end.record(stream)
    end.synchronize()
    return calls, start.elapsed_time(end) / calls, t0, time.time()


def summary(rows, t0: float, t1: float) -> dict:
    """Sample count, median clock and power, and the event reasons seen, of the rows of
    :func:`parse_rows` stamped inside [t0, t1]."""
    inside = [r for r in rows if t0 <= r[0] <= t1]
    if not inside:
        return {"samples": 0}
    reasons = sorted({r[3] for r in inside})
    return {"samples": len(inside), "clock_mhz": statistics.median(r[1] for r in inside),
            "power_w": statistics.median(r[2] for r in inside), "event_reasons": reasons}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="TASK or TASK:NAME=VALUE[,NAME=VALUE...] (seed tunables)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--shape-index", type=int, default=0)
    ap.add_argument("--period-ms", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/power")))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from benchmarks.lab.probe import _candidate, _compile_all, parse_variant, seed_and_reference

    variants = [parse_variant(item) for item in args.variants]
    import torch

    from evo.tasks.registry import get_task

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/lab/power.py needs a CUDA GPU (none visible to torch)")
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    stream = torch.cuda.current_stream()
    results = []
    # all builds before the sampler starts: they are the slow part
    outcomes = _compile_all([_candidate(n, "seed", p) for n, p in variants], len(variants))
    so_dir = tempfile.TemporaryDirectory(prefix="evo-power-")
    sampler = Sampler(args.period_ms, torch.cuda.current_device())
    try:
        for (name, tunables), outcome in zip(variants, outcomes):
            task = get_task(name)
            if not outcome.ok:
                raise SystemExit(f"{name}: seed failed to compile: {outcome.result.reason}")
            so = Path(so_dir.name) / f"{len(results)}_{name}.so"
            so.write_bytes(outcome.so_bytes)
            shape = dict(task.shapes[args.shape_index])
            ours, torch_ref = seed_and_reference(name, so, shape, dev)
            flops = float(task.flops(shape))
            row = {"task": name, "shape": shape, "params": tunables}
            with torch.no_grad():
                for side, fn in (("ours", ours), ("torch", torch_ref)):
                    _loop(fn, 1.0, stream)                      # warm-up: clocks settle
                    calls, ms, t0, t1 = _loop(fn, args.seconds, stream)
                    row[side] = {"calls": calls, "ms": ms, "tflops": flops / ms / 1e9, "t0": t0, "t1": t1}
                    log.info("%s %s: %d calls, %.4f ms", name, side, calls, ms)
            results.append(row)
            ours = torch_ref = fn = None   # the calls hold this task's tensors: free them before the next one
            torch.cuda.empty_cache()
    finally:
        rows = sampler.stop()
        so_dir.cleanup()

    lines = ["| task | side | ms/call | TFLOP/s | SM clock MHz | power W | peak at clock TFLOP/s | "
             "pipe efficiency | clock event reasons |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        label = r["task"] + "".join(f" {k}={v}" for k, v in r["params"].items())
        for side in ("ours", "torch"):
            s = r[side]
            s.update(summary(rows, s["t0"], s["t1"]))
            if s["samples"]:
                peak = sms * FLOP_PER_SM_CLK * s["clock_mhz"] * 1e6 / 1e12
                s["peak_tflops_at_clock"] = peak
                lines.append(f"| {label} | {side} | {s['ms']:.4f} | {s['tflops']:.1f} | {s['clock_mhz']:.0f} | "
                             f"{s['power_w']:.0f} | {peak:.0f} | {100 * s['tflops'] / peak:.1f}% | "
                             f"{' '.join(s['event_reasons'])} |")
            else:
                lines.append(f"| {label} | {side} | {s['ms']:.4f} | {s['tflops']:.1f} | - | - | - | - | no samples |")
    table = "\n".join(lines) + "\n"
    (args.out / "power.md").write_text(table)
    (args.out / "power.json").write_text(json.dumps({"results": results, "samples": rows}, indent=1))
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
