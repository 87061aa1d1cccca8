"""The TNA program through a Tofino compiler (marked ``bf_p4c``).

- bf-p4c compiles ``p4src/tna/lhc.p4`` for Tofino-1 without a warning, and its assembler writes the
  binary (``pipe/tofino.bin``) and the driver's ``pipe/context.json``.
- The placement is docs/tofino.md's: 12 stages at most, the slot state in stages 1 (rounds), 2
  (bitmaps) and 3 (a leaf's parent's bitmap), the value register pairs four per stage after `seen`; the
  two-level tables (docs/switch.md, "Two levels") in it: `uplinks` with `jobs` in stage 0, `full_round`
  where the values start, `outcome` after it.
- The stateful ALUs return what the program means: the stored value (``mem_*``) where a RegisterAction
  returns a half before updating it (bf-p4c 9.13.4 can silently pick the updated one, ``alu_*``), the
  updated one where it means that.
- A leaf's repeat of a copy with every worker in tells awaiting from final by the stored parent's bitmap
  (`outcome`'s entries as installed).
- The ingress parser keeps its selects (a compiler without p4lang/p4c#5753 silently drops them).

They skip (conftest.py) where no Tofino compiler is found: ``bf-p4c`` from Intel's SDE, ``$BF_P4C``, or
the open-source backend ``p4c-barefoot`` with the ``p4c`` driver next to it. A compile takes about half a
minute on two cores.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from conftest import tofino_compiler
from lhc_ina import constants as c

REPO = Path(__file__).resolve().parent.parent
TNA_P4 = REPO / "p4src" / "tna" / "lhc.p4"
TOFINO1_STAGES = 12
TOFINO1_SALUS_PER_STAGE = 4

pytestmark = [pytest.mark.bf_p4c, pytest.mark.slow]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    compiler = tofino_compiler()
    if compiler is None:
        pytest.skip("needs a Tofino compiler")
    out = tmp_path_factory.mktemp("bf_p4c")
    proc = subprocess.run(
        [
            compiler, "--target", "tofino", "--arch", "tna", "-o", str(out),
            "--p4runtime-files", str(out / "lhc.p4info.txtpb"), str(TNA_P4),
        ],
        capture_output=True, text=True, timeout=3600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"bf-p4c failed:\n{output}"
    return out, output


def _stages(table: dict) -> list[int]:
    attrs = table.get("match_attributes", {})
    stage_tables = attrs.get("stage_tables", []) if isinstance(attrs, dict) else []
    stage_tables = stage_tables or table.get("stage_tables", [])
    return [t["stage_number"] for t in stage_tables]


def test_compiles_without_warnings_and_assembles(compiled: tuple[Path, str]) -> None:
    out, output = compiled
    lines = [line for line in output.splitlines() if re.search(r"warning|error", line, re.I)]
    assert not lines, "bf-p4c reported:\n" + output
    for name in ("pipe/tofino.bin", "pipe/context.json", "bfrt.json", "lhc.p4info.txtpb"):
        assert (out / name).stat().st_size > 0, name


def test_placement_fits_tofino1(compiled: tuple[Path, str]) -> None:
    out, _ = compiled
    tables = {t["name"]: t for t in json.loads((out / "pipe" / "context.json").read_text())["tables"]}
    stages = {name: _stages(t) for name, t in tables.items() if _stages(t)}
    assert max(s for found in stages.values() for s in found) < TOFINO1_STAGES
    # The slot state (rounds, then bitmaps), then every value register pair: all lanes in the first pass.
    rounds = [f"LhcIngress.round_{kind}_{copy}" for kind in ("stale", "start") for copy in ("c0", "c1")]
    assert all(stages[name] == [1] for name in rounds), {name: stages[name] for name in rounds}
    assert stages["LhcIngress.bitmaps"] == [2]
    # The parent's bitmap a leaf's copy stores, after `bitmaps` said whether the copy awaited it.
    assert stages["LhcIngress.parent_bitmaps"] == [3]
    pairs = [f"LhcIngress.values_{a}_{a + 1}" for a in range(0, c.LANES, 2)]
    per_stage = Counter(s for name in pairs for s in stages[name])
    assert sum(per_stage.values()) == len(pairs), "each pair register lives in one stage"
    assert min(per_stage) > stages["LhcIngress.bitmaps"][0] + 1, "values wait for `seen`"
    assert all(n <= TOFINO1_SALUS_PER_STAGE for n in per_stage.values()), per_stage
    for a in range(0, c.LANES, 2):
        assert stages[f"LhcIngress.update_{a}_{a + 1}"] == stages[f"LhcIngress.values_{a}_{a + 1}"]
    # Two levels: the uplink is looked up with the job; what a round's bitmap means, once it is known
    # (after `seen`); the outcome, from it.
    assert stages["LhcIngress.uplinks"] == stages["LhcIngress.jobs"] == [0]
    assert stages["LhcIngress.full_round"] == [min(per_stage)]
    assert stages["LhcIngress.outcome"][0] > stages["LhcIngress.full_round"][0]


def test_stateful_alus_return_what_the_program_means(compiled: tuple[Path, str]) -> None:
    out, _ = compiled
    bfa = (out / "pipe" / "lhc.bfa").read_text()

    def output(action: str) -> str:
        """The output instruction of a RegisterAction (bf-p4c names it `<name>_<n>` or, where the name
        ends in a number, `<name without it>`)."""
        stem = re.sub(r"_\d+$", "", action)
        name = rf"(?:{re.escape(action)}_\d+|{re.escape(stem)})"
        body = re.search(rf"^\s+{name}:\n((?:\s+- .*\n)+)", bfa, re.M)
        assert body, action
        return re.search(r"- output (.*)", body.group(1)).group(1)

    # The stale check returns the stored epoch, the start check the one it just wrote (both nonzero);
    # join returns the bitmap as found.
    for copy in ("c0", "c1"):
        assert output(f"round_stale_{copy}_check").endswith("mem_hi"), copy
        assert output(f"round_start_{copy}_check").endswith("alu_hi"), copy
    assert output("bitmap_join").endswith("mem_lo")
    # A parent's result: the copy's state as found (stored only by a copy that awaits it); its round check
    # outputs nonzero (a predicate) for any other round, and writes nothing. A leaf's final copy answers a
    # repeat with the parent's bitmap as stored.
    assert output("bitmap_store") == "mem_hi"
    assert output("parent_bitmap_read") == "mem_lo"
    for copy in ("c0", "c1"):
        assert output(f"round_other_{copy}_check").endswith("predicate"), copy
    for a in range(0, c.LANES, 2):
        for kind in ("first", "add", "or"):
            assert output(f"{kind}_{a}_{a + 1}").endswith("alu_lo"), (kind, a)  # the updated low half
        assert output(f"hi_{a}_{a + 1}").endswith("mem_hi"), a


def test_a_leafs_repeat_tells_awaiting_from_final_by_the_stored_bitmap(compiled: tuple[Path, str]) -> None:
    # `outcome`'s const entries as the driver will install them: a repeat with every worker of a leaf in
    # sends the partial up again only while the copy holds no parent's bitmap (`meta.parent_bitmap`
    # exactly 0); the next entry answers from a final copy.
    out, _ = compiled
    tables = json.loads((out / "pipe" / "context.json").read_text())["tables"]
    outcome = next(t for t in tables if t["name"] == "LhcIngress.outcome")
    names = {a["handle"]: a["name"].split(".")[-1] for a in outcome["actions"]}
    entries = sorted(outcome["static_entries"], key=lambda e: e["priority"])
    order = [names[e["action_handle"]] for e in entries]
    up_again = order.index("up_retransmit")
    assert order[up_again + 1] == "retransmit_parent_result", order

    def parent_bitmap(entry: dict) -> tuple[int, int]:
        field = next(f for f in entry["match_key_fields_values"] if f["field_name"].endswith("parent_bitmap"))
        return int(field["value"], 16), int(field["mask"], 16)

    assert parent_bitmap(entries[up_again]) == (0, 0xFFFFFFFF)
    assert parent_bitmap(entries[up_again + 1]) == (0, 0)


def test_ingress_parser_keeps_its_selects(compiled: tuple[Path, str]) -> None:
    # p4c-barefoot before p4lang/p4c#5753 dropped every Tofino-1 parser match register without a
    # warning: each state then took its first transition, and every packet parsed as a recirculated one.
    out, _ = compiled
    bfa = (out / "pipe" / "lhc.bfa").read_text()
    parser = re.search(r"^parser ingress:\n((?:[ \t].*\n|\n)+)", bfa, re.M)
    assert parser, "no ingress parser in the assembly"
    body = parser.group(1)
    # start (recirculation port?), ethernet, the IPv4 version byte, IPv4, UDP: one match each.
    assert len(re.findall(r"^\s+match:", body, re.M)) >= 5, body
    starts = [state for state in re.split(r"\n    (?=\S)", body) if "next: parse_recirc" in state]
    assert starts and "next: parse_ethernet" in starts[0], "the start state must branch both ways"


def test_the_controller_writes_every_switch_of_a_fabric_by_the_compiled_p4info(
    tmp_path: Path,
) -> None:
    # The entries lhc_ina.jobs makes for Tofino (a spine, a leaf with its uplink, TNA's full_round), built
    # into P4Runtime messages against bf-p4c's own P4Info (standard externs, as `make p4` writes it): every
    # table, action and parameter name exists there with the width the entries need.
    from controller.reconcile import SwitchState, _table_entry
    from controller.targets import load_target
    from lhc_ina.fabric import fabric_entries
    from lhc_ina.p4rt import EntityBuilder, decode_table_entry
    from tests.test_fabric import fabric

    out = tmp_path
    proc = subprocess.run(
        [tofino_compiler(), "--target", "tofino", "--arch", "tna", "-o", str(out), "--p4runtime-files",
         str(out / "lhc.p4info.txtpb"), "--p4runtime-force-std-externs", str(TNA_P4)],
        capture_output=True, text=True, timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (out / "device.bin").write_bytes(b"device data")
    tofino = load_target("tofino", out / "lhc.p4info.txtpb", out / "device.bin")
    builder = EntityBuilder(tofino.p4info)
    for switch, entries in fabric_entries(fabric((4, 3)), target="tna").items():
        written = [decode_table_entry(tofino.p4info, _table_entry(builder, tofino, spec, True))
                   for spec in entries.tables]
        tables = {d.table for d in written}
        every_switch = {"LhcIngress.jobs", "LhcIngress.workers", "LhcEgress.replicas",
                        "LhcIngress.full_round"}
        assert every_switch <= tables, switch
        assert ("LhcIngress.uplinks" in tables) == switch.startswith("leaf"), switch
        assert SwitchState(frozenset(entries.tables), frozenset()).job_ids() == {0x77}
