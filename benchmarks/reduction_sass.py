"""Which reduction instructions the backward kernels compile to on sm_90 (no GPU needed).

    python benchmarks/reduction_sass.py [--dtype float32|bfloat16] [--shape ddetr-encoder]

Compiles the fast-mode backward of the default launch plan (the all-samples kernel) and the
points kernel for an H100/H200 target with the installed Triton, then counts the global
reduction/atomic instructions in the PTX and, with the ``cuobjdump`` that Triton's wheel
carries, in the SASS. Triton 3.6 writes ``atom.global.gpu.relaxed.add.v4.f32`` whose result is
unused, which ptxas turns into ``REDG.E.ADD.F32x4`` (a 16-byte reduction); newer Triton writes
``red.global...v4.f32`` directly.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter


_POINTER_ARGS = {"grad_out_ptr": "io", "value_ptr": "io", "loc_ptr": "io", "attn_ptr": "io",
                 "shapes_ptr": "i32", "starts_ptr": "i32", "grad_value_ptr": "fp32",
                 "grad_loc_ptr": "io", "grad_attn_ptr": "io", "key_ptr": "i32",
                 "coef_ptr": "fp32", "out_ptr": "io"}


def compile_for_sm90(kernel, kwargs: dict, io_type: str):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constants = {k: v for k, v in kwargs.items() if k in kernel.arg_names}
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in _POINTER_ARGS:
            kind = _POINTER_ARGS[name]
            signature[name] = "*" + (io_type if kind == "io" else kind)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr" if name in constants else "i32"
    options = {"num_warps": kwargs["num_warps"], "num_stages": kwargs.get("num_stages", 1)}
    return triton.compile(ASTSource(kernel, signature, constants, attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def sass_of(compiled) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout


def main(argv=None) -> int:
    import triton

    from nkilib_msda.backends.triton import backend as tb
    from bench_gpu import SHAPES, shape_name
    from nkilib_msda.validation.msda import MSDAProblem

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--shape", default="ddetr-encoder", type=shape_name, choices=list(SHAPES))
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    starts = [sum(h * w for h, w in shape.levels[:i]) for i in range(len(shape.levels))]
    problem = MSDAProblem(batch=shape.batch, num_queries=shape.num_queries, num_heads=shape.heads,
                          head_dim=shape.channels, num_levels=len(shape.levels),
                          num_points=shape.points, spatial_shapes=shape.levels,
                          level_start_index=tuple(starts), value_layout="BLNC",
                          sampling_locations_layout="BQHLP2", align_corners=False,
                          padding_mode="zeros")
    plan = tb.plan_launch(problem, args.dtype)
    io_type = "fp32" if args.dtype == "float32" else "bf16"
    print(f"triton {triton.__version__}, {args.shape} {args.dtype}, target sm_90")
    pattern = re.compile(r"\b((?:red|atom)\.global[\w.]*|(?:REDG|ATOMG|RED|ATOM)\.[\w.]+)")
    for label, kernel_plan in (("samples (fast default)", plan),
                               ("points", tb.with_configs(plan, backward_kernel="points"))):
        kernel, _grid, _scalars, kwargs = tb._backward_launch(problem, kernel_plan,
                                                              (True, True, True), False)
        compiled = compile_for_sm90(kernel, kwargs, io_type)
        ptx = Counter(pattern.findall(compiled.asm["ptx"]))
        sass = Counter(pattern.findall(sass_of(compiled)))
        print(f"{label}: PTX {dict(ptx)}; SASS {dict(sass)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
