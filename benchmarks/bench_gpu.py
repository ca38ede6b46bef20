"""GPU benchmark: our Triton MSDA vs the grid_sample reference vs the Deformable-DETR CUDA op.

``python benchmarks/bench_gpu.py [ARGS]`` = ``nkilib-msda bench [ARGS]``: the harness ships in
the package (:mod:`nkilib_msda.bench.gpu`); the scripts beside this one import its names from
here.
"""

from __future__ import annotations

import sys

from nkilib_msda.bench.gpu import _load_cuda_op, add_cuda_op_dir, main  # noqa: F401
from nkilib_msda.bench.shapes import SHAPES, BenchShape, make_inputs, shape_name  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
