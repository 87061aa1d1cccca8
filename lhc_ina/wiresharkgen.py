"""Generate the Wireshark dissector ``wireshark/lhc.lua`` from ``lhc_ina.constants`` and ``lhc_ina.wire``.

Wireshark cannot import Python, so, like the P4 include (``lhc_ina.p4gen``), the protocol reaches it as a
generated file: a Lua table ``LHC`` (sizes, the UDP port range, the message type and op codes, and every
header field's byte group, shift and width, from ``HEADER_FIELDS`` and ``wire.HEADER_OFFSETS`` /
``HEADER_SHIFTS``) in front of the dissector's logic, ``lhc_ina/wireshark_dissector.lua``, which holds no
number of its own. ``make wireshark-dissector`` rewrites the file; ``make wireshark-check`` (run by
``make test``) and ``tests/test_wireshark_dissector.py`` fail when the committed copy differs.
"""

from __future__ import annotations

import sys
from enum import IntEnum
from pathlib import Path

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.generated import generator_main

REPO_ROOT = Path(__file__).resolve().parent.parent
DISSECTOR_LUA = REPO_ROOT / "wireshark" / "lhc.lua"
BODY_LUA = Path(__file__).resolve().parent / "wireshark_dissector.lua"
COMMAND = "make wireshark-dissector"

#: What Wireshark calls each header field; a field added to HEADER_FIELDS without a label shows its name.
LABELS = {
    "msg_type": "Message type", "op": "Op", "ver": "Copy (ver)", "flags": "Flags (reserved, 0)",
    "worker_id": "Rank (worker_id)", "job_id": "Job", "slot": "Slot", "epoch": "Epoch", "seq": "Seq",
    "bitmap": "Contributor bitmap",
}
#: The fields the Info column shows, as name=value, under these names.
INFO = {"job_id": "job", "worker_id": "rank", "slot": "slot", "ver": "ver", "seq": "seq", "epoch": "epoch",
        "bitmap": "bitmap"}
#: Fields with value strings (their codes' names), and fields shown in hex.
ENUMS: dict[str, tuple[str, type[IntEnum]]] = {"msg_type": ("MSG_TYPES", c.MsgType), "op": ("OPS", c.Op)}
HEX = {"bitmap"}
#: What the dissector's logic reads by name: a renamed field or code must fail here, not in Wireshark.
NEEDED_FIELDS = {"msg_type", "op", "flags", "worker_id", "job_id", "slot", "seq", "bitmap"}
NEEDED_CODES = {"MSG": ("RESULT", "RESULT_RETX"), "OP": ("ADD", "OR")}


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def group_bytes(name: str) -> int:
    """The bytes of the group holding ``name``: the fields at its offset share one (sub-byte fields)."""
    at = wire.HEADER_OFFSETS[name]
    bits = max(wire.HEADER_SHIFTS[other] + width for other, width in c.HEADER_FIELDS
               if wire.HEADER_OFFSETS[other] == at)
    if bits > 32 or bits % 8:
        raise ValueError(f"header field {name}: a group of {bits} bits has no Wireshark uint type")
    return bits // 8


def _field_rows() -> list[str]:
    names = {name for name, _ in c.HEADER_FIELDS}
    missing = NEEDED_FIELDS - names
    if missing:
        raise ValueError(f"lhc_ina/wireshark_dissector.lua reads header fields {sorted(missing)} that "
                         "constants.HEADER_FIELDS no longer has: update the dissector's logic")
    rows = []
    for name, width in c.HEADER_FIELDS:
        size = group_bytes(name)
        shift = wire.HEADER_SHIFTS[name]
        mask = ((1 << width) - 1) << shift if width != size * 8 else None
        parts = [f"name = {_lua_string(name)}", f"label = {_lua_string(LABELS.get(name, name))}",
                 f"offset = {wire.HEADER_OFFSETS[name]}", f"bytes = {size}", f"shift = {shift}",
                 f"width = {width}", f"mask = {f'0x{mask:X}' if mask is not None else 'nil'}"]
        if name in ENUMS:
            parts.append(f"values = {_lua_string(ENUMS[name][0])}")
        if name in HEX:
            parts.append("hex = true")
        if name in INFO:
            parts.append(f"info = {_lua_string(INFO[name])}")
        rows.append("        { " + ", ".join(parts) + " },")
    return rows


def _codes(table: str, enum: type[IntEnum]) -> list[str]:
    names = ", ".join(f"[{member.value}] = {_lua_string(member.name)}" for member in enum)
    return [f"    {table} = {{ {names} }},"]


def _by_name(table: str, enum: type[IntEnum]) -> list[str]:
    absent = [name for name in NEEDED_CODES[table] if name not in enum.__members__]
    if absent:
        raise ValueError(f"lhc_ina/wireshark_dissector.lua reads {enum.__name__} codes {absent} that "
                         "lhc_ina/constants.py no longer has: update the dissector's logic")
    names = ", ".join(f"{member.name} = {member.value}" for member in enum)
    return [f"    {table} = {{ {names} }},"]


def render() -> str:
    """The full text of ``wireshark/lhc.lua``."""
    sizes = {"HEADER_BYTES": c.HEADER_BYTES, "LANES": c.LANES, "LANE_BYTES": c.LANE_BYTES,
             "PAYLOAD_BYTES": c.PAYLOAD_BYTES, "UDP_PORT_BASE": c.UDP_PORT_BASE,
             "UDP_PORT_COUNT": c.UDP_PORT_COUNT, "MAX_WORKERS": c.MAX_WORKERS}
    lines = [
        "-- Wireshark dissector for lhc, the in-network aggregation protocol of lhc-ina (docs/protocol.md).",
        f"-- GENERATED by `{COMMAND}` (python -m lhc_ina.wiresharkgen) from lhc_ina/constants.py,",
        "-- lhc_ina/wire.py and lhc_ina/wireshark_dissector.lua. Do not edit: change those and regenerate.",
        "-- Load it with `wireshark -X lua_script:lhc.lua` (or tshark), or copy it to the personal Lua",
        "-- plugins folder (Help > About > Folders; Linux and macOS: ~/.local/lib/wireshark/plugins).",
        "",
        "local LHC = {",
    ]
    lines += [f"    {name} = {value}," for name, value in sizes.items()]
    for table, enum in ENUMS.values():
        lines += _codes(table, enum)
    lines += _by_name("MSG", c.MsgType) + _by_name("OP", c.Op)
    lines.append("    -- the header in wire order: offset and size of the field's byte group, shift, width")
    lines.append("    FIELDS = {")
    lines += _field_rows()
    lines += ["    },", "}", "", BODY_LUA.read_text().rstrip("\n"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, __doc__.splitlines()[0], DISSECTOR_LUA, render,
                          " with lhc_ina/constants.py, lhc_ina/wire.py or lhc_ina/wireshark_dissector.lua: "
                          f"run `{COMMAND}`")


if __name__ == "__main__":
    sys.exit(main())
