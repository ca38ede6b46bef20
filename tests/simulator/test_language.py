"""nl helpers: ds, ranges, tile_size, load/store, device_print, no_reorder, enums, namespaces."""

import numpy as np

from nkilib_msda.simulator import nisa, nki, nl, simulate
from nkilib_msda import _nki

from _core_helpers import in_kernel, raises_rule


def test_ds_and_ranges():
    assert nl.ds(4, 3) == slice(4, 7, 1)
    assert list(nl.affine_range(3)) == [0, 1, 2]
    assert list(nl.sequential_range(1, 7, 3)) == [1, 4]
    assert list(nl.static_range(2)) == [0, 1] and list(nl.range(0)) == []
    assert nl.ds(3, 0) == slice(3, 3, 1)  # empty shard ranges, as nki-library builds them
    with raises_rule("ds", "range"):
        nl.ds(0, -1)
    with raises_rule("ds", "start"):
        nl.ds(1.0, 2)


def test_tile_size_constants():
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_bank_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax,
            ts.psum_num_banks) == (128, 512, 128, 512, 8)
    assert ts.total_available_sbuf_size == ts.sbuf_fmax_bytes == 212_992  # trn2 default


def test_load_store_wrappers(capsys):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    def body(a):
        t = nl.load(a, dtype=nl.int32)
        nl.device_print("tile:", t)
        with nl.no_reorder():
            o = nl.ndarray((2, 3), nl.int32, buffer=nl.shared_hbm)
            nl.store(o, t)
        with raises_rule("dma_copy", "DMA PSUM access"):
            nl.store(o, nl.ndarray((2, 3), nl.int32, buffer=nl.psum))
        return o

    out, rep = in_kernel(body, x, report=True)
    assert out.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert "tile:" in capsys.readouterr().out
    assert rep.instruction_count("dma", "dma_copy") == 2


def test_enums_and_namespaces():
    assert nisa.engine.vector.name == "vector" and nisa.engine.activation is nisa.engine.scalar
    assert {m.name for m in nisa.oob_mode} == {"error", "skip"}
    assert {m.name for m in nisa.dge_mode} == {"unknown", "none", "swdge", "hwdge"}
    assert nisa.reduce_cmd.reset_reduce.name == "reset_reduce"
    assert nki.language is nl and nki.isa is nisa and nki.simulate is simulate
    assert repr(nl.sbuf) == "nl.sbuf"
    assert _nki.backend_name() == "nkilib_msda emulator" and _nki.nl is nl


def test_get_nc_version_follows_target():
    def body(a):
        assert nisa.get_nc_version() == nisa.nc_version.gen4
    in_kernel(body, np.zeros(1, np.float32), target="trn3")
