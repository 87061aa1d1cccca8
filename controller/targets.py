"""What differs per switch target: where the P4Info and device config come from, and port conventions.

All three speak P4Runtime (softswitch natively; BMv2 and Tofino through PI), so only these facts differ:

- softswitch: the committed v1model P4Info, no device config.
- bmv2: the v1model P4Info and the JSON p4c writes (``make p4``: ``build/p4/v1model/lhc.json``).
- tofino: bf-p4c's P4Info (``--p4runtime-force-std-externs``) and PI's Tofino device data (``make p4``
  writes ``build/p4/tna/lhc.device_config.bin``, see ``lhc_ina.tofino``). `replicas` is keyed on
  ``eg_intr_md.egress_rid`` and `workers` on ``ig_intr_md.ingress_port``, and a job's workers must share
  one pipe (port >> 7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from p4.config.v1 import p4info_pb2

from lhc_ina.jobs import Target as Target_
from lhc_ina.jobservice import errors
from lhc_ina.p4info import REPO_ROOT, V1MODEL_P4INFO, P4InfoIndex
from lhc_ina.tofino import TofinoBundleError, TofinoDeviceConfig

BUILD = REPO_ROOT / "build" / "p4"
TARGETS = ("softswitch", "bmv2", "tofino")
#: The TNA program's names for the v1model intrinsic metadata that jobs.py's match fields name.
TNA_FIELD_NAMES = {
    "standard_metadata.egress_rid": "eg_intr_md.egress_rid",
    "standard_metadata.ingress_port": "ig_intr_md.ingress_port",
}


@dataclass(frozen=True)
class Target:
    name: str
    p4info: P4InfoIndex
    device_config: bytes
    #: jobs.py names v1model's match fields; the target's own names where they differ.
    field_names: dict[str, str] = field(default_factory=dict)
    #: Tofino: ports of one pipe share ``port >> pipe_shift``; None where any port may join any job.
    pipe_shift: int | None = None

    def pipe_of(self, port: int) -> int | None:
        return None if self.pipe_shift is None else port >> self.pipe_shift

    @property
    def data_plane(self) -> Target_:
        """Which program's entries (``lhc_ina.jobs.job_entries``): TNA's add `full_round`."""
        return "tna" if self.name == "tofino" else "v1model"


def load_target(name: str, p4info: Path | None = None, device_config: Path | None = None) -> Target:
    """The target's pipeline from the build outputs (or the given files); a missing file is named."""
    if name not in TARGETS:
        raise errors.invalid(f"unknown target {name!r}; one of {', '.join(TARGETS)}")
    default_p4info = BUILD / "tna" / "lhc.p4info.txtpb" if name == "tofino" else V1MODEL_P4INFO
    info_path = p4info or default_p4info
    if not info_path.exists():
        raise errors.precondition(f"{name}: P4Info {info_path} not found (run make p4, or pass --p4info)")
    index = P4InfoIndex.from_file(info_path)
    if name == "softswitch":
        return Target(name, index, device_config.read_bytes() if device_config else b"")
    if name == "bmv2":
        path = device_config or BUILD / "v1model" / "lhc.json"
        if not path.exists():
            raise errors.precondition(f"bmv2: {path} not found (make p4 compiles it with p4c)")
        return Target(name, index, path.read_bytes())
    if device_config is not None:
        blob = device_config.read_bytes()
    else:
        try:
            blob = TofinoDeviceConfig.from_build(BUILD / "tna").pack()
        except TofinoBundleError as exc:
            raise errors.precondition(f"tofino: {exc}") from None
    return Target(name, _unqualified(index), blob, dict(TNA_FIELD_NAMES), pipe_shift=7)


def _unqualified(index: P4InfoIndex, pipe: str = "pipe") -> P4InfoIndex:
    """bf-p4c may qualify P4Info names with the pipeline's name (``pipe.LhcIngress.jobs``). The index
    returned looks entities up by the unqualified names the rest of the controller uses (same ids), while
    its ``p4info``, the message pushed to the switch and compared with the loaded one, stays bf-p4c's."""
    prefix = f"{pipe}."
    names = [e.preamble.name for kind in ("tables", "actions", "counters", "registers")
             for e in getattr(index.p4info, kind)]  # fmt: skip
    if not any(n.startswith(prefix) for n in names):
        return index
    stripped = p4info_pb2.P4Info()
    stripped.CopyFrom(index.p4info)
    for kind in ("tables", "actions", "counters", "direct_counters", "meters", "registers", "digests"):
        for entity in getattr(stripped, kind):
            if entity.preamble.name.startswith(prefix):
                entity.preamble.name = entity.preamble.name[len(prefix) :]
    renamed = P4InfoIndex(stripped)
    renamed.p4info = index.p4info
    return renamed
