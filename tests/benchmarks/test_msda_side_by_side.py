"""benchmarks/msda_side_by_side.py: ranking rule, tables and shape list (synthetic numbers only;
no emulator run)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("msda_side_by_side", ROOT / "benchmarks" / "msda_side_by_side.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sbs = _load()

# nki-library's MSDA test shapes (test_ms_deformable_attention.py / ..._bwd.py): batch, N_q, N_h,
# C_h, N_l, N_p, spatial shapes, value layout, locations layout. Written out here independently of
# the benchmark's table so that a drift in either is caught.
S4 = ((50, 45), (25, 21), (13, 9), (5, 7))
UPSTREAM_SHAPES = {
    "basic": (2, 256, 8, 32, 4, 8, S4, "BLNC", "B2QHLP"),
    "sca-base": (1, 18000, 8, 32, 4, 8, ((113, 200), (57, 100), (29, 50), (15, 25)), "BNLC", "B2QHLP"),
    "tsa-base": (1, 40000, 8, 32, 1, 4, ((200, 200),), "BLNC", "B2QHLP"),
    "decoder-base": (1, 900, 8, 32, 1, 4, ((200, 200),), "BLNC", "B2QHLP"),
    "sca-small": (1, 13500, 8, 32, 1, 8, ((113, 200),), "BLNC", "B2QHLP"),
    "tsa-small": (1, 22500, 8, 32, 1, 4, ((150, 150),), "BLNC", "B2QHLP"),
    "decoder-small": (1, 900, 8, 32, 1, 4, ((150, 150),), "BLNC", "B2QHLP"),
}


def _timing(est, low, high, lb=None, bound="dma", scenarios=None):
    return {"estimate_us": est, "low_us": low, "high_us": high, "lower_bound_us": lb,
            "bound_by": bound, "engine_busy_us": {"vector": est / 2, "gpsimd": est / 4},
            "scenarios": scenarios or {"nominal/nominal": {"estimate_us": est, "low_us": low,
                                                           "high_us": high, "bound_by": bound}}}


def _record(kernel, direction, shape, lnc, timing, correct=True, status="ok", model="m1"):
    errors = {"output": {"max_rel": 1e-3 if correct else 0.5, "rel_l2": 1e-3, "tolerance": 1e-2,
                         "ok": correct}}
    return {"kernel": kernel, "direction": direction, "shape": shape, "lnc": lnc, "status": status,
            "timing": timing, "correct": correct, "model_hash": model, "errors": errors, "emulator_wall_s": 1.0,
            "counts": {"instructions": {"vector": 10, "gpsimd": 2}, "dma_hbm_bytes": 2_000_000,
                       "dma": {"indirect_transpose": {"instructions": 4, "descriptors": 1000,
                                                      "descriptor_bytes": 64_000, "hbm_bytes": 1}}}}


def test_shapes_match_nki_library_tests():
    got = {name: (c.batch, c.num_queries, c.num_heads, c.head_dim, c.num_levels, c.num_points,
                  tuple(map(tuple, c.spatial_shapes)), c.value_layout, c.locations_layout)
           for name, c in sbs.SHAPES.items()}
    assert got == UPSTREAM_SHAPES
    for case in sbs.SHAPES.values():  # as nki-library's tests: bf16 value, zeros, no align_corners
        assert (case.value_dtype, case.padding_mode, case.align_corners) == ("bfloat16", "zeros", False)
    assert set(sbs.SHAPE_DESCRIPTIONS) == set(sbs.SHAPES)


def test_documented_shapes_are_the_benchmarked_ones():
    text = (ROOT / "docs" / "performance.md").read_text()
    section = text.split("## Trainium (modelled)", 1)[1]
    for name, case in sbs.SHAPES.items():
        assert re.search(rf"\| {re.escape(name)} \|", section), name
        assert f"{case.num_queries:,}" in section or str(case.num_queries) in section, name


@pytest.mark.parametrize("ours, aws, expected", [
    ((10, 8, 12), (30, 20, 40), "ours faster"),
    ((30, 20, 40), (10, 8, 12), "AWS faster"),
    ((10, 8, 25), (30, 20, 40), "overlap"),  # ours nominal 3x faster, but the bands overlap
    ((10, 8, 20), (30, 20, 40), "overlap"),  # touching ends: no strict ranking
    ((30, 19, 41), (30, 20, 40), "overlap"),
])
def test_rank_holds_only_at_both_ends_of_the_band(ours, aws, expected):
    assert sbs.rank(_timing(*ours), _timing(*aws)) == expected


def test_rank_without_timing_is_dash():
    assert sbs.rank(None, _timing(1, 1, 1)) == "-"
    assert sbs.rank(_timing(1, 1, 1), None) == "-"


def test_side_by_side_table_ratio_ranking_and_flags():
    runs = {
        sbs.run_key("ours", "fwd", "basic", 1): _record("ours", "fwd", "basic", 1, _timing(50, 40, 60, 30)),
        sbs.run_key("aws", "fwd", "basic", 1): _record("aws", "fwd", "basic", 1, _timing(200, 150, 300, 90)),
        sbs.run_key("ours", "bwd", "basic", 1): _record("ours", "bwd", "basic", 1, _timing(100, 80, 400)),
        sbs.run_key("aws", "bwd", "basic", 1): _record("aws", "bwd", "basic", 1, _timing(200, 150, 300),
                                                     correct=False),
    }
    table = sbs.side_by_side_table(runs, ["basic"], [1, 2])
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:3]): line
            for line in table.splitlines()[2:]}
    fwd = rows[("basic", "fwd", "1")]
    assert "50.0 [40.0–60.0]" in fwd and "200 [150–300]" in fwd
    assert "| 0.25 |" in fwd and "| ours faster |" in fwd and "30.0 / 90.0" in fwd
    assert "| 0.27 (nominal/nominal, low) |" in fwd           # worst paired corner: 40 / 150
    assert "| 1.67 |" in fwd                                   # ours / its lower bound
    assert fwd.split("|")[4].strip() == "-"                     # no baseline: no "before"
    with_before = sbs.side_by_side_table(runs, ["basic"], [1], ["fwd"],
                                         baseline={sbs.run_key("ours", "fwd", "basic", 1):
                                                   {"timing": _timing(120, 90, 150), "note": "stale"}})
    assert with_before.splitlines()[2].split("|")[4].strip() == "120 (stale)"
    bwd = rows[("basic", "bwd", "1")]
    assert "| 0.50 |" in bwd and "| overlap |" in bwd and "AWS: WRONG output" in bwd
    missing = rows[("basic", "fwd", "2")]
    assert "ours: not run" in missing and "AWS: not run" in missing and "| - |" in missing


def test_bounds_table_and_missing_runs():
    runs = {sbs.run_key("ours", "fwd", "basic", 1): _record("ours", "fwd", "basic", 1, _timing(40, 30, 50)),
            sbs.run_key("aws", "fwd", "basic", 1): _record("aws", "fwd", "basic", 1, None)}
    table = sbs.bounds_table(runs, ["basic"], [1], directions=["fwd"])
    lines = table.splitlines()[2:]
    assert len(lines) == 2
    assert "vector 20.0, gpsimd 10.0" in lines[0] and "transpose 1,000 × 64 B" in lines[0]
    assert "instr: vector 10, gpsimd 2" in lines[1]  # no timing model: instruction counts
    assert sbs.missing_runs(runs, ["basic"], [1], directions=["fwd"]) == []
    assert sbs.missing_runs(runs, ["basic"], [1, 2], directions=["fwd"]) == [
        "ours/fwd/basic/lnc2", "aws/fwd/basic/lnc2"]


def test_table_only_without_aws_checkout(tmp_path, capsys):
    path = tmp_path / "r.json"
    runs = {sbs.run_key("ours", "fwd", "basic", 1): _record("ours", "fwd", "basic", 1, _timing(40, 30, 50))}
    path.write_text(json.dumps({"meta": {"date": "2026-12-01", "command": "x"}, "runs": runs}))
    assert sbs.main(["--table-only", "--json", str(path), "--shapes", "basic", "--lnc", "1",
                     "--directions", "fwd"]) == 0
    out = capsys.readouterr().out
    assert "40.0 [30.0–50.0]" in out and "PARTIAL" not in out
    with pytest.raises(SystemExit):
        sbs.main(["--table-only", "--json", str(path), "--kernels", "aws"])


def test_compact_table_one_lnc():
    runs = {sbs.run_key("ours", "fwd", "basic", 2): _record("ours", "fwd", "basic", 2, _timing(40, 30, 50)),
            sbs.run_key("aws", "fwd", "basic", 2): _record("aws", "fwd", "basic", 2, _timing(160, 45, 300),
                                                         correct=False),
            sbs.run_key("ours", "fwd", "basic", 1): _record("ours", "fwd", "basic", 1, _timing(1, 1, 1))}
    lines = sbs.compact_table(runs, ["basic"], 2, ["fwd", "bwd"]).splitlines()
    assert len(lines) == 3  # header, rule, one row (no bwd data)
    assert lines[2] == "| basic | fwd | - | 40.0 | 160 (wrong result) | 0.25 | 0.67 | overlap |"


def test_estimated_wall_time_of_a_missing_run_scales_with_samples():
    runs = {sbs.run_key("ours", "bwd", "decoder-base", 2): _record("ours", "bwd", "decoder-base", 2, None)}
    runs[sbs.run_key("ours", "bwd", "decoder-base", 2)]["emulator_wall_s"] = 9.0
    est = sbs.estimated_wall_s(runs, sbs.run_key("ours", "bwd", "tsa-base", 2))
    assert est == pytest.approx(9.0 * 40000 / 900)
    assert sbs.estimated_wall_s(runs, sbs.run_key("aws", "bwd", "tsa-base", 2)) is None


def test_status_note_flags_wrong_results_and_hazards_only():
    rec = _record("aws", "bwd", "basic", 2, None, correct=False)
    rec["warnings"] = ["dma_compute: cross-core race", "ndarray: overlapping placement"]
    assert sbs._status_note(rec) == "WRONG output (warns cross-core race)"
    rec = _record("aws", "bwd", "basic", 2, None)
    rec["warnings"] = ["ndarray: overlapping placement"]
    assert sbs._status_note(rec) == ""
    assert sbs._status_note({"status": "timeout"}) == "timeout"
    assert sbs._status_note(None) == "not run"


def test_save_baseline_keeps_ours_timing_for_the_before_column(tmp_path, capsys):
    path = tmp_path / "r.json"
    runs = {sbs.run_key("ours", "fwd", "basic", 2): _record("ours", "fwd", "basic", 2, _timing(80, 60, 90)),
            sbs.run_key("aws", "fwd", "basic", 2): _record("aws", "fwd", "basic", 2, _timing(160, 45, 300))}
    path.write_text(json.dumps({"meta": {"commit": "abc1234"}, "runs": runs}))
    assert sbs.main(["--save-baseline", "--json", str(path), "--shapes", "basic"]) == 0
    saved = json.loads(path.read_text())
    assert set(saved["baseline"]) == {"ours/fwd/basic/lnc2"}            # ours only, runs kept
    assert saved["baseline"]["ours/fwd/basic/lnc2"]["commit"] == "abc1234"
    assert saved["runs"] == runs
    # Ours improves: the tables show the saved time as "before".
    saved["runs"]["ours/fwd/basic/lnc2"]["timing"] = _timing(40, 30, 50)
    path.write_text(json.dumps(saved))
    capsys.readouterr()
    sbs.main(["--table-only", "--json", str(path), "--shapes", "basic", "--lnc", "2",
              "--directions", "fwd"])
    out = capsys.readouterr().out
    assert "| basic | fwd | 80.0 | 40.0 | 160 | 0.25 | 0.67 | overlap |" in out


def _scenarios(rng, n=9):
    """Random scenario timings (estimate inside its band) for the first ``n`` scenarios."""
    out = {}
    from nkilib_msda.simulator.timing.scenarios import SCENARIOS
    for name in SCENARIOS[:n]:
        low = float(rng.uniform(10, 100))
        est = low * float(rng.uniform(1, 3))
        out[name] = {"estimate_us": est, "low_us": low, "high_us": est * float(rng.uniform(1, 3)),
                     "bound_by": "dma"}
    return out


def test_the_robust_ratio_is_the_worst_paired_scenario_and_corner():
    import numpy as np
    rng = np.random.default_rng()
    ours, aws = _scenarios(rng), _scenarios(rng)
    expected = max((ours[s][k] / aws[s][k], s, c) for s in ours
                   for c, k in (("low", "low_us"), ("nominal", "estimate_us"), ("high", "high_us")))
    runs = {sbs.run_key("ours", "fwd", "basic", 2): _record(
                "ours", "fwd", "basic", 2, _timing(**_nominal(ours), scenarios=ours)),
            sbs.run_key("aws", "fwd", "basic", 2): _record(
                "aws", "fwd", "basic", 2, _timing(**_nominal(aws), scenarios=aws))}
    text = sbs.robust_text(runs["ours/fwd/basic/lnc2"], runs["aws/fwd/basic/lnc2"])
    assert text == f"{expected[0]:.2f} ({expected[1]}, {expected[2]})"
    # a scenario only one side has is not paired
    del aws[expected[1]]
    rest = max((ours[s][k] / aws[s][k], s) for s in aws for k in ("low_us", "estimate_us", "high_us"))
    text = sbs.robust_text(runs["ours/fwd/basic/lnc2"], runs["aws/fwd/basic/lnc2"])
    assert text.startswith(f"{rest[0]:.2f} ({rest[1]},")


def _nominal(scenarios):
    s = scenarios["nominal/nominal"]
    return {"est": s["estimate_us"], "low": s["low_us"], "high": s["high_us"]}


def test_no_ratio_from_rows_of_two_timing_models():
    runs = {sbs.run_key("ours", "fwd", "basic", 2): _record("ours", "fwd", "basic", 2, _timing(40, 30, 50)),
            sbs.run_key("aws", "fwd", "basic", 2): _record("aws", "fwd", "basic", 2, _timing(160, 120, 300),
                                                         model="m2")}
    table = sbs.side_by_side_table(runs, ["basic"], [2], ["fwd"])
    row = table.splitlines()[2]
    assert row.count("models differ") == 3 and "0.25" not in row  # ratio, robust ratio, ranking
    compact = sbs.compact_table(runs, ["basic"], 2, ["fwd"]).splitlines()[2]
    assert compact.count("models differ") == 3
    runs["ours/fwd/basic/lnc2"].pop("model_hash")  # a row cached before hashes were kept
    assert sbs.ratio_text(runs["ours/fwd/basic/lnc2"], runs["aws/fwd/basic/lnc2"]) == "models differ"


def test_a_run_records_the_model_hash_and_the_kernel_checksum(tmp_path):
    from nkilib_msda.simulator.timing.fingerprint import model_hash
    files = sbs.kernel_files("ours", "fwd", None)
    names = {p.name for p in files}
    assert {"ms_deformable_attention.py", "ms_deformable_attention_bwd.py",
            "kernel_commons.py"} <= names
    digest = sbs.kernel_sha256(files)
    (tmp_path / "k.py").write_text("x = 1\n")
    one = sbs.kernel_sha256([tmp_path / "k.py"])
    import hashlib
    assert one == hashlib.sha256(b"x = 1\n").hexdigest() and digest != one
    assert len(model_hash()) == 12


def test_our_variants_pass_their_arguments_and_refuse_a_kernel_without_them():
    def with_layout(value, gather_layout="four-corner"):
        return value

    def without_layout(value):
        return value

    assert sbs.variant_kwargs("ours", without_layout) == {}
    assert sbs.variant_kwargs("aws", without_layout) == {}
    assert sbs.variant_kwargs("ours-cb", with_layout) == {"gather_layout": "corner-block"}
    assert sbs.variant_kwargs("ours-4c", with_layout) == {"gather_layout": "four-corner"}
    with pytest.raises(ValueError, match="'ours-cb': expected without_layout to take gather_layout"):
        sbs.variant_kwargs("ours-cb", without_layout)
    with pytest.raises(ValueError, match="kernel: expected one of"):
        sbs.kernel_files("theirs", "fwd", None)


def test_each_of_our_variants_gets_its_own_side_by_side():
    aws = _record("aws", "fwd", "basic", 1, _timing(200, 150, 300))
    runs = {sbs.run_key("ours", "fwd", "basic", 1): _record("ours", "fwd", "basic", 1, _timing(100, 80, 120)),
            sbs.run_key("ours-cb", "fwd", "basic", 1): _record("ours-cb", "fwd", "basic", 1, _timing(50, 40, 60)),
            sbs.run_key("aws", "fwd", "basic", 1): aws}
    plain = sbs.side_by_side_table(runs, ["basic"], [1], ["fwd"]).splitlines()[2]
    cb = sbs.side_by_side_table(runs, ["basic"], [1], ["fwd"], ours_kernel="ours-cb").splitlines()[2]
    assert "| 0.50 |" in plain and "| 0.25 |" in cb
    del runs[sbs.run_key("ours-cb", "fwd", "basic", 1)]
    missing = sbs.side_by_side_table(runs, ["basic"], [1], ["fwd"], kernels=["ours-cb", "aws"],
                                     ours_kernel="ours-cb").splitlines()[2]
    assert "ours-cb: not run" in missing
    rendered = sbs.render({"runs": runs, "meta": {}}, ["basic"], [1], ["ours", "ours-cb", "aws"], ["fwd"])
    assert rendered.count("| shape | dir | LNC | ours before µs") == 2  # one side-by-side per variant
    assert "PARTIAL: no result for ours-cb/fwd/basic/lnc1" in rendered


def test_every_variant_of_ours_is_a_command_line_choice(capsys):
    """`--kernels ours-4c` was refused once while the docs' command used it."""
    assert set(sbs.OUR_VARIANTS) | {"aws"} == set(sbs.KERNELS)
    with pytest.raises(SystemExit):
        sbs.main(["--kernels", "not-a-variant", "--table-only"])
    for kernel in sbs.OUR_VARIANTS:  # --table-only prints from the cache, runs nothing
        assert sbs.main(["--kernels", kernel, "--table-only", "--shapes", "basic",
                         "--directions", "fwd", "--lnc", "1"]) == 0
        assert "| basic | fwd |" in capsys.readouterr().out
