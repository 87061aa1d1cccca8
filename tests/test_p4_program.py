"""Static checks of the P4 programs, without a P4 compiler.

The P4 source is run through the C preprocessor (as p4c does) with empty stand-ins for the architecture
includes, then read with a few regular expressions: enough to list its tables, actions, counters and
registers, and to see every lane's code after the X-macros expanded. The committed P4Info, the source
and docs/switch.md must name the same entities with the same widths, in both directions.

The helpers here are reused by ``test_p4_compile.py`` (the checks that need p4c or BMv2).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from p4.config.v1 import p4info_pb2

from controller.targets import TNA_FIELD_NAMES
from lhc_ina import constants as c
from lhc_ina import jobs as lj
from lhc_ina.p4info import P4InfoIndex

REPO = Path(__file__).resolve().parent.parent
V1MODEL_P4 = REPO / "p4src" / "v1model" / "lhc.p4"
TNA_P4 = REPO / "p4src" / "tna" / "lhc.p4"
P4INFO = REPO / "p4src" / "v1model" / "lhc.p4info.txtpb"
SWITCH_MD = REPO / "docs" / "switch.md"

#: standard_metadata_t fields the program matches on (v1model.p4), with their widths.
STANDARD_METADATA_WIDTHS = {"egress_rid": 16, "ingress_port": 9, "egress_port": 9, "mcast_grp": 16}
#: Tofino's PortId_t and v1model's port are both 9 bits wide.
PORT_ID_BITS = 9
_MATCH_TYPES = {
    "exact": "EXACT", "lpm": "LPM", "ternary": "TERNARY", "range": "RANGE", "optional": "OPTIONAL",
}


# --- reading P4 source -------------------------------------------------------------------------------
def preprocess(path: Path, tmp_path: Path) -> str:
    """``path`` through cpp, with empty architecture includes (core.p4, v1model.p4, tna.p4)."""
    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("needs the C preprocessor (cpp, from gcc)")
    stubs = tmp_path / "p4include"
    stubs.mkdir(exist_ok=True)
    for name in ("core.p4", "v1model.p4", "tna.p4", "t2na.p4"):
        (stubs / name).write_text("")
    out = subprocess.run(
        [cpp, "-P", "-undef", "-nostdinc", "-I", str(stubs), str(path)],
        check=True, capture_output=True, text=True,
    )
    return out.stdout


def _block(text: str, open_index: int) -> str:
    """The text between the brace at ``open_index`` and its matching close brace."""
    assert text[open_index] == "{", text[open_index : open_index + 20]
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
    raise AssertionError("unbalanced braces")


@dataclass
class P4Table:
    name: str
    keys: list[tuple[str, str]]  # (expression, P4Info match type)
    actions: list[str]
    default_only: set[str]
    default_action: str | None
    const_default: bool
    size: int | None


@dataclass
class P4Program:
    text: str  # the preprocessed source
    headers: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    structs: dict[str, dict[str, str]] = field(default_factory=dict)
    actions: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # qualified name -> params
    tables: dict[str, P4Table] = field(default_factory=dict)
    counters: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (size, type)
    registers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (width, size)
    controls: dict[str, str] = field(default_factory=dict)  # name -> body

    def field_width(self, expr: str, hdr_struct: str = "lhc_headers_t") -> int:
        parts = expr.split(".")
        if parts[0] == "standard_metadata":
            return STANDARD_METADATA_WIDTHS[parts[1]]
        assert parts[0] == "hdr" and len(parts) == 3, expr
        header_type = self.structs[hdr_struct][parts[1]]
        return dict(self.headers[header_type])[parts[2]]


def parse_program(text: str) -> P4Program:
    prog = P4Program(text)
    for m in re.finditer(r"\bheader\s+(\w+)\s*\{", text):
        body = _block(text, m.end() - 1)
        prog.headers[m.group(1)] = [(n, int(w)) for w, n in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body)]
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{", text):
        body = _block(text, m.end() - 1)
        prog.structs[m.group(1)] = {n: t for t, n in re.findall(r"(\w+)\s+(\w+)\s*;", body)}
    for m in re.finditer(r"\bcontrol\s+(\w+)\s*\(", text):
        brace = text.index("{", text.index(")", m.end()))
        # A control's parameter list may contain parentheses only in annotations; we use none.
        prog.controls[m.group(1)] = _block(text, brace)
    for control, body in prog.controls.items():
        # Annotations on parameters (`@noWarn("unused")`) hold parentheses: drop them first.
        body = re.sub(r'@\w+\("[^"]*"\)\s*', "", body)
        for m in re.finditer(r"\baction\s+(\w+)\s*\(([^)]*)\)", body):
            params = [
                (n, PORT_ID_BITS if t == "PortId_t" else int(w))
                for t, w, n in re.findall(r"(bit<(\d+)>|PortId_t)\s+(\w+)", m.group(2))
            ]
            prog.actions[f"{control}.{m.group(1)}"] = params
        for m in re.finditer(r"\btable\s+(\w+)\s*\{", body):
            tbody = _block(body, m.end() - 1)
            key = re.search(r"\bkey\s*=\s*\{([^}]*)\}", tbody)
            keys = [(e, _MATCH_TYPES[k]) for e, k in re.findall(r"([\w.]+)\s*:\s*(\w+)\s*;", key.group(1))]
            acts = re.search(r"\bactions\s*=\s*\{([^}]*)\}", tbody).group(1)
            names, default_only = [], set()
            for entry in re.findall(r"((?:@\w+\s+)*)(\w+)\s*;", acts):
                names.append(f"{control}.{entry[1]}")
                if "@defaultonly" in entry[0]:
                    default_only.add(f"{control}.{entry[1]}")
            default = re.search(r"(\bconst\s+)?\bdefault_action\s*=\s*(\w+)", tbody)
            size = re.search(r"\bsize\s*=\s*(\d+)\s*;", tbody)
            prog.tables[f"{control}.{m.group(1)}"] = P4Table(
                name=f"{control}.{m.group(1)}",
                keys=keys,
                actions=names,
                default_only=default_only,
                default_action=f"{control}.{default.group(2)}" if default else None,
                const_default=bool(default and default.group(1)),
                size=int(size.group(1)) if size else None,
            )
        for m in re.finditer(r"\bcounter\s*\(\s*(\d+)\s*,\s*CounterType\.(\w+)\s*\)\s*(\w+)\s*;", body):
            prog.counters[f"{control}.{m.group(3)}"] = (int(m.group(1)), m.group(2))
        for m in re.finditer(r"\bregister\s*<\s*bit<(\d+)>\s*>\s*\(\s*(\d+)\s*\)\s*(\w+)\s*;", body):
            prog.registers[f"{control}.{m.group(3)}"] = (int(m.group(1)), int(m.group(2)))
    return prog


@pytest.fixture(scope="module")
def v1model(tmp_path_factory: pytest.TempPathFactory) -> P4Program:
    return parse_program(preprocess(V1MODEL_P4, tmp_path_factory.mktemp("cpp")))


@pytest.fixture(scope="module")
def p4info() -> P4InfoIndex:
    return P4InfoIndex.from_file(P4INFO)


# --- the program against the P4Info -----------------------------------------------------------------
def test_tables_agree_with_p4info(v1model: P4Program, p4info: P4InfoIndex) -> None:
    assert set(v1model.tables) == set(p4info.tables), "tables differ between lhc.p4 and the P4Info"
    info_actions_by_id = {a.id: a.name for a in p4info.actions.values()}
    for name, table in v1model.tables.items():
        info = p4info.table(name)
        got = [(m.name, m.bitwidth, m.match_type) for m in info.match_fields]
        want = [
            (expr, v1model.field_width(expr), p4info_pb2.MatchField.MatchType.Value(kind))
            for expr, kind in table.keys
        ]
        assert got == want, name
        assert [m.id for m in info.match_fields] == list(range(1, len(want) + 1)), name
        assert sorted(info_actions_by_id[i] for i in info.action_ids) == sorted(table.actions), name
        refs = {r.id: r for t in p4info.p4info.tables if t.preamble.name == name for r in t.action_refs}
        for action_id, ref in refs.items():
            default_only = info_actions_by_id[action_id] in table.default_only
            assert (ref.scope == p4info_pb2.ActionRef.DEFAULT_ONLY) == default_only, (name, ref)
        assert table.size == info.size, name
        assert table.const_default == info.const_default_action, name
        if table.default_action:
            assert info_actions_by_id[info.default_action_id] == table.default_action, name


def _called_directly(v1model: P4Program) -> set[str]:
    """Actions an apply block calls by name rather than through a table (p4c lists these in the P4Info
    too, without parameters: the call binds them, so the control plane never supplies them)."""
    table_actions = {a for t in v1model.tables.values() for a in t.actions}
    called = set()
    for name in set(v1model.actions) - table_actions:
        control, action = name.split(".")
        body = v1model.controls[control]
        calls = re.findall(rf"(?<![\w.]){action}\s*\(", body)
        if len(calls) > 1:  # the declaration, and at least one call
            called.add(name)
    return called


def test_actions_agree_with_p4info(v1model: P4Program, p4info: P4InfoIndex) -> None:
    table_actions = {a for t in v1model.tables.values() for a in t.actions}
    direct = _called_directly(v1model)
    assert table_actions | direct == set(p4info.actions), (
        "P4Info lists exactly the actions tables can run and those the apply blocks call"
    )
    for name in direct:
        assert list(p4info.action(name).params) == [], f"{name}: a direct call's parameters are bound"
    for name in table_actions:
        params = [(p.name, p.bitwidth) for p in p4info.action(name).params]
        assert params == v1model.actions[name], name
        assert [p.id for p in p4info.action(name).params] == list(range(1, len(params) + 1))


def test_counters_and_registers_agree_with_p4info(v1model: P4Program, p4info: P4InfoIndex) -> None:
    assert set(v1model.counters) == set(p4info.counters)
    units = {"packets": p4info_pb2.CounterSpec.PACKETS, "bytes": p4info_pb2.CounterSpec.BYTES,
             "packets_and_bytes": p4info_pb2.CounterSpec.BOTH}
    for name, (size, kind) in v1model.counters.items():
        assert p4info.counter(name).size == size, name
        spec = next(x.spec for x in p4info.p4info.counters if x.preamble.name == name)
        assert spec.unit == units[kind], name
    assert set(v1model.registers) == set(p4info.registers)
    for name, (width, size) in v1model.registers.items():
        assert (p4info.register(name).bitwidth, p4info.register(name).size) == (width, size), name


def test_p4info_ids_follow_p4c_scheme(p4info: P4InfoIndex) -> None:
    """Ids carry p4c's resource prefix in the top byte; names alone are the contract, but a P4Info with
    stray ids would not be what p4c emits."""
    prefixes = {
        "tables": p4info_pb2.P4Ids.TABLE, "actions": p4info_pb2.P4Ids.ACTION,
        "counters": p4info_pb2.P4Ids.COUNTER, "registers": p4info_pb2.P4Ids.REGISTER,
    }
    seen = set()
    for group, prefix in prefixes.items():
        for entity in getattr(p4info, group).values():
            assert entity.id >> 24 == prefix, entity.name
            assert entity.id not in seen
            seen.add(entity.id)
    assert p4info.p4info.pkg_info.arch == "v1model"


def test_sizes_follow_the_constants(v1model: P4Program) -> None:
    slot_cells = c.MAX_SLOTS * c.SLOT_COPIES
    assert v1model.registers["LhcIngress.slot_epoch"] == (16, slot_cells)
    assert v1model.registers["LhcIngress.slot_round"] == (32, slot_cells)  # seq is 32 bits
    assert v1model.registers["LhcIngress.slot_bitmap"] == (c.MAX_WORKERS, slot_cells)
    assert v1model.registers["LhcIngress.slot_remaining"] == (8, slot_cells)
    assert v1model.registers["LhcIngress.slot_values"] == (32, slot_cells * c.LANES)
    assert v1model.counters["LhcIngress.lhc_stats"] == (c.MAX_JOBS * c.NUM_STATS, "packets_and_bytes")
    assert v1model.tables["LhcIngress.jobs"].size == c.MAX_JOBS
    assert c.SLOT_COPIES == 2, "the program takes the other copy as cell ^ 1 (ver is one bit)"
    assert c.MAX_WORKERS <= 32 and c.MAX_WORKERS < (1 << 8), "bitmap is bit<32>, worker_id bit<8>"


def test_headers_match_the_constants(v1model: P4Program) -> None:
    assert v1model.headers["lhc_t"] == list(c.HEADER_FIELDS)
    assert v1model.headers["lhc_payload_t"] == [(f"w{i}", 8 * c.LANE_BYTES) for i in range(c.LANES)]
    widths = {name: sum(w for _, w in fields) for name, fields in v1model.headers.items()}
    assert widths["ethernet_t"] == 8 * c.ETHERNET_BYTES
    assert widths["ipv4_t"] == 8 * c.IPV4_BYTES
    assert widths["udp_t"] == 8 * c.UDP_BYTES
    assert list(v1model.structs["lhc_headers_t"]) == ["ethernet", "ipv4", "udp", "lhc", "payload"]


# --- every lane aggregates (the p4c `for` trap) -------------------------------------------------------
def _lane_statements(text: str) -> dict[str, list[int]]:
    """For each kind of per-lane statement, the lanes it appears for, in order."""
    norm = re.sub(r"\s+", " ", text)
    patterns = {
        "add": r"slot_values\.read\(v, vbase \+ (\d+)\); hdr\.payload\.w(\d+) = v \+ hdr\.payload\.w(\d+);"
        r" slot_values\.write\(vbase \+ (\d+), hdr\.payload\.w(\d+)\);",
        "or": r"slot_values\.read\(v, vbase \+ (\d+)\); hdr\.payload\.w(\d+) = v \| hdr\.payload\.w(\d+);"
        r" slot_values\.write\(vbase \+ (\d+), hdr\.payload\.w(\d+)\);",
        "first": r"slot_values\.write\(vbase \+ (\d+), hdr\.payload\.w(\d+)\);",
        "read": r"slot_values\.read\(hdr\.payload\.w(\d+), vbase \+ (\d+)\);",
    }
    out = {}
    for kind, pattern in patterns.items():
        lanes = []
        for groups in re.findall(pattern, norm):
            assert len(set(groups)) == 1, f"{kind}: a lane statement mixes lanes {groups}"
            lanes.append(int(groups[0]))
        out[kind] = lanes
    return out


def test_every_lane_gets_its_aggregation_code(v1model: P4Program) -> None:
    ingress = re.sub(r"\s+", " ", v1model.controls["LhcIngress"])
    lanes = _lane_statements(ingress)
    everyone = list(range(c.LANES))
    assert lanes["add"] == everyone
    assert lanes["or"] == everyone
    assert lanes["read"] == everyone
    # "first" also matches the write at the end of each add/or statement.
    assert sorted(lanes["first"]) == sorted(everyone * 3)


def test_no_for_loops_in_controls(v1model: P4Program) -> None:
    for name, body in v1model.controls.items():
        assert not re.search(r"\bfor\s*\(", body), f"{name} has a for loop: p4c's bmv2 backend keeps one pass"


def test_parser_never_selects_on_last_index() -> None:
    for path in (REPO / "p4src").rglob("*.p4"):
        assert "lastIndex" not in path.read_text(), f"{path}: BMv2 rejects select on lastIndex"


def test_stateful_work_is_atomic(v1model: P4Program) -> None:
    ingress = v1model.controls["LhcIngress"]
    start = ingress.index("@atomic")
    atomic = _block(ingress, ingress.index("{", start))
    outside = ingress[:start] + ingress[start + len(atomic) :]
    for reg in ("slot_epoch", "slot_bitmap", "slot_remaining", "slot_values"):
        assert f"{reg}.read" in atomic and f"{reg}.write" in atomic, reg
        assert not re.search(rf"\b{reg}\.(read|write)", outside), f"{reg} touched outside @atomic"
    assert "@atomic" not in v1model.controls["LhcEgress"]


def test_every_stat_is_used(v1model: P4Program) -> None:
    ingress = v1model.controls["LhcIngress"]
    for stat in c.Stat:  # the preprocessor has replaced each code by its typed literal
        assert re.search(rf"\bstat = 32w{stat.value};", ingress), stat.name


# --- docs/switch.md (the contract) against the P4Info --------------------------------------------------
def _contract_rows() -> list[list[str]]:
    """The rows of the entity table in docs/switch.md's "Names (P4Info)" section."""
    text = SWITCH_MD.read_text()
    section = text[text.index("## Names (P4Info)") :]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


