"""Calibration of the timing model against nki-library's hardware-measured latencies
(docs/calibration.md), by job: :mod:`.records` (parsing and deciding the QoR records),
:mod:`.references` (inputs and float64 references per kernel family), :mod:`.runner` (one
subprocess per record, the result cache and recorded graphs), :mod:`.fit` (least squares over
the unknowns; the write path to the calibration data file) and :mod:`.report` (the table).
``benchmarks/calibrate_timing.py`` is the command line. Running records needs an nki-library
checkout (an argument; none of its code is part of this package) and fitting needs SciPy.
"""
