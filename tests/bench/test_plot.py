"""nkilib_msda.bench.plot (benchmarks/bench_plot.py) on a synthetic results.json: bars carry the run's numbers, the legend
names exactly the series measured in that run and covers no bar (no GPU needed)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is an optional dependency (pip install .[bench])")

from nkilib_msda.bench import plot as bench_plot  # noqa: E402


def _row(shape, dtype, impl, mode, method, us):
    return dict(shape=shape, impl=impl, dtype=dtype, mode=mode, method=method, us=us, err=None,
                bytes=1, floor_us=1.0, err_detail="", host_us=None, tb_s=1.0, over_floor=1.0)


def _results(with_ref: bool):
    rows = []
    for k, (shape, dtype) in enumerate((("ddetr-encoder", "bfloat16"), ("ddetr-decoder", "float32"))):
        for mode, base in (("fwd", 11.6 + k * 100), ("fwd+bwd", 234.0 + k)):
            rows += [_row(shape, dtype, "ours", mode, "do_bench", base),
                     _row(shape, dtype, "ours", mode, "graph", base / 2),
                     _row(shape, dtype, "triton", mode, "do_bench", base * 0.9),  # not plotted
                     _row(shape, dtype, "ours-det", mode, "do_bench", base * 3)]  # not plotted
            if with_ref and k == 0:
                rows.append(_row(shape, dtype, "ref", mode, "do_bench", base * 20))
    return {"device": "NVIDIA H200, synthetic", "command": "python benchmarks/bench_gpu.py --test",
            "rows": rows}


def _bars(fig):
    return [p for ax in fig.axes for p in ax.patches]


@pytest.mark.parametrize("with_ref", [True, False])
def test_plot_draws_the_runs_numbers_with_a_legend_beside_the_bars(tmp_path, with_ref):
    results = _results(with_ref)
    source = tmp_path / "results.json"
    source.write_text(json.dumps(results))
    target = tmp_path / "plot.png"
    fig = bench_plot.plot(bench_plot.load(source), target)
    assert target.stat().st_size > 10_000

    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    expected = [bench_plot.SERIES[("ours", "do_bench")], bench_plot.SERIES[("ours", "graph")]]
    if with_ref:
        expected.append(bench_plot.SERIES[("ref", "do_bench")])
    assert labels == expected  # only what the run measured; triton / ours-det rows not drawn

    plotted = sorted(round(p.get_height(), 6) for p in _bars(fig))
    wanted = sorted(round(r["us"], 6) for r in results["rows"]
                    if (r["impl"], r["method"]) in bench_plot.SERIES)
    assert plotted == wanted

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend_box = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not legend_box.overlaps(ax.get_window_extent(renderer))
    for bar in _bars(fig):
        assert not legend_box.overlaps(bar.get_window_extent(renderer))


def test_plot_refuses_results_without_plotted_series(tmp_path):
    with pytest.raises(ValueError, match="no rows of the plotted series"):
        bench_plot.plot({"rows": [_row("ddetr-decoder", "float32", "triton", "fwd", "do_bench", 1.0)]},
                        tmp_path / "x.png")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(ValueError, match="rows"):
        bench_plot.load(bad)


def test_main_writes_beside_the_results(tmp_path):
    source = tmp_path / "results.json"
    source.write_text(json.dumps(_results(True)))
    assert bench_plot.main([str(source)]) == 0
    assert (tmp_path / "bench_gpu.png").exists()
    assert bench_plot.main([]) == 2