_SIZE_WORDS = {
    "MAX_JOBS * NUM_STATS": c.MAX_JOBS * c.NUM_STATS,
    "MAX_SLOTS * SLOT_COPIES": c.MAX_SLOTS * c.SLOT_COPIES,
    "MAX_SLOTS * SLOT_COPIES * LANES": c.MAX_SLOTS * c.SLOT_COPIES * c.LANES,
}


def test_switch_md_names_what_the_p4info_has(p4info: P4InfoIndex) -> None:
    rows = _contract_rows()
    named = {re.match(r"`([\w.]+)`", row[0]).group(1) for row in rows}
    assert named == set(p4info.tables) | set(p4info.counters) | set(p4info.registers)
    last_size = None
    for entity, kind, key, actions in rows:
        name = entity.strip("`")
        if kind.startswith("table"):
            table = p4info.table(name)
            assert int(re.search(r"(\d+) entries", kind).group(1)) == table.size, name
            key_re = r"`([\w.]+)` \((\w+), (\d+)\)"
            want_keys = [(n, t.upper(), int(b)) for n, t, b in re.findall(key_re, key)]
            assert [(m.name, m.match_type, m.bitwidth) for m in table.match_fields] == [
                (n, p4info_pb2.MatchField.MatchType.Value(t), b)
                for n, t, b in want_keys
            ], name
            declared = re.findall(r"`([\w.]+)\(([^)]*)\)`", actions)
            names = {a for a, _ in declared}
            by_id = {a.id: a.name for a in p4info.actions.values()}
            assert names == {by_id[i] for i in table.action_ids}, name
            for action, params in declared:
                want = [(p, int(b)) for p, b in re.findall(r"(\w+) (\d+)", params)]
                assert [(p.name, p.bitwidth) for p in p4info.action(action).params] == want, action
            default = re.search(r"default `([\w.]+)\(", actions).group(1)
            assert by_id[table.default_action_id] == default, name
        elif kind.startswith("counter"):
            size = re.search(r"`([^`]+)` cells", kind).group(1)
            assert p4info.counter(name).size == _SIZE_WORDS[size], name
        else:
            width = int(re.search(r"register bit<(\d+)>", kind).group(1))
            size_match = re.search(r"`([^`]+)` cells", kind)
            size = _SIZE_WORDS[size_match.group(1)] if size_match else last_size
            assert (p4info.register(name).bitwidth, p4info.register(name).size) == (width, size), name
            last_size = size


