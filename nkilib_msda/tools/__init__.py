"""Tools on top of the package: the ``nkilib-msda`` command line (``cli``) and ``check``."""
