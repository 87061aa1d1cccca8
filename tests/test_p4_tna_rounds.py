"""The TNA program's round logic, checked without a Tofino compiler.

p4src/tna/lhc.p4 keeps each copy's round twice, in `round_stale_cV` and `round_start_cV`, because a
Tofino-1 stateful ALU answers one question per packet. The two must hold the same {seq, epoch} after every
packet, and between them sort a packet into stale, start or the copy's round exactly as docs/switch.md's
"Round identity" says. This test runs the two RegisterActions' bodies, as written in the P4 source, through
a small interpreter over every case, and the check a parent's result makes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from test_p4_program import TNA_P4, _block, _register_actions, parse_program, preprocess


@dataclass
class Cell:
    lo: int
    hi: int


def execute(body: str, cell: Cell, names: dict[str, int]) -> int:
    """Execute a RegisterAction body (if/else blocks and assignments) on ``cell``; its output. ``names``
    gives the value of each PHV field and constant the body reads (``hdr.lhc.seq``, ``LHC_...``). A
    register of one word (``v``) is the cell's ``lo``."""
    env = {"v_lo": cell.lo, "v_hi": cell.hi, "rv": 0}
    aliases = {name: f"n{i}" for i, name in enumerate(sorted(names, key=len, reverse=True))}
    env.update({alias: names[name] for name, alias in aliases.items()})

    def expr(text: str) -> int:
        text = text.replace("&&", " and ").replace("||", " or ")
        for name, alias in aliases.items():
            text = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w.])", alias, text)
        text = text.replace("v.lo", "v_lo").replace("v.hi", "v_hi")
        text = re.sub(r"(?<![\w.])v(?![\w.])", "v_lo", text)
        assert re.fullmatch(r"[\w\s<>=!()|&]+", text), text
        return eval(text, {"__builtins__": {}}, env)  # P4 conditions of our own source, checked above

    def block(text: str) -> None:
        text = text.strip()
        while text:
            m = re.match(r"if\s*\((.*?)\)\s*\{", text)
            if m:
                then = _block(text, m.end() - 1)
                rest = text[m.end() + len(then) + 1 :].strip()
                other = ""
                if rest.startswith("else"):
                    rest = rest[len("else") :].strip()
                    other = _block(rest, 0)
                    rest = rest[len(other) + 2 :].strip()
                block(then if expr(m.group(1)) else other)
                text = rest
                continue
            m = re.match(r"(v\.lo|v\.hi|v|rv)\s*=\s*([^;]+);", text)
            assert m, text
            env["v_lo" if m.group(1) == "v" else m.group(1).replace(".", "_")] = expr(m.group(2))
            text = text[m.end() :].strip()

    block(body)
    cell.lo, cell.hi = env["v_lo"], env["v_hi"]
    return env["rv"]


def run(body: str, cell: Cell, seq: int, epoch: int) -> int:
    """A round register's RegisterAction for a packet of ``seq`` in ``epoch``."""
    return execute(body, cell, {"hdr.lhc.seq": seq, "meta.epoch": epoch})


@pytest.fixture(scope="module")
def actions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    text = preprocess(TNA_P4, tmp_path_factory.mktemp("cpp_tna_rounds"))
    return _register_actions(parse_program(text).controls["LhcIngress"])


@pytest.mark.parametrize("copy", ["c0", "c1"])
@pytest.mark.parametrize("stored_epoch, stored_round, seq, want", [
    (5, 100, 100, "same"),
    (5, 100, 116, "start"),   # the copy's next round
    (5, 100, 84, "stale"),    # the round before
    (5, 100, 0, "stale"),     # any older one
    (4, 100, 3, "start"),     # a copy stamped with another epoch: fresh
    (0, 0, 0, "start"),       # never used since the registers were reset
    (5, 0xFFFFFFF0, 7, "stale"),  # unsigned: hosts never let seq wrap within an epoch
])
def test_the_round_registers_sort_each_packet_and_stay_equal(actions, copy, stored_epoch, stored_round,
                                                            seq, want):
    epoch = 5
    stale_cell, start_cell = Cell(stored_round, stored_epoch), Cell(stored_round, stored_epoch)
    register, stale_body = actions[f"round_stale_{copy}_check"]
    assert register == f"round_stale_{copy}"
    register, start_body = actions[f"round_start_{copy}_check"]
    assert register == f"round_start_{copy}"
    stale = run(stale_body, stale_cell, seq, epoch)
    starts = run(start_body, start_cell, seq, epoch)
    got = "stale" if stale else "start" if starts else "same"
    assert got == want
    assert stale_cell == start_cell, "both registers must hold the same round"
    if want == "stale":
        assert stale_cell == Cell(stored_round, stored_epoch), "a stale packet writes nothing"
    else:
        assert stale_cell == Cell(seq, epoch)
    for flag in (stale, starts):
        assert flag in (0, epoch), "a flag is the epoch (never 0) or 0"


def test_the_result_round_check_writes_nothing_and_flags_any_other_round(actions):
    # A parent's result (a leaf) is compared with the copy's round, never recorded: it must not stamp one.
    for copy in ("c0", "c1"):
        register, body = actions[f"round_other_{copy}_check"]
        assert register == f"round_stale_{copy}"
        for stored_epoch, stored_round, seq, other in [
            (5, 100, 100, False), (5, 100, 116, True), (5, 100, 84, True), (4, 100, 100, True),
            (0, 0, 0, True),
        ]:
            cell = Cell(stored_round, stored_epoch)
            got = run(body, cell, seq, 5)
            assert bool(got) == other, (copy, stored_epoch, stored_round, seq)
            assert cell == Cell(stored_round, stored_epoch), "a result writes no round"
