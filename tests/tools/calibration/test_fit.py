"""The calibration fit (nkilib_msda/tools/calibration/fit.py) on synthetic graphs, and its write
path: fit -> calibration data file -> the timing constants read it back."""

import pickle

import pytest

from nkilib_msda.simulator.timing import calibrated, constants
from nkilib_msda.tools.calibration import fit, records
from nkilib_msda.tools.calibration.runner import graph_file

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
    samples = [fit.Sample("demo", str(w), 1.2 * (3.0 * w + 10.0), _FakeTiming(w))
               for w in (1.0, 5.0, 20.0, 80.0, 300.0)]
    result = fit.fit(samples)
    assert result["params"]["x"] == pytest.approx(3.0, rel=0.05)
    assert result["scale"] == pytest.approx(1.2, rel=0.05)
    err = fit.errors(samples, result["params"], result["scale"])
    assert err["all"]["median_abs_err"] < 0.02
    nominal = fit.errors(samples, {"x": 2.0}, 1.0)
    assert nominal["all"]["median_abs_err"] > 0.2
    assert result["at_bound"] == []


def test_a_parameter_pushed_past_its_range_is_reported_on_its_bound():
    pytest.importorskip("scipy")
    samples = [fit.Sample("demo", str(w), 9.0 * w + 10.0, _FakeTiming(w))
               for w in (1.0, 5.0, 20.0, 80.0, 300.0)]  # x = 9 is above the range [1, 5]
    assert fit.fit(samples)["at_bound"] == ["x"]


def _summary(**changes):
    good = {"all": {"median_abs_err": 0.1}}
    worse = {"all": {"median_abs_err": 0.2}}
    summary = {"success": True, "at_bound": [], "scale": 1.0, "fit_set_nominal": worse,
               "fit_set_fitted": good, "check_set_nominal": worse, "check_set_fitted": good}
    summary.update(changes)
    return summary


def test_a_fit_with_parameters_on_their_bounds_is_not_written_back():
    assert fit.sane(_summary()) == (True, "")
    ok, why = fit.sane(_summary(at_bound=["launch_floor_us", "swdge_fixed_ns"]))
    assert not ok and "launch_floor_us" in why and "swdge_fixed_ns" in why
    ok, why = fit.sane(_summary(check_set_fitted={"all": {"median_abs_err": 0.3}}))
    assert not ok and "check set" in why


def test_the_fit_skips_graphs_recorded_by_another_model(monkeypatch, tmp_path):
    record = records.Record("demo", "perf", 1, {"batch": 1, "cyclesQoR": 12_345_678}, "cyclesQoR")
    decision = records.decide(record, [])
    monkeypatch.setattr(fit, "FAMILIES", {"demo": records.FAMILIES["qkv_tkg"]})
    path = graph_file(tmp_path, record.key())
    path.write_bytes(pickle.dumps(_FakeTiming(1.0)))
    rows = [(record, decision, True, "")]
    entry = {"status": "ran", "match": True}
    cache = {record.key(): {**entry, "model": "current"}}
    assert len(fit.samples(rows, cache, tmp_path, "fit", model="current")) == 1
    assert fit.samples(rows, cache, tmp_path, "fit", model="another") == []


def _trn2_summary(ok: bool, rng) -> dict:
    """A fit summary over the real trn2 parameters: fitted values drawn inside the ranges."""
    params = constants.params_for("trn2")
    fitted = {p.name: float(rng.uniform(p.low + 0.1 * (p.high - p.low),
                                        p.high - 0.1 * (p.high - p.low)))
              if p.high > p.low else p.nominal for p in params}
    summary = _summary(at_bound=[] if ok else ["launch_floor_us"])
    summary.update(params=fitted, nominal={p.name: p.nominal for p in params},
                   ranges={p.name: (p.low, p.nominal, p.high) for p in params},
                   scale=float(rng.uniform(0.8, 1.2)))
    return summary


def test_a_sane_fit_is_written_as_data_and_the_constants_read_it_back(tmp_path):
    import numpy as np
    rng = np.random.default_rng()
    summary = _trn2_summary(True, rng)
    path = fit.write_calibration(summary, "trn2", "abc1234", directory=tmp_path)
    assert path == tmp_path / "trn2.json"
    data = calibrated.load("trn2", tmp_path)
    assert data is not None and data.adopted and data.commit == "abc1234"
    assert data.fit_set == ("mlp_tkg", "qkv_tkg") and data.date
    params = {p.name: p for p in constants.build_params("trn2", tmp_path)}
    for name, value in summary["params"].items():
        expected = float(f"{value:.3g}")
        if abs(expected - summary["nominal"][name]) > 1e-3 * abs(summary["nominal"][name]):
            assert params[name].nominal == expected, name
        low, _, high = summary["ranges"][name]
        assert (params[name].low, params[name].high) == (low, high)  # ranges stay
    # the package's own data is untouched, and trn3 has no file in tmp_path
    assert constants.build_params("trn3", tmp_path) == constants.params_for("trn3")


def test_a_fit_that_is_not_sane_is_kept_without_changing_the_nominals(tmp_path):
    import numpy as np
    summary = _trn2_summary(False, np.random.default_rng())
    fit.write_calibration(summary, "trn2", "abc1234", directory=tmp_path)
    data = calibrated.load("trn2", tmp_path)
    assert data is not None and not data.adopted and data.nominals == {}
    assert "launch_floor_us" in data.note and data.fitted
    assert constants.build_params("trn2", tmp_path) == constants.build_params("trn2", tmp_path / "none")


def test_calibration_data_outside_a_range_or_naming_an_unknown_parameter_is_refused(tmp_path):
    base = calibrated.CalibrationData("trn2", "c", "2026-12-03", ("qkv_tkg",), 1.0, True,
                                      {"launch_floor_us": 99.0})
    calibrated.write(base, tmp_path)
    with pytest.raises(ValueError, match="launch_floor_us"):
        constants.build_params("trn2", tmp_path)
    calibrated.write(calibrated.CalibrationData("trn2", "c", "d", (), 1.0, True, {"warp_ns": 1.0}),
                     tmp_path)
    with pytest.raises(ValueError, match="unknown parameters .*warp_ns"):
        constants.build_params("trn2", tmp_path)
    with pytest.raises(ValueError, match="nominals must be empty"):
        calibrated.write(calibrated.CalibrationData("trn2", "c", "d", (), 1.0, False,
                                                    {"launch_floor_us": 15.0}), tmp_path)


def test_the_shipped_trn2_data_file_loads():
    data = calibrated.load("trn2")
    assert data is not None and data.target == "trn2" and data.fit_set
    nominal = {p.name: p.nominal for p in constants.params_for("trn2")}
    for name, value in data.nominals.items():
        assert nominal[name] == value
