"""GPU benchmark entry point; the implementation lives in ``nkilib_msda.bench_gpu``.

    python benchmarks/bench_gpu.py --out bench_out
    python benchmarks/bench_gpu.py --shapes ddetr_enc,bev_tsa --dtypes bfloat16 --modes fwd
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nkilib_msda.bench_gpu import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
