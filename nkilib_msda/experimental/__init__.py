"""NKI kernels (beta-2 ``nki`` API), mirroring ``nkilib.experimental``."""
