"""One forward and one backward launch of the Triton kernels for Nsight Compute.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        -k regex:msda -c 2 python benchmarks/profile_gpu.py --shape ddetr-encoder --dtype bfloat16
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from nkilib_msda.backends import triton_backend as tb  # noqa: E402
from nkilib_msda.bench_gpu import SHAPES, make_inputs, shape_name  # noqa: E402
from nkilib_msda.validation import validate_msda_args  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--shape", default="ddetr-encoder", type=shape_name, choices=list(SHAPES))
parser.add_argument("--dtype", default="bfloat16")
args = parser.parse_args()
shape = SHAPES[args.shape]
value, loc, attn, grad = make_inputs(shape, getattr(torch, args.dtype))
problem = validate_msda_args(value, shape.levels, None, loc, attn)
tb.msda_forward(value, problem, loc, attn)
tb.msda_backward(grad, value, problem, loc, attn, deterministic=False)
torch.cuda.synchronize()
print(tb.plan_launch(problem, args.dtype))
