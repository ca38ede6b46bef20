"""``NkiTensor.view(dtype)``: "The last dimension must be contiguous in memory", for every dtype
pair (same-size reinterprets included); ``.ap(pattern, dtype=...)`` reinterprets any pattern.

Page: https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/nki/api/generated/nki.language.NkiTensor.html
(``view``, "Constraints").
"""

import numpy as np
import pytest

from nkilib_msda.simulator import nisa, nl

from _core_helpers import in_kernel, raises_rule

_PAIRS = [(nl.float32, nl.int32), (nl.float32, nl.uint32), (nl.int32, nl.float32),
          (nl.float32, nl.bfloat16), (nl.bfloat16, nl.float16), (nl.bfloat16, nl.float32)]


@pytest.mark.parametrize("src, dst", _PAIRS, ids=lambda d: str(d))
@pytest.mark.parametrize("buffer", ["sbuf", "hbm"])
def test_view_rejects_a_strided_last_dim_for_every_dtype_pair(src, dst, buffer):
    def body(a):
        t = nl.ndarray((4, 8), src, buffer=nl.sbuf if buffer == "sbuf" else nl.hbm)
        with raises_rule("view", "last dimension contiguous"):
            t[:, 0:8:2].view(dst)                       # stride 2
        with raises_rule("view", "last dimension contiguous"):
            t[:, 0:1].broadcast(1, 4).view(dst)         # stride 0
        assert t[:, 0:4].view(dst).dtype == dst         # contiguous: accepted
        if dst.itemsize <= src.itemsize:
            assert t[:, 3:4].view(dst).dtype == dst     # size-1 last dim: contiguous
    in_kernel(body, np.zeros(1, np.float32))


def test_view_error_is_one_line_naming_the_rule():
    def body(a):
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        with raises_rule("view", "last dimension contiguous") as err:
            t[:, 1:8:2].view(nl.int32)
        assert "\n" not in str(err.value) and "contiguous in memory" in str(err.value)
    in_kernel(body, np.zeros(1, np.float32))


def test_ap_with_dtype_reinterprets_a_strided_view_bit_exactly():
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    x[1, 3] = np.nan

    def body(a):
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        odd = t[:, 1:8:2]
        bits = odd.ap(odd.get_pattern(), dtype=nl.int32)
        assert bits.shape == (4, 4) and bits.dtype == nl.int32
        out = nl.ndarray((4, 4), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=bits)
        return out

    np.testing.assert_array_equal(in_kernel(body, x), x[:, 1::2].view(np.int32))
