"""Draw the GPU benchmark's bar chart from one run's ``results.json`` (benchmarks/bench_gpu.py).

    python benchmarks/bench_plot.py RESULTS_JSON [PNG]      (PNG default: bench_gpu.png beside it)

The drawing ships in the package (:mod:`nkilib_msda.bench.plot`).
"""

from __future__ import annotations

import sys

from nkilib_msda.bench.plot import main

if __name__ == "__main__":
    sys.exit(main())
