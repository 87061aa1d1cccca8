"""The paper's four models (benchmarks/models) and `lhc-bench train`: tiny configurations trained through
softswitch exactly as dense, and the PowerSGD and top-k hook states carried through a checkpoint."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

from benchmarks import train
from benchmarks.models import MODELS, build
from benchmarks.train_summary import main as summary_main
from benchmarks.train_summary import summarize
from benchmarks.train_ways import BY_NAME, ways_for
from lhc_launch.processes import ControllerProcess, SoftswitchProcess

REPO = Path(__file__).resolve().parent.parent
#: the full configurations' parameter counts (the paper's models; docs/results.md)
FULL_PARAMETERS = {"ncf": 7_206_801, "lstm": 19_780_400, "vgg19": 20_040_522, "bert": 109_219_386}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_tiny_configurations_are_a_few_thousand_parameters_and_seeded(name: str) -> None:
    first, again, other = build(name, "tiny", 0), build(name, "tiny", 0), build(name, "tiny", 1)
    assert 1_000 <= first.parameters() <= 25_000, first.parameters()
    def equal(one: torch.nn.Module, two: torch.nn.Module) -> bool:
        return all(torch.equal(a, b) for a, b in zip(one.parameters(), two.parameters(), strict=True))

    assert equal(first.module, again.module), "the same seed gives the same weights"
    assert not equal(first.module, other.module)
    batch, repeated = first.batch(1, 3), again.batch(1, 3)
    assert all(torch.equal(a, b) for a, b in zip(batch, repeated, strict=True))
    assert not torch.equal(batch[0], first.batch(0, 3)[0]), "each rank its own batch"
    assert torch.isfinite(first.loss(first.module, batch))


def test_the_full_configurations_are_the_papers() -> None:
    """Counted on the meta device: no memory for BERT-base's 109 M parameters."""
    with torch.device("meta"):
        counts = {name: build(name, "full").parameters() for name in FULL_PARAMETERS}
    assert counts == FULL_PARAMETERS


def test_a_size_a_model_lacks_is_refused_by_name() -> None:
    assert build("bert", "small").parameters() == 11_103_290
    with pytest.raises(ValueError, match="ncf has no size 'small'"):
        build("ncf", "small")
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build("resnet", "tiny")


def test_top_k_is_offered_for_the_dense_models_only() -> None:
    dense = {name for name in MODELS if build(name, "tiny").dense_gradients}
    assert dense == {"vgg19", "bert"}
    assert "lhc_topk" in [way.name for way in ways_for(True)]
    assert "lhc_topk" not in [way.name for way in ways_for(False)]
    assert all(way.lossy for way in ways_for(True) if way.topk_ratio or way.hook == "powersgd")


def test_the_emulation_offers_the_same_models() -> None:
    text = (REPO / "mininet" / "run.py").read_text()
    choices = re.search(r'"--model", choices=\(([^)]*)\)', text).group(1)
    assert set(re.findall(r'"(\w+)"', choices)) == set(MODELS)


def _rank(way: str, losses: list[list[float]]) -> dict:
    return {"way": way, "rank": 0, "world": 2, "model": "ncf", "size": "tiny", "config": {}, "parameters": 4,
            "losses": losses, "step_s": [0.1, 0.1, 0.1], "bytes_per_step": [10, 10, 10], "bytes_basis": "",
            "modes": [], "aggregate_s": [], "density": {"0": [1, 4]}}


def test_the_summary_says_when_lhc_differs_from_dense() -> None:
    same = [[0.5, 0.25, 0.125], [0.5, 0.25, 0.125]]
    off = [[0.5, 0.25, 0.125], [0.5, 0.25, 0.12500001]]
    runs = {way: [_rank(way, same)] for way in ("ddp", "dense")}
    assert summarize({**runs, "lhc": [_rank("lhc", same)]})["lhc_losses_equal_dense"] is True
    result = summarize({**runs, "lhc": [_rank("lhc", off)]})
    assert result["lhc_losses_equal_dense"] is False
    assert result["ways"][0]["gradient_density"] == 0.25
    fastest = summarize({**runs, "lhc_fastest": [_rank("lhc_fastest", off)]})
    assert fastest["lhc_losses_equal_dense"] is False  # the faster-path way is held to dense too
    assert summarize({"ddp": runs["ddp"], "lhc": [_rank("lhc", same)]})["lhc_losses_equal_dense"] is None


def test_the_summary_times_the_fastest_path_once_its_trials_are_over() -> None:
    """lhc_fastest's first five steps are each bucket's warm-up call and its four trials (two on the
    hosts): its mean starts at step 5, the other ways' at step 2; peak memory is the ranks' largest, CPU
    time per step their mean over the same steps."""
    losses = [[0.5] * 7]
    runs = {way: [{**_rank(way, losses), "step_s": [9.0] * 5 + [1.0, 1.0], "bytes_per_step": [10] * 7,
                   "resident_mb": [100.0, 300.0, None, 200.0, 200.0, 200.0, 200.0],
                   "cpu_s": [5.0] * 5 + [cpu, cpu]} for cpu in (0.5, 1.5)]
            for way in ("ddp", "lhc_fastest")}
    rows = {row["way"]: row for row in summarize(runs)["ways"]}
    assert rows["ddp"]["step_s"] == (9.0 * 3 + 1.0 + 1.0) / 5 and rows["ddp"]["timed_from_step"] == 2
    assert rows["lhc_fastest"]["step_s"] == 1.0 and rows["lhc_fastest"]["timed_from_step"] == 5
    assert rows["lhc_fastest"]["peak_resident_mb_per_worker"] == 300.0
    assert rows["lhc_fastest"]["cpu_s_per_worker_step"] == 1.0
    assert rows["ddp"]["cpu_s_per_worker_step"] == (5.0 * 3 + 1.0 + 1.0) / 5


