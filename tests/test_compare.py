"""tritonstack/experiments/interleaved.py measures two real servers in interleaved rounds and writes
what it promises (the shortest settings: figures are rough, keys are real).
Performance itself is never asserted here."""

import json

import pytest

from tritonstack.commands import compare as compare_command
from tritonstack.experiments import interleaved

ENSEMBLE = "ensemble_dali_efficientnet_lite0"


def compared(repository, out, *load: str) -> dict:
    """Two short rounds on one repository, B one environment variable apart: one with A
    first, one with B first (the interleaving), the fewest a spread is made of."""
    code = compare_command.main(
        [
            "--a-repository",
            str(repository),
            "--b-env",
            "DALI_MALLOC_POOL_THRESHOLD=0",
            "--b-server-arg=--metrics-config=summary_latencies=false",
            "--model",
            ENSEMBLE,
            "--rounds",
            "2",
            "--warmup-s",
            "0.3",
            *load,
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return json.loads(out.read_text())


def test_two_servers_interleaved(lite0_repository, tmp_path, capsys):
    written = compared(lite0_repository, tmp_path / "compare.json", "--seconds", "1", "--concurrency", "4")
    figures = written["models"][ENSEMBLE]
    for side in interleaved.SIDES:
        assert figures[f"{side}_images_per_s"] > 1 and figures[f"{side}_errors"] == 0
        assert 0 < figures[f"{side}_ms_p50"] <= figures[f"{side}_ms_p99"]
        assert "stub:preprocess_dali_efficientnet_lite0" in written["server_rss_mb_by_process"][side]
    low, high = figures["b_over_a_spread"]
    assert low <= figures["b_over_a"] <= high
    assert figures["b_over_a_interval"] == pytest.approx([low, high])  # at 2 rounds: the range
    assert figures["b_over_a_n"] == 2
    assert figures["b_over_a_verdict"] in ("faster", "slower", "inconclusive")
    assert written["b"]["environment"] == {"DALI_MALLOC_POOL_THRESHOLD": "0"} and written["a"]["environment"] == {}
    assert written["a"]["repository"] == written["b"]["repository"] == str(lite0_repository)  # as given
    assert written["a"]["layout"] == written["b"]["layout"] == "repository"
    assert written["b"]["server_args"] == ["--metrics-config=summary_latencies=false"]
    assert written["a"]["server_args"] == []
    assert "| " + ENSEMBLE in capsys.readouterr().out


def test_an_open_loop_at_a_rate(lite0_repository, tmp_path):
    """--rate: Poisson arrivals instead of a closed loop, p99 compared per round."""
    written = compared(lite0_repository, tmp_path / "compare.json", "--seconds", "1.5", "--rate", "20")
    assert written["settings"]["rate"] == 20 and written["settings"]["concurrency"] is None
    figures = written["models"][ENSEMBLE]
    for side in interleaved.SIDES:  # an open loop sends rate x seconds requests, whatever the server does
        assert 10 <= figures[f"{side}_images_per_s"] * 1.5 <= 40 and figures[f"{side}_errors"] == 0
    low, high = figures["b_over_a_ms_p99_spread"]
    assert 0 < low <= figures["b_over_a_ms_p99"] <= high


def test_the_same_server_twice_is_refused(lite0_repository, tmp_path):
    assert compare_command.main(["--a-repository", str(lite0_repository), "--out", str(tmp_path / "x.json")]) == 2
    same_recycling = ["--a-recycle-above-mib", "64", "--b-recycle-above-mib", "64"]
    assert (
        compare_command.main(
            ["--a-repository", str(lite0_repository), *same_recycling, "--out", str(tmp_path / "x.json")]
        )
        == 2
    )
    assert not (tmp_path / "x.json").exists()
    assert interleaved.recycle_policy(0) is None and interleaved.recycle_policy(None) == interleaved.RecyclePolicy()


def test_a_rate_must_be_positive(lite0_repository, tmp_path):
    for rate in ("0", "-3", "inf"):
        with pytest.raises(SystemExit) as refused:
            compare_command.main(
                [
                    "--a-repository",
                    str(lite0_repository),
                    "--b-env",
                    "X=1",
                    "--rate",
                    rate,
                    "--out",
                    str(tmp_path / "x.json"),
                ]
            )
        assert refused.value.code == 2
    assert not (tmp_path / "x.json").exists()


def test_an_environment_assignment_needs_a_name():
    assert interleaved.environment_assignment("A_B=1=2") == ("A_B", "1=2")
    for text in ("NOVALUE", "=1", "1A=2"):
        with pytest.raises(Exception, match="NAME=VALUE"):
            interleaved.environment_assignment(text)
