"""The v1model program through p4c (marked ``p4c``) and on BMv2 (marked ``bmv2``).

- p4c compiles ``p4src/v1model/lhc.p4`` for bmv2/v1model without a warning, and the P4Info it emits equals
  the committed ``lhc.p4info.txtpb`` entity by entity (tables, actions, counters, registers: ids, names,
  match fields, parameters, sizes, widths).
- The BMv2 JSON it emits carries aggregation code for every lane (p4c's bmv2 backend would silently keep
  one iteration of a ``for`` loop; the program has none, and this checks the output).

They skip (conftest.py) where p4c is not on PATH. Running the program on BMv2 is the PTF suite's job
(``ptf_tests/``, against ``simple_switch_grpc`` when it is on PATH).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from lhc_ina import constants as c

REPO = Path(__file__).resolve().parent.parent
V1MODEL_P4 = REPO / "p4src" / "v1model" / "lhc.p4"
P4INFO = REPO / "p4src" / "v1model" / "lhc.p4info.txtpb"


def compile_v1model(out_dir: Path) -> tuple[Path, Path, str]:
    """p4c for bmv2/v1model; returns (bmv2 json, p4info, compiler output)."""
    p4info = out_dir / "lhc.p4info.txtpb"
    proc = subprocess.run(
        [
            "p4c", "--target", "bmv2", "--arch", "v1model", "-o", str(out_dir),
            "--p4runtime-files", str(p4info), str(V1MODEL_P4),
        ],
        capture_output=True, text=True, timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"p4c failed:\n{output}"
    return out_dir / "lhc.json", p4info, output


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    if shutil.which("p4c") is None:
        pytest.skip("needs the p4c compiler on PATH")
    return compile_v1model(tmp_path_factory.mktemp("p4c"))


def _entities(info: p4info_pb2.P4Info) -> dict[str, dict[str, str]]:
    groups = {}
    for group in ("tables", "actions", "counters", "registers", "direct_counters", "meters", "digests"):
        groups[group] = {
            entity.preamble.name: text_format.MessageToString(entity) for entity in getattr(info, group)
        }
    return groups


@pytest.mark.p4c
def test_p4c_compiles_without_warnings(compiled: tuple[Path, Path, str]) -> None:
    _, _, output = compiled
    lines = [line for line in output.splitlines() if "warning" in line.lower()]
    assert not lines, "p4c warned:\n" + output


@pytest.mark.p4c
def test_committed_p4info_is_the_compilers(compiled: tuple[Path, Path, str]) -> None:
    _, p4info_path, _ = compiled
    theirs = text_format.Parse(p4info_path.read_text(), p4info_pb2.P4Info())
    ours = text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())
    assert ours.pkg_info.arch == theirs.pkg_info.arch
    got, want = _entities(ours), _entities(theirs)
    for group in want:
        assert set(got[group]) == set(want[group]), group
        for name in want[group]:
            assert got[group][name] == want[group][name], f"{group} {name} differs from p4c's P4Info"


@pytest.mark.p4c
def test_bmv2_json_aggregates_every_lane(compiled: tuple[Path, Path, str]) -> None:
    json_path, _, _ = compiled
    program = json.loads(json_path.read_text())
    # Count, per lane, the primitives in all actions that name the lane's payload field.
    uses = {lane: 0 for lane in range(c.LANES)}

    def walk(node: object, lanes: set[int]) -> None:
        if isinstance(node, dict):
            if node.get("type") == "field" and isinstance(node.get("value"), list):
                header, field = node["value"]
                if header == "payload" and field.startswith("w"):
                    lanes.add(int(field[1:]))
            for value in node.values():
                walk(value, lanes)
        elif isinstance(node, list):
            for value in node:
                walk(value, lanes)

    register_ops = 0
    for action in program["actions"]:
        for primitive in action["primitives"]:
            if primitive["op"] in ("register_read", "register_write"):
                names = [p.get("value") for p in primitive["parameters"] if p.get("type") == "register_array"]
                if not any(n and n.endswith("slot_values") for n in names):
                    continue
                register_ops += 1
                lanes: set[int] = set()
                walk(primitive, lanes)
                for lane in lanes:
                    uses[lane] += 1
    assert register_ops > 0
    counts = set(uses.values())
    assert len(counts) == 1 and counts != {0}, f"lanes differ in slot_values accesses: {uses}"
