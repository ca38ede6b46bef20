"""The QoR record parser of the calibration (nkilib_msda/tools/calibration/records.py) on a
synthetic test-file snippet (written for this test; it only mimics the shapes of QoR lists: a
column string, a ``# Parameters:`` comment, pytest.param rows, pairs, placeholders and copied
values)."""

import numpy as np
import pytest

from nkilib_msda.tools.calibration import records as cal

SNIPPET = '''
import pytest
class TestThing:
    perf_params = "lnc_degree, batch, hidden, cyclesQoR, norm_type, quantization_type"
    perf_perms = [
        [2, 1, 4096, (None, 12_345_678), NormType.RMS_NORM, QuantizationType.NONE],
        [1, 2, 2048 * 2, 7_000_000, NormType.NO_NORM, QuantizationType.NONE],
        [2, 4, 1024, None, NormType.NO_NORM, QuantizationType.NONE],
        [2, 8, 1024, 55_555_555, NormType.NO_NORM, QuantizationType.ROW],
        [2, 9, 1024, 55_555_555, NormType.NO_NORM, QuantizationType.NONE],
        [2, 9],
    ]

# Parameters: vnc_degree, batch, seqlen, dtype,
#             tpbSgCyclesSum, fused_add
other_params = [
    [1, 3, 5, nl.bfloat16, 98_765_431, True],
    pytest.param(2, 3, 5, nl.float32, 11_111_117, False, marks=pytest.mark.fast),
]
'''


def _records():
    return cal.parse_records(SNIPPET, "demo")


def test_columns_come_from_the_nearest_header_and_cells_are_evaluated():
    recs = _records()
    assert len(recs) == 7  # the short row [2, 9] is skipped
    first = recs[0]
    assert first.measure_column == "cyclesQoR"
    assert first.values["hidden"] == 4096 and first.raw_measure == (None, 12345678)
    assert recs[1].values["hidden"] == 4096  # 2048 * 2
    assert str(first.values["norm_type"]) == "NormType.RMS_NORM"
    comment_rows = [r for r in recs if r.measure_column == "tpbSgCyclesSum"]
    assert [r.values["batch"] for r in comment_rows] == [3, 3]
    assert comment_rows[1].values["dtype"] == "nl.float32"  # pytest.param row


@pytest.mark.parametrize("index,fit,note", [
    (0, True, "pair (None, 12345678): filled slot used"),
    (1, False, "round-number placeholder"),
    (2, False, "no measurement recorded"),
    (4, False, "value repeated 2x (copied)"),
])
def test_record_decisions(index, fit, note):
    recs = _records()
    values = [r.raw_measure[-1] if isinstance(r.raw_measure, tuple) else r.raw_measure
              for r in recs]
    d = cal.decide(recs[index], values)
    assert d.use_in_fit is fit
    assert note in d.note


def test_scope_filter_keeps_bf16_fp16_unquantized_only():
    recs = _records()
    assert cal.in_scope(recs[0])[0]
    assert not cal.in_scope(recs[3])[0]  # QuantizationType.ROW
    comment_rows = [r for r in recs if r.measure_column == "tpbSgCyclesSum"]
    assert cal.in_scope(comment_rows[0])[0]
    assert not cal.in_scope(comment_rows[1])[0]  # float32


CP_SNIPPET = '''
class TestCp:
    cp_params = \\
        "bs, q_seqlen_partial, kv_seqlen, d, softmax_scale, dtype, tp_q, cp_rank_id, cp_degree, qor"
    cp_perms = [
        [4, 512, 1024, 128, 1.0, nl.bfloat16, True, 1, 2, 77e6],
        [4, 512, 4096, 128, 1.0, nl.float32, True, 3, 8, 147e6],
    ]
'''


def test_context_parallel_lists_name_their_measure_qor():
    recs = cal.parse_records(CP_SNIPPET, "attention_cte")
    assert [r.measure_column for r in recs] == ["qor", "qor"]
    first = recs[0]
    assert first.values["q_seqlen_partial"] == 512 and first.values["cp_rank_id"] == 1
    d = cal.decide(first, [r.raw_measure for r in recs])
    assert d.recorded_ps == 77_000_000 and not d.use_in_fit and "rounded" in d.note
    assert cal.in_scope(first)[0] and not cal.in_scope(recs[1])[0]  # fp32 is out of scope


def test_context_parallel_columns_map_to_the_no_cp_names_and_are_causal():
    from nkilib_msda.tools.calibration.references import attention_columns
    rng = np.random.default_rng()
    sq, skv, rank = (int(x) for x in rng.integers(1, 5000, 3))
    v = {"bs": 2, "q_seqlen_partial": sq, "kv_seqlen": skv, "kv_seqlen_prior": 7,
         "kv_prior_used_len": 3, "cp_rank_id": rank, "cp_degree": 16, "qor": 1e6}
    got = attention_columns(v)
    assert got == {"bs": 2, "seqlen_q": sq, "seqlen_kv": skv, "prior_len": 7,
                   "prior_used_len": 3, "cp_rank_id": rank, "cp_degree": 16,
                   "causal_mask": True}
    plain = {"bs": 1, "seqlen_q": sq, "seqlen_kv": skv, "causal_mask": False,
             "tpbSgCyclesSum": 5}
    assert attention_columns(plain) == {"bs": 1, "seqlen_q": sq, "seqlen_kv": skv,
                                        "causal_mask": False}
