"""Every documented NKI 0.8 name resolves in the emulator (implemented or a "not modelled"
stand-in, never AttributeError), enum members have the documented numeric values, and
deprecated names warn.

The name lists are taken from the documentation pages cited above each group (base
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/ unless a version is named).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from nkilib_msda.simulator import NkiError, nki, nl, nisa, simulate
from nkilib_msda.simulator import lnc as nki_lnc

# nki/api/nki.html: the top-level entry points.
NKI_NAMES = ["jit", "simulate", "language", "isa", "lnc", "dtype", "typing", "compiler"]

# v2.33.1 nki/api/nki.compiler.html: the per-kernel configuration classes.
COMPILER_NAMES = ["CompileConfig", "SpecializationConfig", "AddressRotation"]

# nki/api/nki.language.html and _modules/nki/language.html (v2.33.0): memory regions, dtypes,
# tile sizes, creation, math, reductions, loops, launch queries.
NL_NAMES = """
DType bool_ int8 int16 int32 uint8 uint16 uint32 float16 float32 bfloat16 tfloat32 float8_e4m3
float8_e4m3fn float8_e5m2 float8_e8m0fnu int64 uint64 float8_e5m2_x4 float8_e4m3fn_x4
float4_e2m1fn_x4 sbuf psum hbm private_hbm shared_hbm tile_size average prelu bypass
MemoryRegion NKIObject NkiTensor is_hbm is_on_chip is_psum is_sbuf add subtract multiply divide
maximum minimum abs_max abs_min abs square power equal not_equal less less_equal greater
greater_equal bitwise_and bitwise_or bitwise_xor invert left_shift right_shift logical_and
logical_or logical_xor logical_not exp log sqrt rsqrt tanh sigmoid relu gelu gelu_apprx_sigmoid
gelu_apprx_tanh gelu_dx gelu_apprx_sigmoid_dx silu silu_dx softplus mish erf erf_dx reciprocal
copy sin cos tan arctan ceil floor trunc negative sign fmod mod sum max min mean prod var all
softmax rms_norm where dropout ones full zeros_like empty_like random_seed expand_dims
broadcast_to transpose matmul no_reorder load_transpose2d gather_flattened ds affine_range
sequential_range static_range fori_loop while_loop ndarray zeros load store program_id
num_programs program_ndim shared_constant shared_identity_matrix device_print rand
""".split()

# nki/api/nki.isa.html (instruction list, config enums, target) and _modules/nki/isa.html;
# scalar values: nki/api/generated/nki.isa.scalar_load.html, scalar_store, NkiScalar.
ISA_NAMES = """
nc_matmul nc_matmul_mx nc_transpose activation activation_reduce tensor_reduce
tensor_partition_reduce tensor_tensor tensor_tensor_scan scalar_tensor_tensor tensor_scalar
tensor_scalar_reduce tensor_scalar_cumulative tensor_copy tensor_copy_predicated exponential
reciprocal quantize_mx iota dropout affine_select range_select select_reduce sequence_bounds
memset bn_stats bn_aggr local_gather nc_n_gather dma_copy dma_transpose dma_compute max8
nc_find_index8 nc_match_replace8 nc_stream_shuffle register_alloc register_load register_move
register_store core_barrier sendrecv sendrecv_compute rng rand2 rand_set_state rand_get_state
set_rng_seed nonzero_with_count topk activate2 engine dma_engine reduce_cmd dge_mode oob_mode
matmul_perf_mode nc_version get_nc_version get_nc_sub_version NkiValidationError NkiScalar
scalar_load scalar_store constants vector_engine scalar_engine gpsimd_engine unknown_engine
""".split()

# nki/api/nki.lnc.html
LNC_NAMES = ["core_barrier", "sendrecv", "sendrecv_compute"]

# _modules/nki/isa.html (latest and v2.33.0) and the published nki/api/nki/isa stubs.
ENUM_VALUES = {
    "engine": {"unknown": 0, "tensor": 1, "scalar": 2, "gpsimd": 3, "dma": 4, "vector": 5,
               "sync": 6},
    "dge_mode": {"unknown": 0, "swdge": 1, "hwdge": 2, "none": 3},
    "oob_mode": {"error": 0, "skip": 1},
    "reduce_cmd": {"idle": 0, "reset": 1, "reduce": 2, "reset_reduce": 3, "load_reduce": 4},
    "matmul_perf_mode": {"none": "none", "double_row": "double_row"},
    "nc_version": {"gen2": 2, "gen3": 3, "gen4": 4},
    "dma_engine": {"dma": 1, "gpsimd_dma": 2},
}


@pytest.mark.parametrize("module,names", [(nki, NKI_NAMES), (nl, NL_NAMES), (nisa, ISA_NAMES),
                                          (nki_lnc, LNC_NAMES), (nki.compiler, COMPILER_NAMES)],
                         ids=["nki", "nki.language", "nki.isa", "nki.lnc", "nki.compiler"])
def test_every_documented_name_resolves(module, names):
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{module.__name__}: documented names missing: {missing}"


@pytest.mark.parametrize("name", ["max8", "nc_matmul_mx", "register_alloc", "topk"])
def test_unmodelled_isa_names_raise_not_modelled(name):
    with pytest.raises(NkiError, match=rf"^nisa\.{name} is not modelled by this emulator$"):
        getattr(nisa, name)()


@pytest.mark.parametrize("name", ["softmax", "rms_norm", "dropout", "rand"])
def test_unmodelled_language_names_raise_not_modelled(name):
    with pytest.raises(NkiError, match=rf"^nl\.{name} is not modelled by this emulator$"):
        getattr(nl, name)(None)


def test_unknown_names_still_raise_attribute_error():
    with pytest.raises(AttributeError):
        nisa.no_such_instruction  # noqa: B018
    with pytest.raises(AttributeError):
        nl.no_such_function  # noqa: B018


@pytest.mark.parametrize("enum_name", sorted(ENUM_VALUES))
def test_enum_members_and_values(enum_name):
    cls = getattr(nisa, enum_name)
    documented = ENUM_VALUES[enum_name]
    for member, value in documented.items():
        assert cls[member].value == value, (enum_name, member)
        assert cls(value) is cls[member]
    assert getattr(nisa.constants, enum_name) is cls


def test_as_enum_accepts_members_and_raw_values_and_names_the_argument():
    from nkilib_msda.simulator.isa.enums import as_enum

    assert as_enum(3, nisa.dge_mode, "dge_mode") is nisa.dge_mode.none
    assert as_enum(nisa.engine.vector, nisa.engine, "engine") is nisa.engine.vector
    assert as_enum(5, nisa.engine, "engine") is nisa.engine.vector
    for bad in (9, "hwdge", True, nisa.oob_mode.skip, 1.5):
        with pytest.raises(NkiError, match=r"enum argument: dge_mode must be a nisa.dge_mode"):
            as_enum(bad, nisa.dge_mode, "dge_mode", "dma_copy")


def test_tile_size_fields():
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_bank_fmax, ts.psum_bank_fmax_bytes, ts.psum_num_banks) == (128, 512, 2048, 8)
    assert (ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == (128, 512)
    assert ts.sbuf_fmax_bytes == 212_992 and ts.sbuf_fmax == 212_992 // 4
    assert ts.sbuf_size_bytes == 224 * 1024 * 128
    for name in ("bn_stats_fmax", "psum_min_align", "sbuf_min_align", "psum_fmax_bytes"):
        assert isinstance(getattr(ts, name), int) and getattr(ts, name) > 0
    with pytest.warns(DeprecationWarning, match="total_available_sbuf_size"):
        assert ts.total_available_sbuf_size == ts.sbuf_fmax_bytes
    with pytest.warns(DeprecationWarning, match="psum_fmax"):
        assert ts.psum_fmax == 512


def test_memory_regions_compare_like_nki():
    assert nl.hbm == nl.private_hbm and nl.hbm is nl.private_hbm
    assert nl.hbm != nl.shared_hbm and nl.sbuf != nl.psum
    assert isinstance(nl.sbuf, nl.MemoryRegion) and nl.sbuf.value == "sbuf"
    assert nl.is_hbm(nl.shared_hbm) and nl.is_on_chip(nl.psum) and not nl.is_hbm(nl.sbuf)


def test_dynamic_range_is_gone_and_names_the_replacements():
    with pytest.raises(NkiError, match=r"nl.dynamic_range.*fori_loop.*while_loop"):
        nl.dynamic_range  # noqa: B018


def test_scalar_load_store_and_fori_loop_bound():
    @nki.jit
    def kernel(n):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=n)
        i = nisa.scalar_load(t)
        j = i * 4 + 1
        acc = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(acc, 0.0)
        one = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(one, 1.0)
        nl.fori_loop(0, i, lambda reg: nisa.tensor_tensor(acc, acc, one, nl.add))
        out_i = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.scalar_store(out_i, j)
        o1 = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=out_i)
        nisa.dma_copy(dst=o2, src=acc)
        return o1, o2

    n = np.random.default_rng().integers(2, 9)
    o1, o2 = simulate(kernel)(np.array([[n]], np.int32))
    assert o1[0, 0] == 4 * n + 1 and o2[0, 0] == n

    wrapped = nisa.NkiScalar(100000) * 100000  # 32-bit wrap, as the NkiScalar page states
    assert wrapped.__nki_scalar_value__() == 1410065408
    with pytest.raises(NkiError, match="comparison"):
        (nisa.NkiScalar(1) < 2).__nki_scalar_value__()


def test_while_loop_runs_until_the_condition_is_zero():
    @nki.jit
    def kernel(n):
        count = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=count, src=n)
        acc = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(acc, 0.0)
        one_f = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(one_f, 1.0)

        def body(r):  # r: the current condition scalar; the next one is returned
            nisa.tensor_tensor(acc, acc, one_f, nl.add)
            return r - 1

        nl.while_loop(nisa.scalar_load(count), body)
        o = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=acc)
        return o

    n = int(np.random.default_rng().integers(0, 6))
    assert simulate(kernel)(np.array([[n]], np.int32))[0, 0] == n


def test_deprecated_isa_sync_names_warn():
    @nki.jit
    def kernel(a):
        nisa.core_barrier(a, (0, 1))
        return a

    with pytest.warns(DeprecationWarning, match="nki.lnc.core_barrier"):
        simulate(kernel)(np.ones((1, 1), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @nki.jit
        def new_style(a):
            nki_lnc.core_barrier(a, (0, 1))
            return a

        simulate(new_style)(np.ones((1, 1), np.float32))


def test_dma_signatures_follow_the_nki_0_8_parameter_order():
    # NKI 0.8 API stubs: dma_copy(dst, src, priority, oob_mode, dge_mode, engine, name) and
    # dma_transpose(dst, src, axes, priority, dge_mode, oob_mode, name); a positional call must
    # bind the same way as on the real API.
    import inspect

    assert list(inspect.signature(nisa.dma_copy).parameters)[:4] == ["dst", "src", "priority",
                                                                      "oob_mode"]
    assert list(inspect.signature(nisa.dma_transpose).parameters)[:5] == [
        "dst", "src", "axes", "priority", "dge_mode"]
    assert "reduce_res_negate" in inspect.signature(nisa.tensor_scalar_reduce).parameters


def test_dma_priority_is_checked():
    @nki.jit
    def k(a, priority):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, a, priority)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(simulate(k)(x, 2), x)
    with pytest.raises(NkiError, match="priority"):
        simulate(k)(x, 7)
