"""``address=`` reuse kernels (nki-library's SbufManager/PSUM-bank idiom): tiles placed at
the same address are one allocation, so a kernel that cycles through a few placed buffers
fits the SBUF budget, and its results are those of NumPy.
Page: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/
nki.language.ndarray.html (``address``); docs/emulator.md, "Memory, hazards and strict mode".
"""

import numpy as np

from nkilib_msda.simulator import nisa, nl

from _isa_helpers import run

RNG = np.random.default_rng(14)
KIB = 1024
PSUM_BANK = 2 * KIB


def test_ping_pong_placed_buffers_over_many_iterations():
    a = RNG.standard_normal((6, 128, 512)).astype(np.float32)

    def body(h):
        out = nl.ndarray((6, 128, 512), nl.float32, buffer=nl.shared_hbm)
        keep = []  # every buffer stays referenced, as in a kernel that keeps them in a dict
        for k in range(6):
            # 6 x 96 KiB/partition would not fit unplaced; two ping-pong addresses do.
            buf = nl.ndarray((128, 512 * 48), nl.float32, buffer=nl.sbuf,
                             address=(0, (k % 2) * 96 * KIB))
            keep.append(buf)
            view = buf[:, 0:512]
            nisa.dma_copy(dst=view, src=h[k])
            acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum,
                             address=(0, (k % 4) * PSUM_BANK))
            nisa.tensor_scalar(dst=acc, data=view, op0=nl.multiply, operand0=float(k + 1))
            res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, address=(0, 200 * KIB))
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[k], src=res)
        return out

    expected = a * np.arange(1, 7, dtype=np.float32)[:, None, None]
    out, rep = run(body, a, report=True)
    np.testing.assert_array_equal(out, expected)
    assert rep.peak_sbuf_bytes_per_partition == (2 * 96 + 2) * KIB