# --- the TNA program ----------------------------------------------------------------------------------
#: Tofino-1: MAU stages and stateful ALUs per stage; the slot logic takes the first TNA_SLOT_STAGES stages
#: (jobs and workers | rounds | bitmaps | seen), the value register pairs fill the others (docs/tofino.md).
TOFINO1_STAGES = 12
TOFINO1_SALUS_PER_STAGE = 4
TNA_SLOT_STAGES = 4
#: What each internal `update_A_B` table does, by key (vmode, seen, op); `_` is a wildcard. A repeat
#: (SAME with its bit already seen) matches nothing: values untouched.
TNA_UPDATE_ENTRIES = [
    (("LHC_VMODE_START", "_", "_"), "first"),
    (("LHC_VMODE_SAME", "0", f"2w{c.Op.ADD.value}"), "add"),
    (("LHC_VMODE_SAME", "0", f"2w{c.Op.OR.value}"), "or"),
    (("LHC_VMODE_OR", "_", "_"), "or"),
    (("LHC_VMODE_HI", "_", "_"), "hi"),
]


@pytest.fixture(scope="module")
def tna(tmp_path_factory: pytest.TempPathFactory) -> P4Program:
    return parse_program(preprocess(TNA_P4, tmp_path_factory.mktemp("cpp_tna")))


