"""Problem types and argument validation, the bottom layer of the package: ``msda``
(multi-scale deformable attention) and ``block_attn_res`` (Block Attention Residuals), with the
facts they share: ``layouts`` (the tensor layouts' dimension orders, the level starts),
``arguments`` (the one positive-int check) and ``arrays`` (the one torch <-> NumPy bridge).

Every backend, kernel and planner takes its arguments from here; nothing here imports NKI or
the emulator, and torch only inside the ``arrays`` functions that take or return a tensor.
"""
