"""Problem types and argument validation, the bottom layer of the package: ``msda``
(multi-scale deformable attention) and ``block_attn_res`` (Block Attention Residuals).

Every backend, kernel and planner takes its arguments from here; nothing here imports NKI,
the emulator or torch.
"""