def _register_actions(body: str) -> dict[str, tuple[str, str]]:
    """RegisterAction name -> (register, apply body)."""
    out = {}
    for m in re.finditer(r"\bRegisterAction<[^()]*>\(\s*(\w+)\s*\)\s*(\w+)\s*=\s*\{", body):
        outer = _block(body, m.end() - 1)
        apply = re.search(r"\bapply\s*\([^)]*\)\s*\{", outer)
        out[m.group(2)] = (m.group(1), re.sub(r"\s+", " ", _block(outer, apply.end() - 1)).strip())
    return out


def _apply_block(body: str) -> str:
    return re.sub(r"\s+", " ", _block(body, re.search(r"\bapply\s*\{", body).end() - 1))


def _const_entries(table_body: str) -> list[tuple[tuple[str, ...], str]]:
    entries = _block(table_body, re.search(r"\bconst\s+entries\s*=\s*\{", table_body).end() - 1)
    return [
        (tuple(k.strip() for k in keys.split(",")), action)
        for keys, action in re.findall(r"\(([^()]*)\)\s*:\s*(\w+)\s*\(\s*\)\s*;", entries)
    ]


def test_tna_has_the_v1model_tables_and_actions(tna: P4Program, v1model: P4Program) -> None:
    """The controller drives both programs by the same names, keys and action parameters, `uplinks`
    included. The TNA program has one more table per value register pair, `update_A_B`, and `outcome`:
    const entries and a const default, so the controller has nothing to write there; and `full_round`,
    which the controller writes for TNA only (``lhc_ina.jobs.job_entries(job, target="tna")``)."""
    for name, table in v1model.tables.items():
        theirs = tna.tables[name]
        keys = [(TNA_FIELD_NAMES.get(e, e), k) for e, k in table.keys]
        assert theirs.keys == keys, name
        assert theirs.actions == table.actions and theirs.default_action == table.default_action, name
        assert theirs.default_only == table.default_only and theirs.const_default, name
        assert theirs.size == table.size, name
        for action in table.actions:
            assert tna.actions[action] == v1model.actions[action], action
    internal = set(tna.tables) - set(v1model.tables) - {lj.FULL_ROUND_TABLE}
    want = {f"LhcIngress.update_{a}_{a + 1}" for a in range(0, c.LANES, 2)} | {"LhcIngress.outcome"}
    assert internal == want
    for name in internal:
        table = tna.tables[name]
        assert table.const_default and table.default_action == "LhcIngress.NoAction", name
        ingress = tna.controls["LhcIngress"]
        body = _block(ingress, ingress.index("{", ingress.index(f"table {name.split('.')[1]} ")))
        assert _const_entries(body), f"{name}: an internal table must have const entries"
    # full_round: the names lhc_ina.jobs writes, exact on (job, bitmap), one entry per mask and job (two on
    # a leaf).
    full_round = tna.tables[lj.FULL_ROUND_TABLE]
    assert full_round.keys == [("hdr.lhc.job_id", "EXACT"), ("hdr.lhc.bitmap", "EXACT")]
    assert set(full_round.actions) == {lj.ROUND_IS_FULL, lj.ROUND_AWAITS_PARENT, "LhcIngress.NoAction"}
    for name in (lj.ROUND_IS_FULL, lj.ROUND_AWAITS_PARENT):
        assert tna.actions[name] == [], name


