"""The benchmark's figures are declared once (tritonstack/measure/figures.py): every
phase's result is declared there, the report refuses what is not, and
docs/performance.md's tables are the registry's. Pure: no server."""

import dataclasses
from dataclasses import dataclass

import pytest

from tests.conftest import PROJECT_ROOT
from tritonstack.benchmark import audio_cost, capacity, cost, region_speedup, serving_ratios, vs_peer
from tritonstack.experiments import interleaved
from tritonstack.measure import figures, figures_page, loadgen, results

# The figure groups that serving_ratios.run() merges into the benchmark's report.
BENCHMARK_PHASES = (
    serving_ratios.Machine,
    serving_ratios.RoundFigures,
    serving_ratios.ServerFigures,
    serving_ratios.SingleRequestFigures,
    serving_ratios.OpenLoopFigures,
    capacity.CapacityFigures,
    serving_ratios.Trace,
    serving_ratios.Int8Agreement,
    cost.CostFigures,
    cost.ServingCost,
    vs_peer.PeerFigures,
    loadgen.LoadGenFigures,
)
# The command line and write_results add these.
WRITTEN_AFTER_THE_PHASES = {"benchmark_seconds", "missed_targets", "inconclusive_targets"}


def test_docs_tables_are_the_registry():
    page = PROJECT_ROOT / "docs" / "performance.md"
    text = page.read_text()
    for group in figures.GROUPS:
        assert f"<!-- figures:{group} -->" in text, group
    assert figures_page.rendered_docs(text) == text, (
        "run `python -m tritonstack.measure.figures_page docs/performance.md`"
    )


@pytest.mark.parametrize("group", sorted(figures.GROUPS))
def test_a_group_declares_each_key_once_with_a_meaning(group):
    declared = figures.GROUPS[group]
    keys = figures.written_keys(declared)
    assert len(keys) == len(set(keys)), group
    for figure in declared:
        assert figure.meaning, figure.key
        assert figure.target is None or figure.target[0] in (">=", "<="), figure.key
        assert figure.ceiling is None or figure.ceiling in keys, figure.key


@pytest.mark.parametrize(
    ("phases", "declared", "outside"),
    [
        (BENCHMARK_PHASES, figures.BENCHMARK, WRITTEN_AFTER_THE_PHASES),
        ((region_speedup.RegionFigures,), figures.REGIONS, {"benchmark_seconds"}),
        ((audio_cost.AudioFigures,), figures.AUDIO, {"benchmark_seconds"}),
        ((interleaved.ModelComparison,), figures.COMPARE, set()),
    ],
)
def test_the_phases_measure_exactly_the_declared_figures(phases, declared, outside):
    fields = [field.name for phase in phases for field in dataclasses.fields(phase)]
    repeated = {name for name in fields if fields.count(name) > 1} - {figures.SUMMED}
    assert not repeated
    assert set(fields) == {figure.key for figure in declared} - outside
    for phase in phases:
        assert phase.__dataclass_params__.frozen, phase


def test_results_keys_targets_and_ceilings_come_from_the_registry():
    assert set(results.TARGETS) == {figure.key for figure in figures.BENCHMARK if figure.target}
    assert results.CEILINGS == {"int8_vs_fp32_ensemble": "int8_vs_fp32_ensemble_ceiling"} | {
        "dali_vs_pil_ensemble": "dali_vs_pil_ensemble_ceiling"
    }
    for key in results.RATIO_KEYS:
        assert {f"{key}{suffix}" for suffix in figures.MEDIAN_SUFFIXES} <= set(results.REQUIRED_KEYS), key
    assert all(key in serving_ratios.__doc__ for key in (figure.key for figure in figures.BENCHMARK))


@dataclass(frozen=True)
class _Rates:
    server_images_per_s: figures.Median
    errors: int


@dataclass(frozen=True)
class _Usage:
    server_rss_mb: float
    errors: int


def test_a_report_merges_the_phases_once():
    merged = figures.report(figures.BENCHMARK, _Usage(900.0, 1), _Rates(figures.Median.of([3.0, 1.0, 2.0]), 2))
    rates = {"server_images_per_s": 2.0, "server_images_per_s_spread": [1.0, 3.0]}
    rates |= {"server_images_per_s_interval": [1.0, 3.0], "server_images_per_s_n": 3}
    assert merged == {"errors": 3} | rates | {"server_rss_mb": 900.0}
    assert list(merged) == ["errors", *rates, "server_rss_mb"]
    assert figures.Median.of([]) == figures.Median(None, None, None, 0)


def test_a_report_refuses_an_undeclared_a_repeated_or_a_mistyped_figure():
    @dataclass(frozen=True)
    class Undeclared:
        images_per_fortnight: float

    @dataclass(frozen=True)
    class Bare:
        server_images_per_s: float

    with pytest.raises(KeyError, match="not declared"):
        figures.report(figures.BENCHMARK, Undeclared(1.0))
    with pytest.raises(KeyError, match="two phases"):
        figures.report(figures.BENCHMARK, _Usage(1.0, 0), _Usage(2.0, 0))
    with pytest.raises(TypeError, match="Median"):
        figures.report(figures.BENCHMARK, Bare(1.0))


def test_the_overload_figures_are_declared_for_the_lead_to_wire():
    named = {"goodput_share", "wasted_share", "answered_ms_p99", "refused_ms_p99", "recovery_s"}
    assert named | {"in_time", "refused", "late", "failed"} <= {figure.key for figure in figures.OVERLOAD}
    assert {"goodput_share", "in_time", "refused", "unresolved", "wrong"} <= {
        figure.key for figure in figures.OVERLOAD_SOAK
    }


def test_the_overload_phase_writes_exactly_its_declared_figures():
    from tritonstack.experiments.goodput import PhaseResult

    fields = {field.name for field in dataclasses.fields(PhaseResult)}
    assert fields == {figure.key for figure in figures.OVERLOAD}


def test_a_median_is_read_back_and_printed_one_way_everywhere():
    written = figures.Median.of([1.0, 1.2, 1.1]).written("ratio")
    median = figures.Median.read(written, "ratio")
    assert median == figures.Median.of([1.0, 1.2, 1.1])
    low, high = median.interval
    assert median.text() == f"1.100 [{low:.3f}, {high:.3f}] n=3"
    assert figures.Median.read({"ratio": 2.5}, "ratio").text(".1f") == "2.5"  # a single measure
    assert figures.Median.of([]).text() == "-"
