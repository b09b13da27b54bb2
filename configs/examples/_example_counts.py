"""Helpers shared by the example task files (a task file may import modules next to it)."""


def rowwise_bytes(shape, *, in_bytes: int, out_bytes_per_row: int) -> float:
    """Compulsory DRAM traffic of a row-wise reduction: read x[R, C] once, write one value a row."""
    return float(in_bytes * shape["R"] * shape["C"] + out_bytes_per_row * shape["R"])
