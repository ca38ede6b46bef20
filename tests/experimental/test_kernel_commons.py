"""kernel_commons: one definition of the hardware facts; core_info / core_barrier."""

from __future__ import annotations

import types

import pytest

import nkilib_msda._nki as nki_mod
from nkilib_msda import hardware
from nkilib_msda.experimental import kernel_commons as kc
from nkilib_msda.experimental.block_attn_res import tiling
from nkilib_msda.experimental.deformable_attention.plan import backward_config, forward_config


def test_planners_share_the_facts():
    assert forward_config.PARTITIONS is kc.PARTITIONS == backward_config.PARTITIONS == 128
    assert forward_config.FP32_EXACT_INT_MAX == backward_config.FP32_EXACT_INT_MAX == 2 ** 24
    assert forward_config.PSUM_BANK_BYTES == backward_config.PSUM_BANK_BYTES == 2048
    assert tiling.PSUM_BANK_FP32 == kc.PSUM_BANK_FP32 == 512
    assert tiling.PLANNER_SBUF_BUDGET is kc.PLANNER_SBUF_BUDGET is hardware.PLANNER_SBUF_BUDGET
    assert backward_config.TRN2_SBUF_BUDGET == forward_config.TRN2_SBUF_BUDGET \
        == hardware.PLANNER_SBUF_BUDGET["trn2"] == 204_800
    assert kc.DTYPE_BYTES is hardware.DTYPE_BYTES
    for table in (forward_config.DTYPE_BYTES, tiling.DTYPE_BYTES, backward_config.DTYPE_BYTES):
        assert all(kc.DTYPE_BYTES[k] == v for k, v in table.items())


class _FakeNl:
    def __init__(self, programs, program, ndim, raise_without_grid=False):
        self._programs, self._program, self._ndim = programs, program, ndim
        self._raise = raise_without_grid

    def program_ndim(self):
        return self._ndim

    def num_programs(self, axes=None):
        if self._raise and self._ndim == 0:
            raise RuntimeError("no grid")
        return self._programs

    def program_id(self, axis=0):
        if self._raise and self._ndim == 0:
            raise RuntimeError("no grid")
        return self._program


@pytest.mark.parametrize("fake,want", [
    (_FakeNl(2, 1, 0), (2, 1)),          # env-var LNC 2: no grid, yet two cores
    (_FakeNl(2, 0, 1), (2, 0)),          # bracket launch
    (_FakeNl(1, 0, 0), (1, 0)),          # LNC 1
])
def test_core_info(monkeypatch, fake, want):
    monkeypatch.setattr(nki_mod, "nl", fake)
    assert kc.core_info() == want


def test_core_info_has_no_pre_07_fallback(monkeypatch):
    """NKI 0.7+ documents num_programs() without a grid (1 without LNC): a front end that
    refuses it is not supported, so the error propagates (issue 29: unreachable fallback)."""
    monkeypatch.setattr(nki_mod, "nl", _FakeNl(1, 0, 0, raise_without_grid=True))
    with pytest.raises(RuntimeError, match="no grid"):
        kc.core_info()


def test_core_info_rejects_impossible_launches(monkeypatch):
    monkeypatch.setattr(nki_mod, "nl", _FakeNl(3, 0, 1))
    with pytest.raises(ValueError, match="degree 1 or 2"):
        kc.core_info()


def test_core_barrier_prefers_nki_lnc(monkeypatch):
    calls = []
    lnc = types.SimpleNamespace(core_barrier=lambda **kw: calls.append(("lnc", kw)))
    isa = types.SimpleNamespace(core_barrier=lambda **kw: calls.append(("isa", kw)))
    monkeypatch.setattr(nki_mod, "nki", types.SimpleNamespace(lnc=lnc))
    monkeypatch.setattr(nki_mod, "nisa", isa)
    kc.core_barrier("buf", 2)
    kc.core_barrier("buf", 1)            # LNC 1: nothing issued
    assert calls == [("lnc", {"data": "buf", "cores": (0, 1)})]
    monkeypatch.setattr(nki_mod, "nki", types.SimpleNamespace())   # an nki without nki.lnc
    kc.core_barrier("buf", 2)
    assert calls[-1] == ("isa", {"data": "buf", "cores": (0, 1)})


def test_usable_sbuf_bytes_reads_sbuf_fmax_bytes_only(monkeypatch):
    new = types.SimpleNamespace(tile_size=types.SimpleNamespace(sbuf_fmax_bytes=1234,
                                                                total_available_sbuf_size=99))
    monkeypatch.setattr(nki_mod, "nl", new)
    assert kc.usable_sbuf_bytes() == 1234
    old = types.SimpleNamespace(tile_size=types.SimpleNamespace(total_available_sbuf_size=99))
    monkeypatch.setattr(nki_mod, "nl", old)   # the deprecated name alone is not read
    with pytest.raises(AttributeError):
        kc.usable_sbuf_bytes()


def test_kernel_budget_is_the_running_targets_usable_sbuf_minus_the_one_reserve(monkeypatch):
    usable = 212_992
    monkeypatch.setattr(nki_mod, "nl", types.SimpleNamespace(
        tile_size=types.SimpleNamespace(sbuf_fmax_bytes=usable)))
    assert kc.kernel_sbuf_budget() == usable - hardware.PLANNER_SBUF_RESERVE_BYTES \
        == hardware.PLANNER_SBUF_BUDGET["trn2"]
