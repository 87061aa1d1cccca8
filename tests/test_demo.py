"""lhc_demo.codec_check: on a small bucket it must finish and find every aggregate exact."""

from __future__ import annotations

import json

import pytest
import torch

from lhc_demo import codec_check as demo


def test_demo_reports_every_mode_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--workers", "3", "--length", "5000", "--density", "0.02"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(r["mode"], r["dtype"]) for r in rows} == {
        (m, d) for m in ("dense", "sketch", "union") for d in ("int32", "float32")
    }
    assert all(r["exact"] for r in rows)
    assert all(r["vs_dense"] < 1 for r in rows if r["mode"] != "dense")


def test_a_corrupted_aggregate_is_reported_inexact(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = demo.sparse_gradients(3, 256, 0.1, floats=False, seed=1)
    real = demo.aggregate_local

    def off_by_one(xs, **kwargs):
        result = real(xs, **kwargs)
        result.total[7] += 1
        return result

    monkeypatch.setattr(demo, "aggregate_local", off_by_one)
    assert demo.run_case(inputs, "sketch", block=1)["exact"] is False


def test_expected_total_of_floats_is_the_dequantized_integer_sum() -> None:
    inputs = demo.sparse_gradients(2, 64, 0.25, floats=True, seed=2)
    total = demo.expected_total(inputs, 20)
    assert torch.allclose(total, inputs[0] + inputs[1], atol=2 * 2.0**-20)
    assert not torch.equal(total, inputs[0] + inputs[1])  # quantized: not the float sum itself
