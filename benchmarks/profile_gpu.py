"""One forward and one backward launch of the Triton kernels for Nsight Compute.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        -k regex:msda -c 2 python benchmarks/profile_gpu.py --shape ddetr-encoder --dtype bfloat16
"""

import argparse

import torch

from bench_gpu import SHAPES, make_inputs, shape_name
from nkilib_msda.backends.triton import backend as tb
from nkilib_msda.validation.msda import validate_msda_args

parser = argparse.ArgumentParser()
parser.add_argument("--shape", default="ddetr-encoder", type=shape_name, choices=list(SHAPES))
parser.add_argument("--dtype", default="bfloat16")
args = parser.parse_args()
shape = SHAPES[args.shape]
value, loc, attn, grad = make_inputs(shape, getattr(torch, args.dtype))
problem = validate_msda_args(value, shape.levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
tb.msda_forward(value, problem, loc, attn)
tb.msda_backward(grad, value, problem, loc, attn, deterministic=False)
torch.cuda.synchronize()
print(tb.plan_launch(problem, args.dtype))
