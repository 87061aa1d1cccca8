"""lhc_demo.codec_check: on a small bucket it must finish and find every aggregate exact. The training
demo's held-out AUC: computed right; a short run (one run, shared by its tests) learns, lhc's AUC equal
to dense's, and trains exactly through the switch with fewer bytes."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lhc_demo import codec_check as demo
from lhc_demo.metrics import roc_auc
from lhc_demo.recsys import DemoConfig, SyntheticClicks

REPO = Path(__file__).resolve().parent.parent


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


def _pairwise_auc(scores: list[float], labels: list[int]) -> float:
    """AUC by its definition: over every (positive, negative) pair, 1 if ranked right, 1/2 if tied."""
    positives = [s for s, y in zip(scores, labels, strict=True) if y]
    negatives = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(positives, negatives))
    return wins / (len(positives) * len(negatives))


@pytest.mark.parametrize("seed", range(5))
def test_auc_equals_the_pairwise_definition_with_ties(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 8, (200,), generator=generator).float()  # many ties
    labels = (torch.rand(200, generator=generator) < 0.4).float()
    expected = _pairwise_auc(scores.tolist(), labels.tolist())
    assert roc_auc(scores, labels) == pytest.approx(expected, abs=1e-12)


def test_auc_of_perfect_reversed_and_constant_scores() -> None:
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])
    scores = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    assert roc_auc(scores, labels) == 1.0
    assert roc_auc(-scores, labels) == 0.0
    assert roc_auc(torch.zeros(5), labels) == 0.5
    with pytest.raises(ValueError, match="both"):
        roc_auc(scores, torch.ones(5))


def test_the_held_out_set_is_no_training_batch() -> None:
    data = SyntheticClicks(DemoConfig(held_out=256))
    users, _, clicked = data.held_out()
    assert users.numel() == 256 and 0 < clicked.mean() < 1
    assert all(not torch.equal(users, data.batch(rank, 0)[0]) for rank in range(4))
    with pytest.raises(ValueError):
        data.batch(SyntheticClicks.HELD_OUT_RANK, 0)


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One shortened ``make demo`` (2 workers, 6 steps, the switch killed after step 3 of the lhc run, so
    that one run also proves the fallback: steps 0-3 went through the switch) for every test of it: its
    summary and its output folder."""
    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "lhc_demo.train", "--workers", "2", "--steps", "6", "--json",
         "--out", str(out), "--kill-switch-at", "3"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), out


@pytest.mark.slow
def test_a_short_demo_learns_and_lhc_evaluates_as_dense(short_demo: tuple[dict, Path]) -> None:
    """After 6 steps of 2 workers the held-out AUC is well above chance in every run (about 0.70
    measured), and lhc's equals dense-through-the-switch's on every step: the same parameters."""
    summary, out = short_demo
    assert summary["losses_match"] is True and summary["aucs_match"] is True
    assert abs(summary["initial_auc"] - 0.5) < 0.05, "the untrained model ranks at about chance"
    for run in ("ddp", "dense", "lhc"):
        assert summary["last_auc"][run] >= 0.65, summary
        assert summary["last_auc"][run] > summary["first_auc"][run], summary
    assert summary["last_auc"]["lhc"] == summary["last_auc"]["dense"]
    assert abs(summary["last_auc"]["lhc"] - summary["last_auc"]["ddp"]) < 1e-3
    runs = json.loads((out / "runs.json").read_text())
    assert [r["auc"] for r in runs["lhc"]] == [r["auc"] for r in runs["dense"]]
    assert all(len(r["auc"]) == 6 for ranks in runs.values() for r in ranks)


@pytest.mark.slow
def test_a_short_demo_trains_exactly_through_the_switch(short_demo: tuple[dict, Path]) -> None:
    """lhc's losses equal dense-through-the-switch's bit for bit, with at least 5x fewer bytes, and the
    plot is written."""
    summary, out = short_demo
    assert summary["losses_match"] is True
    assert summary["bytes_ratio"] >= 5, summary
    assert summary["steps"] == 6 and summary["workers"] == 2
    assert (out / "demo.png").stat().st_size > 0


@pytest.mark.slow
def test_a_demo_whose_switch_is_killed_mid_run_goes_on_over_the_hosts(short_demo: tuple[dict, Path]) -> None:
    """The short demo runs with ``--kill-switch-at 3``: the switch is killed (-9) after step 3 of the lhc
    run and stays dead; the run finishes over the hosts with the dense run's losses bit for bit (the test
    above), the summary lists the steps on the hosts and one fallback, and the plot shades them."""
    summary, out = short_demo
    assert summary["lhc_host_steps"] and min(summary["lhc_host_steps"]) >= 3, summary
    assert summary["lhc_host_steps"][-1] == 5, summary
    assert summary["lhc_path_changes"] == {"fallbacks": 1, "returns": 0}, summary
    runs = json.loads((out / "runs.json").read_text())
    assert all(not any(r["host_steps"]) for ranks in (runs["ddp"], runs["dense"]) for r in ranks
               if "host_steps" in r)