def test_tna_every_lane_is_in_exactly_one_register_pair(tna: P4Program) -> None:
    ingress = tna.controls["LhcIngress"]
    actions = _register_actions(ingress)
    apply = _apply_block(ingress)
    declared = re.findall(r"\bRegister<pair_t, cell_index_t>\(\w+\)\s*values_(\d+)_(\d+);", ingress)
    pairs = sorted({(int(a), int(b)) for a, b in declared})
    assert sorted(lane for pair in pairs for lane in pair) == list(range(c.LANES)), "every lane exactly once"
    norm = re.sub(r"\s+", " ", ingress)
    for a, b in pairs:
        assert b == a + 1
        reg = f"values_{a}_{b}"
        # The four RegisterActions of the pair: update both halves and return the low one, or read the high.
        wa, wb = f"hdr.payload.w{a}", f"hdr.payload.w{b}"
        assert actions[f"first_{a}_{b}"] == (reg, f"v.lo = {wa}; v.hi = {wb}; rv = v.lo;")
        assert actions[f"add_{a}_{b}"] == (reg, f"v.lo = v.lo + {wa}; v.hi = v.hi + {wb}; rv = v.lo;")
        assert actions[f"or_{a}_{b}"] == (reg, f"v.lo = v.lo | {wa}; v.hi = v.hi | {wb}; rv = v.lo;")
        assert actions[f"hi_{a}_{b}"] == (reg, "rv = v.hi;")
        for kind, lane in (("first", a), ("add", a), ("or", a), ("hi", b)):
            body = f"hdr.payload.w{lane} = {kind}_{a}_{b}.execute(meta.cell);"
            assert f"action do_{kind}_{a}_{b}() {{ {body} }}" in norm, (kind, a)
        # The table that picks one of them, applied once per pass.
        table = tna.tables[f"LhcIngress.update_{a}_{b}"]
        keys = ["meta.vmode", "meta.seen", "hdr.lhc.op"]
        assert table.keys == [(key, "TERNARY") for key in keys]
        body = _block(ingress, ingress.index("{", ingress.index(f"table update_{a}_{b} ")))
        want = [(keys, f"do_{kind}_{a}_{b}") for keys, kind in TNA_UPDATE_ENTRIES]
        assert _const_entries(body) == want, (a, b)
        assert apply.count(f"update_{a}_{b}.apply();") == 1, (a, b)
    assert len(pairs) <= (TOFINO1_STAGES - TNA_SLOT_STAGES) * TOFINO1_SALUS_PER_STAGE, "more pairs than ALUs"


