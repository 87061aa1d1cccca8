"""The benchmark suites run end to end on small cases and print the figures they promise (as JSON).

They measure nothing here: speed is read from `make bench`, never asserted in a test.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.cli import main

CODEC_FIELDS = {
    "encode_s", "decode_s", "memcpy_s", "bytes_per_worker", "dense_bytes", "info_bound_bytes", "exact",
    "rounds", "candidates", "residue", "native_kernels",
}


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_codec_benchmark_prints_every_case_and_the_peeling_trials(capsys):
    argv = ["codec", "--length", "30000", "--density", "0.01,0.05", "--block", "1,4", "--repeats", "1",
            "--mode", "sketch,union,dense", "--peel-trials", "3"]
    assert main(argv) == 0
    lines = _json_lines(capsys.readouterr().out)
    cases, trials = lines[:-1], lines[-1]
    assert len(cases) == 2 * 2 * 3
    for case in cases:
        assert case.keys() >= CODEC_FIELDS
        assert case["exact"] is True
        assert case["bytes_per_worker"] > 0 and case["info_bound_bytes"] > 0
    assert {c["mode"] for c in cases} == {"sketch", "union", "dense"}
    assert trials["peel_trials"] == 3
    assert trials["failures"] == 0, "peeling failed at the default margin (0 in 1000 trials measured)"
    assert trials["cells_per_candidate"] > 1.22


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
