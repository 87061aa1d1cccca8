"""The device config PI's Tofino target takes in SetForwardingPipelineConfig (``bf_switchd --p4rt-server``).

PI's Tofino backend reads ``p4_device_config`` as a sequence of chunks, each a little-endian u32 length and
that many bytes, in this order: the program name, ``tofino.bin``, ``context.json``, the pipe name and
``bf-rt.json``. The P4Info that goes with it must come from bf-p4c with ``--p4runtime-files ...
--p4runtime-force-std-externs`` (standard P4Runtime counters and registers rather than Tofino's).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_LENGTH = struct.Struct("<I")


class TofinoBundleError(ValueError):
    """A bundle that cannot be built or read (the message names the part)."""


@dataclass(frozen=True)
class TofinoDeviceConfig:
    program: str
    tofino_bin: bytes
    context_json: bytes
    pipe: str
    bfrt_json: bytes

    def pack(self) -> bytes:
        parts = (
            self.program.encode(),
            self.tofino_bin,
            self.context_json,
            self.pipe.encode(),
            self.bfrt_json,
        )
        return b"".join(_LENGTH.pack(len(part)) + part for part in parts)

    @classmethod
    def unpack(cls, data: bytes) -> TofinoDeviceConfig:
        parts: list[bytes] = []
        offset = 0
        while offset < len(data):
            if offset + _LENGTH.size > len(data):
                raise TofinoBundleError(f"chunk {len(parts)}: truncated length at byte {offset}")
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            if offset + length > len(data):
                raise TofinoBundleError(
                    f"chunk {len(parts)}: {length} bytes announced, {len(data) - offset} left"
                )
            parts.append(data[offset : offset + length])
            offset += length
        if len(parts) != 5:
            raise TofinoBundleError(
                f"{len(parts)} chunks; PI's Tofino device config has 5 "
                "(program, tofino.bin, context.json, pipe, bf-rt.json)"
            )
        return cls(parts[0].decode(), parts[1], parts[2], parts[3].decode(), parts[4])

    @classmethod
    def from_build(cls, out_dir: Path | str, program: str = "lhc", pipe: str = "pipe") -> TofinoDeviceConfig:
        """The bundle of a bf-p4c output directory (``build/p4/tna``): ``pipe/tofino.bin``,
        ``pipe/context.json`` and ``bfrt.json`` (or ``bf-rt.json``, as some drivers name it)."""
        out = Path(out_dir)
        bfrt = next((p for p in (out / "bfrt.json", out / "bf-rt.json") if p.exists()), None)
        needed = {"tofino.bin": out / pipe / "tofino.bin", "context.json": out / pipe / "context.json"}
        missing = [str(p) for p in needed.values() if not p.exists()]
        if bfrt is None:
            missing.append(str(out / "bfrt.json"))
        if missing:
            raise TofinoBundleError(f"bf-p4c output incomplete, missing: {', '.join(missing)} (run make p4)")
        return cls(
            program,
            needed["tofino.bin"].read_bytes(),
            needed["context.json"].read_bytes(),
            pipe,
            bfrt.read_bytes(),
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m lhc_ina.tofino OUT_DIR``: write OUT_DIR/lhc.device_config.bin (``make p4`` calls it)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lhc_ina.tofino BF_P4C_OUTPUT_DIR", file=sys.stderr)
        return 2
    try:
        bundle = TofinoDeviceConfig.from_build(args[0]).pack()
    except TofinoBundleError as exc:
        print(f"lhc_ina.tofino: {exc}", file=sys.stderr)
        return 1
    target = Path(args[0]) / "lhc.device_config.bin"
    target.write_bytes(bundle)
    print(f"tna: {target} ({len(bundle)} bytes, PI's Tofino device config)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