def test_tna_register_actions_per_register_fit_tofino(tna: P4Program) -> None:
    """At most four RegisterActions per Register (one stateful ALU's instruction slots)."""
    ingress = tna.controls["LhcIngress"]
    registers = re.findall(r"\bRegister<[^;]*?>\([^)]*\)\s*(\w+);", ingress)
    per_register = {r: len(re.findall(rf"RegisterAction<[^()]*>\(\s*{r}\s*\)", ingress)) for r in registers}
    assert per_register and all(1 <= n <= 4 for n in per_register.values()), per_register
    # the pairs, round_stale_c0/c1, round_start_c0/c1, bitmaps, parent_bitmaps
    assert len(registers) == c.LANES // 2 + 6


def test_tna_register_outputs_are_what_they_mean(tna: P4Program) -> None:
    """bf-p4c 9.13.4 outputs the *updated* half for `rv = v.lo` when any statement before it in the text
    wrote v.lo, even one in the other branch of an if. So a half that a branch returns as stored must not
    have been written earlier in the text, except in that branch before the return (where the updated
    value is what P4 means too)."""
    for name, (_, body) in _register_actions(tna.controls["LhcIngress"]).items():
        path: list[int] = []
        counter = 0
        writes: list[tuple[str, tuple[int, ...]]] = []
        for token in re.findall(r"\{|\}|[^{};]+;", body):
            if token == "{":
                counter += 1
                path.append(counter)
                continue
            if token == "}":
                path.pop()
                continue
            stmt = token.strip()
            here = tuple(path)
            m = re.match(r"rv = v\.(lo|hi);$", stmt)
            if m:
                half = m.group(1)
                earlier = [p for h, p in writes if h == half]
                in_scope = [p for p in earlier if here[: len(p)] == p]
                assert not earlier or in_scope, f"{name}: `{stmt}` would output the updated v.{half}"
            m = re.match(r"(?:else\s*)?(?:if\s*\(.*\)\s*)?v\.(lo|hi) =", stmt)
            if m:
                writes.append((m.group(1), here))


