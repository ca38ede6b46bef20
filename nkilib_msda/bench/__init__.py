"""The GPU benchmark harness (``nkilib-msda bench``, ``python benchmarks/bench_gpu.py``): the
shapes (``shapes``), the timing run (``gpu``), its tables and files (``report``) and its bar
chart (``plot``). Needs torch and triton only when it runs."""
