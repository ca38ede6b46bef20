"""The Triton backend for NVIDIA GPUs: the backend module (``backend``), its launch plans
(``plan``), the compiled-kernel launcher (``launch``) and the Triton kernels (``kernels``)."""
