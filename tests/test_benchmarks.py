"""The benchmark suites run end to end on small cases and print the figures they promise (as JSON).

They measure nothing here: speed is read from `make bench`, never asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks import aggregate
from benchmarks.aggregate_gloo import float_sum_check
from benchmarks.cli import main
from host_agent.codec.gpu import triton_available

CODEC_FIELDS = {
    "encode_s", "decode_s", "memcpy_s", "bytes_per_worker", "dense_bytes", "info_bound_bytes", "exact",
    "rounds", "candidates", "residue", "native_kernels",
}


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_codec_benchmark_prints_every_case_and_the_peeling_trials(capsys, tmp_path: Path):
    plot = tmp_path / "plots" / "codec.png"  # its folder made where missing
    argv = ["codec", "--length", "30000", "--density", "0.01,0.05", "--block", "1,4", "--repeats", "1",
            "--mode", "sketch,union,dense", "--peel-trials", "3", "--plot", str(plot)]
    assert main(argv) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = _json_lines(capsys.readouterr().out)
    cases, trials = lines[:-1], lines[-1]
    assert len(cases) == 2 * 2 * 3
    for case in cases:
        assert case.keys() >= CODEC_FIELDS
        assert case["exact"] is True
        assert case["bytes_per_worker"] > 0 and case["info_bound_bytes"] > 0
        assert "decode.output" in case["stage_s"] and case["simd"] in ("avx2", "scalar")
        assert sum(case["stage_s"].values()) <= case["decode_s"] * (1 + 1e-9)  # one repeat: parts of it
        if triton_available():  # the GPU path's launches, counted in Triton's interpreter
            stages = ("encode", "decode", "transfer")
            assert set(case["gpu_launches"]) == {*stages, *(f"{stage}_waits" for stage in stages)}
            assert 0 < case["gpu_launches"]["decode"] <= 64
            # docs/codec.md: a sparse encode never waits for the host; a dense one reads its lead back once
            assert case["gpu_launches"]["encode_waits"] == (1 if case["mode"] == "dense" else 0)
        else:
            assert case["gpu_launches"] is None
    assert {c["mode"] for c in cases} == {"sketch", "union", "dense"}
    assert trials["peel_trials"] == 3
    assert trials["failures"] == 0, "peeling failed at the default margin (0 in 1000 trials measured)"
    assert trials["cells_per_candidate"] > 1.22


@pytest.mark.slow
def test_codec_benchmark_puts_the_kernels_beside_the_torch_code(capsys):
    argv = ["codec", "--length", "30000", "--repeats", "1", "--mode", "sketch,union",
            "--kernels", "native,torch"]
    assert main(argv) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [(r["kernels"], r["mode"]) for r in rows] == [
        ("native", "sketch"), ("native", "union"), ("torch", "sketch"), ("torch", "union")]
    assert [r["native_kernels"] for r in rows] == [True, True, False, False]
    for native, torch_code in zip(rows[:2], rows[2:], strict=True):
        assert native["exact"] and torch_code["exact"]
        assert native["bytes_per_worker"] == torch_code["bytes_per_worker"]  # the same words on the wire


@pytest.mark.parametrize("case", ["pipeline", "udp"])
def test_switch_benchmark_reports_rates_of_both_pipelines(case, capsys):
    from softswitch.native import native_available

    assert main(["switch", "--case", case, "--seconds", "0.3", "--json"]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert [row["pipeline"] for row in rows] == ["python"] + (["native"] if native_available() else [])
    for row in rows:
        assert row["case"] == case and row["packets_per_s"] > 0
        assert row["exact"] is True, "every result copy must carry the workers' sum"
        assert row["result_copies"] == row["rounds"] * row["workers"]
    if len(rows) == 2:
        ratio = rows[1]["packets_per_s"] / rows[0]["packets_per_s"]
        assert rows[1]["native_over_python"] == pytest.approx(ratio, abs=0.01)


@pytest.mark.parametrize("bad", [["--mode", "foo"], ["--workers", "40"], ["--block", "0"], ["--density", "2"],
                                 ["--repeats", "0"], ["--margin", "-1"]])
def test_codec_benchmark_refuses_bad_arguments_by_name(bad: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["codec", *bad])
    assert exit_info.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_udp_benchmark_reports_every_way_of_both_tests(capsys) -> None:
    from lhc_ina.udp import native_udp_available

    assert main(["udp", "--seconds", "0.2", "--batch", "8", "--json"]) == 0
    rows = [r for r in _json_lines(capsys.readouterr().out) if "test" in r]
    ways = ["per-datagram", "python-batch"] + (["native-batch"] if native_udp_available() else [])
    assert [(r["test"], r["way"]) for r in rows] == [(t, w) for t in ("send", "echo") for w in ways]
    for row in rows:
        assert row["datagrams"] > 0 and row["datagrams_per_s"] > 0
        assert row["speedup_vs_per_datagram"] > 0
    assert all("lost" in r for r in rows if r["test"] == "echo")


@pytest.mark.parametrize("bad", [["--batch", "0"], ["--batch", "2000"], ["--size", "70000"],
                                 ["--seconds", "0"], ["--ways", "turbo"], ["--tests", "send,x"]])
def test_udp_benchmark_refuses_bad_arguments_by_name(bad: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["udp", *bad])
    assert exit_info.value.code == 2
    assert bad[0] in capsys.readouterr().err


AGGREGATE_FIELDS = {
    "mode", "seconds", "elements_per_s", "dense_elements_per_s", "gloo_elements_per_s", "speedup_vs_dense",
    "speedup_vs_gloo", "bytes_per_worker", "reference", "exact", "max_error", "tolerance", "within_tolerance",
}


def test_aggregate_benchmark_has_gloo_and_hosts_rows_beside_the_switch_modes(capsys, tmp_path: Path) -> None:
    """Gloo's allreduce within float rounding, and the codec's dense mode over the same process group
    exact, as the switch's modes are."""
    plot = tmp_path / "aggregate.png"
    argv = ["aggregate", "--length", "20000", "--density", "0.01", "--workers", "2",
            "--modes", "dense,sketch", "--repeats", "1", "--json", "--plot", str(plot)]
    assert main(argv) == 0
    rows = {r["mode"]: r for r in _json_lines(capsys.readouterr().out)}
    assert list(rows) == ["dense", "sketch", "gloo", "hosts"]
    for row in rows.values():
        assert row.keys() >= AGGREGATE_FIELDS, row
        assert row["within_tolerance"] is True
        # the speedups are time ratios against the baselines' rows of the same run
        assert row["speedup_vs_dense"] == pytest.approx(rows["dense"]["seconds"] / row["seconds"])
        assert row["speedup_vs_gloo"] == pytest.approx(rows["gloo"]["seconds"] / row["seconds"])
    gloo = rows["gloo"]
    assert gloo["speedup_vs_gloo"] == 1.0 and gloo["tolerance"] > 0 and gloo["bytes_per_worker"] is None
    assert gloo["max_error"] <= gloo["tolerance"]
    for mode in ("dense", "sketch", "hosts"):
        assert rows[mode]["exact"] is True and rows[mode]["max_error"] == rows[mode]["tolerance"] == 0.0
    assert rows["hosts"]["chosen"] == ["dense"] and rows["hosts"]["bytes_per_worker"] is None
    assert plot.stat().st_size > 0


