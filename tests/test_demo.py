"""`make demo` runs lhc_ina.demo: on a small bucket it must finish and find every aggregate exact."""

from __future__ import annotations

import json

import pytest
import torch

from lhc_ina import demo


def test_demo_reports_every_mode_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--workers", "3", "--length", "5000", "--density", "0.02"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(r["mode"], r["dtype"]) for r in rows} == {
        (m, d) for m in ("dense", "sketch", "union") for d in ("int32", "float32")
    }
    assert all(r["exact"] for r in rows)
    assert all(r["vs_dense"] < 1 for r in rows if r["mode"] != "dense")


def test_expected_total_detects_a_wrong_aggregate() -> None:
    inputs = demo.sparse_gradients(2, 64, 0.25, floats=False, seed=1)
    total = demo.expected_total(inputs, None)
    assert torch.equal(total, inputs[0] + inputs[1])
    assert not torch.equal(total + (total == 0).int(), demo.expected_total(inputs, None))
