"""The reference backend: PyTorch ops on any device (``backend``), with its CPU formulation
(``_cpu_sampling``, run on the serial pool threads of ``_cpu_workers``)."""
