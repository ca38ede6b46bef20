"""Every enforced compute-engine rule raises NkiError naming the instruction and the rule."""

from __future__ import annotations

import numpy as np
import pytest

from _compute_helpers import load, run
from nkilib_msda.simulator import NkiError, nisa, nl

F32 = np.float32


def _tiles(shape=(4, 8), dtype=nl.float32, buffer=None, value=1.0):
    t = nl.ndarray(shape, dtype=dtype, buffer=buffer or nl.sbuf)
    nisa.memset(t, value if dtype in (nl.float32, nl.bfloat16) else int(value))
    return t


def _sb(shape=(4, 8), dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def _ps(shape=(4, 8), dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


CASES = {
    # tensor_tensor
    "tt_two_psum": (lambda: nisa.tensor_tensor(_sb(), _tiles(buffer=nl.psum),
                                               _tiles(buffer=nl.psum), nl.add),
                    "tensor_tensor: two PSUM inputs"),
    "tt_agreement": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles((4, 7)), nl.add),
                     "tensor_tensor: operand agreement"),
    "tt_start_partition": (lambda: nisa.tensor_tensor(_sb((32, 8)), _tiles((128, 8))[16:48],
                                                      _tiles((32, 8)), nl.add),
                           "tensor_tensor: start partition"),
    "tt_power_vector": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles(), nl.power,
                                                   engine=nisa.engine.vector),
                        "tensor_tensor: power on GpSimd"),
    "tt_gpsimd_psum": (lambda: nisa.tensor_tensor(_ps(), _tiles(), _tiles(), nl.add,
                                                  engine=nisa.engine.gpsimd),
                       "tensor_tensor: GpSimd cannot access PSUM"),
    "tt_bitvec_float": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles(), nl.bitwise_and),
                        "tensor_tensor: bitvec dtype"),
    "tt_trn3_only": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles(), nl.abs_max),
                     "tensor_tensor: trn3-only op"),
    "tt_unary": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles(), nl.abs),
                 "tensor_tensor: binary op required"),
    "tt_not_alu": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles(), nl.exp),
                   "tensor_tensor: unsupported ALU op"),
    "tt_raw_engine": (lambda: nisa.tensor_tensor(_sb(), _tiles(), _tiles(), nl.add, engine=2),
                      "tensor_tensor: engine"),
    "tt_hbm_operand": (lambda: nisa.tensor_tensor(
        _sb(), nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm), _tiles(), nl.add),
        "tensor_tensor: buffer access"),
    # tensor_scalar
    "ts_mixed_kinds": (lambda: nisa.tensor_scalar(_sb(dtype=nl.int32), _tiles(dtype=nl.int32),
                                                  nl.add, 1, op1=nl.bitwise_and, operand1=3),
                       "tensor_scalar: mixed op kinds"),
    "ts_operand_dtype": (lambda: nisa.tensor_scalar(_sb(), _tiles(), nl.add,
                                                    _tiles((4, 1), dtype=nl.bfloat16)),
                         "tensor_scalar: operand dtype"),
    "ts_operand_shape": (lambda: nisa.tensor_scalar(_sb(), _tiles(), nl.add, _tiles((4, 2))),
                         "tensor_scalar: vector operand shape"),
    "ts_scalar_pair": (lambda: nisa.tensor_scalar(_sb(), _tiles(), nl.add, 1.0, op1=nl.multiply,
                                                  operand1=2.0, engine=nisa.engine.scalar),
                       "tensor_scalar: ScalarE op pair"),
    "ts_gpsimd_op": (lambda: nisa.tensor_scalar(_sb(), _tiles(), nl.add, 1.0,
                                                engine=nisa.engine.gpsimd),
                     "tensor_scalar: engine"),
    "ts_bitvec_scalar_engine": (lambda: nisa.tensor_scalar(
        _sb(dtype=nl.int32), _tiles(dtype=nl.int32), nl.bitwise_and, 1,
        engine=nisa.engine.scalar), "tensor_scalar: engine"),
    "ts_unused_op1": (lambda: nisa.tensor_scalar(_sb(), _tiles(), nl.add, 1.0, operand1=2.0),
                      "tensor_scalar: unused op1"),
    "ts_unary_operand": (lambda: nisa.tensor_scalar(_sb(), _tiles(), nl.abs, 3.0),
                         "tensor_scalar: unary operand"),
    "ts_bitvec_float_imm": (lambda: nisa.tensor_scalar(_sb(dtype=nl.int32), _tiles(dtype=nl.int32),
                                                       nl.left_shift, 1.5),
                            "tensor_scalar: bitvec operand"),
    # scalar_tensor_tensor
    "stt_two_psum": (lambda: nisa.scalar_tensor_tensor(_sb(), _tiles(buffer=nl.psum), nl.multiply,
                                                       2.0, nl.add, _tiles(buffer=nl.psum)),
                     "scalar_tensor_tensor: two PSUM inputs"),
    "stt_bitvec": (lambda: nisa.scalar_tensor_tensor(_sb(dtype=nl.int32), _tiles(dtype=nl.int32),
                                                     nl.bitwise_and, 1, nl.add,
                                                     _tiles(dtype=nl.int32)),
                   "scalar_tensor_tensor: arithmetic ops only"),
    # tensor_copy / memset
    "copy_gpsimd_psum": (lambda: nisa.tensor_copy(_sb(), _tiles(buffer=nl.psum),
                                                  engine=nisa.engine.gpsimd),
                         "tensor_copy: GpSimd cannot access PSUM"),
    "copy_tensor_engine": (lambda: nisa.tensor_copy(_sb(), _tiles(), engine=nisa.engine.tensor),
                           "tensor_copy: engine"),
    "memset_float_in_int": (lambda: nisa.memset(_sb(dtype=nl.int32), 0.0),
                            "memset: value type"),
    "memset_range": (lambda: nisa.memset(_sb(dtype=nl.uint8), 256), "memset: value range"),
    # tensor_reduce
    "reduce_axis0": (lambda: nisa.tensor_reduce(_sb((1, 8)), nl.add, _tiles(), axis=0),
                     "tensor_reduce: reduce axis"),
    "reduce_not_trailing": (lambda: nisa.tensor_reduce(_sb((4, 3)), nl.add,
                                                       _tiles((4, 2, 3)), axis=1),
                            "tensor_reduce: reduce axis"),
    "reduce_op": (lambda: nisa.tensor_reduce(_sb((4, 1)), nl.equal, _tiles(), axis=1),
                  "tensor_reduce: reduce op"),
    "reduce_dst_shape": (lambda: nisa.tensor_reduce(_sb((4, 2)), nl.add, _tiles(), axis=1),
                         "tensor_reduce: dst shape"),
    "reduce_negate_bitvec": (lambda: nisa.tensor_reduce(_sb((4, 1), nl.int32), nl.bitwise_or,
                                                        _tiles(dtype=nl.int32), axis=1,
                                                        negate=True),
                             "tensor_reduce: negate"),
    # iota / affine_select / nc_n_gather
    "iota_size": (lambda: nisa.iota(_sb(dtype=nl.int32), [[1, 7]]), "iota: pattern size"),
    "iota_pairs": (lambda: nisa.iota(_sb((4, 1), nl.int32), [[1, 1]] * 5), "iota: pattern"),
    "iota_psum": (lambda: nisa.iota(_ps(dtype=nl.int32), [[1, 8]]), "iota: buffer access"),
    "iota_float_offset": (lambda: nisa.iota(_sb(dtype=nl.int32), [[1, 8]], offset=0.5),
                          "iota: offset type"),
    "affine_cmp": (lambda: nisa.affine_select(_sb(), [[1, 8]], 1, _tiles(), 0.0, cmp_op=nl.add),
                   "affine_select: cmp_op"),
    "gather_oob": (lambda: nisa.nc_n_gather(_sb((4, 2)), _tiles(),
                                            _tiles((4, 2), dtype=nl.uint32, value=8)),
                   "nc_n_gather: index out of range"),
    "gather_idx_dtype": (lambda: nisa.nc_n_gather(_sb((4, 2)), _tiles(),
                                                  _tiles((4, 2), dtype=nl.int32, value=0)),
                         "nc_n_gather: indices dtype"),
    # predicated / select
    "pred_dtype": (lambda: nisa.tensor_copy_predicated(_tiles(), _tiles(), _tiles()),
                   "tensor_copy_predicated: predicate dtype"),
    "pred_src_dtype": (lambda: nisa.tensor_copy_predicated(
        _tiles(), _tiles(dtype=nl.bfloat16), _tiles(dtype=nl.uint8)), "tensor_copy_predicated: dtype"),
    "select_regs": (lambda: nisa.select_reduce(_sb(), _tiles(dtype=nl.uint8), _tiles(), 0.0,
                                               reduce_res=_sb((4, 1))),
                    "select_reduce: reduce registers"),
    "tsr_regs_unset": (lambda: nisa.tensor_scalar_reduce(_sb(), _tiles(), nl.add, 1.0, nl.add,
                                                         _sb((4, 1)),
                                                         reduce_cmd=nisa.reduce_cmd.reduce),
                       "tensor_scalar_reduce: reduce registers"),
    "tsr_reduce_op": (lambda: nisa.tensor_scalar_reduce(_sb(), _tiles(), nl.add, 1.0,
                                                        nl.subtract, _sb((4, 1))),
                      "tensor_scalar_reduce: reduce op"),
    # activation
    "act_not_function": (lambda: nisa.activation(_sb(), nl.add, _tiles()),
                         "activation: activation function"),
    "act_bias_shape": (lambda: nisa.activation(_sb(), nl.exp, _tiles(), bias=_tiles((4, 2))),
                       "activation: vector operand shape"),
    "act_scale_dtype": (lambda: nisa.activation(_sb(), nl.exp, _tiles(),
                                                scale=_tiles((4, 1), dtype=nl.bfloat16)),
                        "activation: operand dtype"),
    "act_regs_unset": (lambda: nisa.activation(_sb(), nl.exp, _tiles(), reduce_op=nl.add,
                                               reduce_res=_sb((4, 1))),
                       "activation: reduce registers"),
    "act_reduce_op": (lambda: nisa.activation(_sb(), nl.exp, _tiles(), reduce_op=nl.maximum,
                                              reduce_res=_sb((4, 1)),
                                              reduce_cmd=nisa.reduce_cmd.reset_reduce),
                      "activation: reduce op"),
    # matmul / transpose
    "mm_k_mismatch": (lambda: nisa.nc_matmul(_ps((8, 8)), _tiles((4, 8)), _tiles((5, 8))),
                      "nc_matmul: contraction dim"),
    "mm_m_limit": (lambda: nisa.nc_matmul(_ps((128, 8)), _tiles((4, 129)), _tiles((4, 8))),
                   "nc_matmul: matmul size"),
    "mm_n_limit": (lambda: nisa.nc_matmul(_ps((8, 513)), _tiles((4, 8)), _tiles((4, 513))),
                   "nc_matmul: matmul size"),
    "mm_dst_sbuf": (lambda: nisa.nc_matmul(_sb((8, 8)), _tiles((4, 8)), _tiles((4, 8))),
                    "nc_matmul: buffer access"),
    "mm_input_psum": (lambda: nisa.nc_matmul(_ps((8, 8)), _tiles((4, 8), buffer=nl.psum),
                                             _tiles((4, 8))), "nc_matmul: buffer access"),
    "mm_pairing": (lambda: nisa.nc_matmul(_ps((8, 8)), _tiles((4, 8)),
                                          _tiles((4, 8), dtype=nl.bfloat16)),
                   "nc_matmul: fp32 pairing"),
    "mm_int_input": (lambda: nisa.nc_matmul(_ps((8, 8)), _tiles((4, 8), dtype=nl.int32),
                                            _tiles((4, 8), dtype=nl.int32)),
                     "nc_matmul: input dtype"),
    "mm_dst_shape": (lambda: nisa.nc_matmul(_ps((8, 4)), _tiles((4, 8)), _tiles((4, 8))),
                     "nc_matmul: dst shape"),
    "mm_bank": (lambda: nisa.nc_matmul(_ps((8, 1024))[:, 256:768], _tiles((4, 8)),
                                       _tiles((4, 512))), "nc_matmul: PSUM bank"),
    "mm_transpose_moving": (lambda: nisa.nc_matmul(_ps((8, 4)), _tiles((4, 8)), _tiles((4, 4)),
                                                   is_transpose=True),
                            "nc_matmul: transpose mode"),
    "tr_dtype": (lambda: nisa.nc_transpose(_ps((8, 4), nl.bfloat16), _tiles((4, 8))),
                 "nc_transpose: dtype"),
    "tr_vector_size": (lambda: nisa.nc_transpose(_sb((40, 4)), _tiles((4, 40)),
                                                 engine=nisa.engine.vector),
                       "nc_transpose: transpose size"),
    "tr_pe_dst_sbuf": (lambda: nisa.nc_transpose(_sb((40, 4)), _tiles((4, 40)),
                                                 engine=nisa.engine.tensor),
                       "nc_transpose: buffer access"),
    "tr_shape": (lambda: nisa.nc_transpose(_ps((4, 8)), _tiles((4, 8))),
                 "nc_transpose: dst shape"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_violation_raises(case):
    action, rule = CASES[case]

    def body(h):
        load(h)
        action()
        return _tiles()

    with pytest.raises(NkiError, match=rule):
        run(body, np.zeros((1, 1), dtype=F32))


def test_rules_that_depend_on_the_target():
    def abs_max_body(h):
        x = load(h)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(out, x, x, nl.abs_max)
        act = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(act, x, nl.add, 1.0, op1=nl.multiply, operand1=2.0,
                           engine=nisa.engine.scalar)
        return out, act

    x = np.array([[-3.0, 2.0]], dtype=F32)
    out, act = run(abs_max_body, x, target="trn3")
    np.testing.assert_array_equal(out, [[3.0, 2.0]])
    np.testing.assert_array_equal(act, [[-4.0, 6.0]])
    with pytest.raises(NkiError, match="tensor_tensor: trn3-only op"):
        run(abs_max_body, x, target="trn2")