def test_float_sum_check_allows_rounding_and_catches_a_wrong_sum() -> None:
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(4096, generator=generator) * 10.0 ** (i % 4 - 2) for i in range(8)]  # |x| <~ 400
    forward, backward = torch.zeros(4096), torch.zeros(4096)
    for x in inputs:
        forward += x
    for x in reversed(inputs):
        backward += x
    for total in (forward, backward):  # float32 sums in two orders: rounding, not errors
        check = float_sum_check(total, inputs)
        assert check["max_error"] <= check["tolerance"]
    assert not (float_sum_check(forward, inputs)["exact"] and float_sum_check(backward, inputs)["exact"])
    wrong = forward.clone()
    wrong[17] += 1e-2  # the tolerance: 8 workers * 2^-24 * sum|x| <~ 2e-4
    assert float_sum_check(wrong, inputs)["max_error"] > float_sum_check(wrong, inputs)["tolerance"]
    missing = sum(inputs[1:], torch.zeros(4096))  # a worker's contribution lost
    assert float_sum_check(missing, inputs)["max_error"] > float_sum_check(missing, inputs)["tolerance"]


@pytest.mark.parametrize("error", [1e-6, math.nan])
def test_aggregate_summary_fails_a_gloo_row_beyond_its_tolerance(error: float) -> None:
    args = argparse.Namespace(modes=["dense"], length=100, workers=2, loss=0.0, engine=None, per_process=0)
    switch = {"chosen": "dense", "seconds": 2.0, "bytes_per_worker": 500, "retransmissions": 0,
              "encode_s": 0.1, "network_s": 1.8, "decode_s": 0.1, "reference": "quantized integer sum",
              "exact": True, "max_error": 0.0, "tolerance": 0.0}
    gloo = {"chosen": "gloo", "seconds": 0.5, "bytes_per_worker": None, "retransmissions": None,
            "encode_s": None, "network_s": None, "decode_s": None, "reference": "float64 sum",
            "exact": False, "max_error": 1e-9, "tolerance": 1e-8}
    rows = [{**switch, "mode": "dense"}, {**switch, "mode": "dense"}, {**gloo, "mode": "gloo"},
            {**gloo, "mode": "gloo", "max_error": error}]
    dense_row, gloo_row = aggregate._summarize(args, 0.01, rows, 0.0, None)
    assert dense_row["within_tolerance"] is True and dense_row["speedup_vs_gloo"] == 0.25
    assert gloo_row["speedup_vs_dense"] == 4.0 and gloo_row["bytes_per_worker"] is None
    assert gloo_row["within_tolerance"] is False
    assert gloo_row["max_error"] == error or (math.isnan(error) and math.isnan(gloo_row["max_error"]))


def test_aggregate_runs_jobs_past_one_switch_several_workers_per_process() -> None:
    # 5 workers, 2 per process, a process's workers under one leaf (their addresses)
    assert aggregate._processes(5, 2, ["a", "a", "a", "b", "b"]) == [
        (2, ["--ip", "a"]), (1, ["--ip", "a"]), (2, ["--ip", "b"])]
    assert aggregate._processes(3, 1, None) == [(1, [])] * 3
    parser = argparse.ArgumentParser()
    aggregate.add_arguments(parser)
    big = parser.parse_args(["--workers", "64"])
    assert "one switch holds 32" in aggregate._check(big) and aggregate.per_process(big) == 8
    assert aggregate.single_workers(big) == 32
    assert "a leaf holds 32" in aggregate._check(parser.parse_args(
        ["--workers", "65", "--topology", "leafspine", "--leaves", "2"]))
    fabric = parser.parse_args(["--workers", "64", "--topology", "leafspine", "--leaves", "4"])
    assert aggregate._check(fabric) is None
