#!/usr/bin/env python3
"""Where a process's CPU went, by kind of operation, from a `perf record` profile.

    perf record -F 299 -o perf.data -- kart bench model --runs 3 --steps 1
    perf script -i perf.data -F comm,time | awk '{print $1, int($2)}' | uniq -c   # find a window
    python3 scripts/bench/perf_breakdown.py perf.data kart START,END

Prints each kind's share of the samples of the processes named COMM within the time window
(seconds, as `perf report --time` takes them): the matrix products' kernels, the packing of
weights into their layout, OpenMP threads waiting, attention, sampling, element-wise operations,
the kernel and the rest. The README's per-operation table of `kart bench model` is these shares
times a decoding step's wall time.
"""

import re
import subprocess
import sys

ELEMENTWISE = re.compile(
    r"mul_kernel|add_kernel|silu|Sleef|copy_kernel|fill_kernel|rsqrt|pow|mean|sum|reduce|cat|index|neg|where|masked|Vectorized"
)


def kind(dso: str, sym: str) -> str:
    """The kind of operation a sampled symbol of `dso` belongs to."""
    if "mkl" in sym and ("scopy" in sym or "pack" in sym.lower()):
        return "packing weights (MKL copies)"
    if "gemm" in sym.lower() or "[JIT]" in dso or "dnnl" in sym or "inner_product" in sym:
        return "matrix products (MKL, oneDNN kernels)"
    if "flash_attention" in sym or "_softmax" in sym and "log_softmax" not in sym:
        return "attention"
    if "argmax" in sym or "topk" in sym or "log_softmax" in sym:
        return "sampling (argmax, log-softmax)"
    if "libgomp" in dso:
        return "OpenMP threads waiting"
    if "kernel.kallsyms" in dso:
        return "kernel (page faults, scheduling)"
    if ELEMENTWISE.search(sym):
        return "element-wise operations, copies, reductions"
    if "python" in dso:
        return "Python interpreter"
    return "dispatch, allocation, the rest"


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    data, comm, window = sys.argv[1:]
    report = subprocess.run(
        ["perf", "report", "-i", data, "--comm", comm, "--time", window, "--sort", "dso,sym", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shares: dict[str, float] = {}
    for line in report.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\[JIT\] tid \d+|\S+)\s+\[[.k]\]\s+(.*)", line)
        if m:
            share, dso, sym = float(m.group(1)), m.group(2), m.group(3)
            shares[kind(dso, sym)] = shares.get(kind(dso, sym), 0.0) + share
    total = sum(shares.values()) or 1.0
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"{100 * share / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
