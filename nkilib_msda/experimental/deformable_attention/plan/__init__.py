"""Plain-Python plans of the MSDA kernels (no NKI, no emulator): the forward tiling
(``forward_config``) and the backward plan (``backward_config``, with ``backward_tiling`` and
``backward_scatter_plan``). The kernels of the package above emit what these plans decide."""
