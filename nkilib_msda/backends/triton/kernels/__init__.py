"""Triton kernels for MSDA (imported only when triton is installed).

- ``sampling``: the shared per-sample bilinear setup (``@triton.jit`` helpers).
- ``forward``: the query-block forward kernel.
- ``backward``: the backward kernel (atomic grad_value, or deterministic entries) and the
  deterministic per-row gather-reduce kernel.
"""
