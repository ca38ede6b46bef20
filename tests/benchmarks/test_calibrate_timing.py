"""The record parser of benchmarks/calibrate_timing.py on a synthetic test-file snippet
(written for this test; it only mimics the shapes of QoR lists: a column string, a
``# Parameters:`` comment, pytest.param rows, pairs, placeholders and copied values)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate_timing.py"
_spec = importlib.util.spec_from_file_location("calibrate_timing", _PATH)
cal = importlib.util.module_from_spec(_spec)
sys.modules["calibrate_timing"] = cal  # dataclasses look their module up
_spec.loader.exec_module(cal)

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


class _FakeTiming:
    """A recorded graph whose modelled time is ``x * work + 10`` µs (one unknown ``x``)."""

    def __init__(self, work):
        self.work = work

    def ranges(self):
        return {"x": (1.0, 2.0, 5.0)}

    def evaluate(self, params):
        return params.get("x", 2.0) * self.work + 10.0


def test_fit_recovers_a_known_parameter_and_scale():
    pytest.importorskip("scipy")
    samples = [cal.Sample("demo", str(w), 1.2 * (3.0 * w + 10.0), _FakeTiming(w))
               for w in (1.0, 5.0, 20.0, 80.0, 300.0)]
    result = cal.fit(samples)
    assert result["params"]["x"] == pytest.approx(3.0, rel=0.05)
    assert result["scale"] == pytest.approx(1.2, rel=0.05)
    err = cal.errors(samples, result["params"], result["scale"])
    assert err["all"]["median_abs_err"] < 0.02
    nominal = cal.errors(samples, {"x": 2.0}, 1.0)
    assert nominal["all"]["median_abs_err"] > 0.2
    assert result["at_bound"] == []


def test_a_parameter_pushed_past_its_range_is_reported_on_its_bound():
    pytest.importorskip("scipy")
    samples = [cal.Sample("demo", str(w), 9.0 * w + 10.0, _FakeTiming(w))
               for w in (1.0, 5.0, 20.0, 80.0, 300.0)]  # x = 9 is above the range [1, 5]
    assert cal.fit(samples)["at_bound"] == ["x"]


def _summary(**changes):
    good = {"all": {"median_abs_err": 0.1}}
    worse = {"all": {"median_abs_err": 0.2}}
    summary = {"success": True, "at_bound": [], "scale": 1.0, "fit_set_nominal": worse,
               "fit_set_fitted": good, "check_set_nominal": worse, "check_set_fitted": good}
    summary.update(changes)
    return summary


def test_a_fit_with_parameters_on_their_bounds_is_not_written_back():
    assert cal.sane(_summary()) == (True, "")
    ok, why = cal.sane(_summary(at_bound=["launch_floor_us", "swdge_fixed_ns"]))
    assert not ok and "launch_floor_us" in why and "swdge_fixed_ns" in why
    ok, why = cal.sane(_summary(check_set_fitted={"all": {"median_abs_err": 0.3}}))
    assert not ok and "check set" in why


def test_the_model_version_follows_the_recorder_not_the_scheduler(monkeypatch, tmp_path):
    timing = tmp_path / "nkilib_msda" / "simulator" / "timing"
    timing.mkdir(parents=True)
    for name in cal.GRAPH_SOURCES + ("schedule.py",):
        (timing / name).write_text(f"# {name}\n")
    monkeypatch.setattr(cal, "REPO", tmp_path)
    first = cal.model_version()
    (timing / "schedule.py").write_text("# re-scheduling changed\n")
    assert cal.model_version() == first  # graphs are re-scheduled when loaded
    (timing / "recorder.py").write_text("# another descriptor rule\n")
    assert cal.model_version() != first  # the recorded graphs are stale


def test_the_fit_skips_graphs_recorded_by_another_model(monkeypatch, tmp_path):
    record = _records()[0]
    decision = cal.decide(record, [])
    monkeypatch.setattr(cal, "FAMILIES", {"demo": cal.FAMILIES["qkv_tkg"]})
    monkeypatch.setattr(cal, "GRAPHS", tmp_path)
    monkeypatch.setattr(cal, "model_version", lambda: "current")
    path = cal.graph_file(record.key())
    path.write_bytes(cal.pickle.dumps(_FakeTiming(1.0)))
    rows = [(record, decision, True, "")]
    entry = {"status": "ran", "match": True}
    assert len(cal._samples(rows, {record.key(): {**entry, "model": "current"}}, "fit")) == 1
    assert cal._samples(rows, {record.key(): {**entry, "model": "older"}}, "fit") == []