def test_the_summaries_plot_as_lines_and_as_bars(tmp_path: Path, monkeypatch) -> None:
    """Both figures from summaries of two runs of one model, one of them with packing off: the PNGs are
    written, and each summary says how its long sums went."""
    monkeypatch.setenv("LHC_PACKING", "never")
    losses = [[0.5] * 3]
    runs = {way: [{**_rank(way, losses), "step_s": [1.0, 1.0, times]}] for way, times in
            (("ddp", 1.0), ("lhc_fastest", 0.5))}
    off = summarize(runs)
    assert off["lhc_packing"] == "never"
    monkeypatch.delenv("LHC_PACKING")
    rows = tmp_path / "rows.jsonl"
    summaries = (summarize(runs), off)
    rows.write_text("\n".join(json.dumps({**summary, "bw_mbit": 1000.0}) for summary in summaries))
    lines, bars = tmp_path / "lines.png", tmp_path / "bars.png"
    assert summary_main([str(rows), "--plot", str(lines), "--bars", str(bars)]) == 0
    assert lines.read_bytes()[:4] == bars.read_bytes()[:4] == b"\x89PNG"


def test_speedups_compare_the_same_steps() -> None:
    """DDP timed from step 2 and lhc_fastest from step 5: the speedup divides their times over steps 5+
    only, so a drift between step 2 and step 5 (here DDP's steps slowing) favours neither."""
    losses = [[0.5] * 8]
    steps = {"ddp": [9.0, 9.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0], "lhc_fastest": [9.0] * 5 + [1.6, 1.6, 1.6]}
    runs = {way: [{**_rank(way, losses), "step_s": times, "bytes_per_step": [10] * 8}]
            for way, times in steps.items()}
    rows = {row["way"]: row for row in summarize(runs)["ways"]}
    assert rows["ddp"]["step_s"] == 1.5  # its own mean, from step 2
    assert rows["lhc_fastest"]["speedup_vs_ddp"] == pytest.approx(2.0 / 1.6)  # not 1.5 / 1.6
    assert rows["ddp"]["speedup_vs_ddp"] == 1.0


def _args(**options: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--model", "ncf", "--tiny", "--workers", "2", "--json"])
    for name, value in options.items():
        setattr(args, name, value)
    return args


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("controller")
    with SoftswitchProcess() as switch, ControllerProcess(switch, state) as running:
        yield running


#: the ways the straight run trains every tiny model; the checkpoint test resumes the last two
WAYS = ["dense", "lhc", "lhc_fastest", "powersgd", "lhc_topk"]
STEPS, RESUME_AT = 5, 3


@pytest.fixture(scope="module")
def straight(controller, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """2 workers, 5 uninterrupted steps of every tiny model every way of ``WAYS`` (one set of processes);
    lhc_fastest times one call of each path (``LHC_PATH_TRIALS=1``), so that it settles from step 3."""
    folder = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LHC_PATH_TRIALS", "1")
        return train.run_ways(_args(steps=STEPS), sorted(MODELS), WAYS, controller, folder)


@pytest.mark.slow
def test_every_tiny_model_trains_through_softswitch_as_dense_bit_for_bit(straight: dict) -> None:
    """lhc auto's losses, on the switch and with each bucket on its faster path, equal
    dense-through-the-switch's on every rank and step, bit for bit, for each tiny model; the lhc run
    measured its gradient's density."""
    for name, ways in straight.items():
        assert [r["losses"] for r in ways["lhc"]] == [r["losses"] for r in ways["dense"]], name
        # each bucket on its faster path (its trials, then settled from step 3): still dense's bits
        assert [r["losses"] for r in ways["lhc_fastest"]] == [r["losses"] for r in ways["dense"]], name
        settled = ways["lhc_fastest"][0]["settled_paths"]  # every bucket, its path and the trials' sums
        assert settled and all(why.split()[0] in ("switch", "host") and " ms" in why
                               for why in settled.values())
        assert all(len(r["losses"][0]) == STEPS for r in ways["lhc"])
        assert ways["lhc"][0]["modes"] and ways["dense"][0]["modes"] == ["dense"], name
        result = summarize(ways)
        assert result["lhc_losses_equal_dense"] is True
        assert 0 < result["gradient_density"]["overall"] <= 1, result


@pytest.mark.slow
def test_powersgd_and_top_k_states_survive_a_checkpoint(controller, straight: dict, tmp_path: Path) -> None:
    """VGG19 tiny: a run that checkpoints before step 3 (PowerSGD compressing since step 2, with its error
    feedback and warm-started matrices; top-k's residuals) and continues from fresh objects loaded from the
    checkpoint gives the uninterrupted run's losses bit for bit (step 4's would show a state lost)."""
    ways = ["powersgd", "lhc_topk"]
    resumed = train.run_ways(_args(steps=STEPS, resume_at=RESUME_AT), ["vgg19"], ways, controller, tmp_path)
    for way in ways:
        assert BY_NAME[way].lossy
        losses = [r["losses"] for r in resumed["vgg19"][way]]
        assert losses == [r["losses"] for r in straight["vgg19"][way]], way