def test_tna_parser_initializes_all_metadata(tna: P4Program) -> None:
    """Every metadata field is set in the start state (else p4c warns that `meta` may be uninitialized,
    and Tofino does not clear metadata)."""
    tna_text = tna.text
    struct = _block(tna_text, re.search(r"\bstruct\s+lhc_ig_metadata_t\s*\{", tna_text).end() - 1)
    fields = re.findall(r"(?:bit<\d+>|\w+)\s+(\w+)\s*;", struct)
    parser = tna_text[re.search(r"\bparser\s+LhcIngressParser\b", tna_text).start():]
    start = _block(parser, re.search(r"\bstate\s+start\s*\{", parser).end() - 1)
    assigned = re.findall(r"\bmeta\.(\w+)\s*=", start)
    assert sorted(assigned) == sorted(fields)


def test_tna_only_results_reach_egress(tna: P4Program) -> None:
    """The egress parser reads Ethernet .. lhc unconditionally: every unicast path bypasses egress."""
    for name, body in re.findall(r"\baction\s+(\w+)\s*\([^)]*\)\s*\{([^}]*)\}", tna.controls["LhcIngress"]):
        if "ig_tm_md.ucast_egress_port =" in body:
            assert re.search(r"ig_tm_md\.bypass_egress = 1;", body), name


def test_tna_later_passes_still_parse_as_lhc(tna: P4Program) -> None:
    """A recirculated packet is parsed as a whole lhc frame, and no first-pass action moves it off the lhc
    UDP port: only the last pass of a retransmission swaps the ports (an earlier swap once left the later
    passes without hdr.lhc, and the answer carried the asker's own payload, uncounted)."""
    tna_text = tna.text
    parser = tna_text[re.search(r"\bparser\s+LhcIngressParser\b", tna_text).start():]
    recirc = _block(parser, re.search(r"\bstate\s+parse_recirc\s*\{", parser).end() - 1)
    extracted = re.findall(r"packet\.extract\(hdr\.(\w+)\)", recirc)
    assert extracted == ["recirc", "ethernet", "ipv4", "udp", "lhc", "payload"]
    assert re.search(r"transition\s+accept\s*;", recirc)
    actions = re.findall(r"\baction\s+(\w+)\s*\([^)]*\)\s*\{([^}]*)\}", tna.controls["LhcIngress"])
    writers = {name for name, body in actions if re.search(r"hdr\.udp\.dst_port\s*=", body)}
    assert writers == {"send_retransmission", "send_up"}  # last passes (a leaf's partial: the uplink's port)
