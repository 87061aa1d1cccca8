"""softswitch: the embedded P4 target, a twin of ``p4src/v1model/lhc.p4`` (in Python, and in C).

It exists so that every machine can run the switch half of lhc-ina without BMv2 or Tofino: the demo, the
tests and CI. Same packets in, same packets out, same P4Runtime face as BMv2 running the v1model program;
``docs/switch.md`` is the contract both follow and ``ptf_tests/`` is the judge. ``docs/softswitch.md``
explains how each module maps to the P4 program.

Modules, one job each:

- ``tables``: exact and LPM match-action tables (dicts), the data plane's view and the control plane's.
- ``pre``: the packet replication engine (multicast groups).
- ``pipeline``: parser, ingress, egress, checksum and deparser, mirroring the P4 controls (the reference).
- ``native``: the same pipeline in C (``_dataplane.c`` + ``dataplane_*.c``, the type ``Dataplane``) over
  the Pipeline's own state, run per burst.
- ``ports``: port specs and the two port kinds (AF_PACKET interfaces, UDP over loopback).
- ``receive_loop``: the receive loop that feeds ports' frames through either pipeline.
- ``p4info_compare``, ``entity_store`` (what the server's writes hold, checked as PI checks them; the
  client's entity builders are ``lhc_ina.p4rt.entities``), ``arbitration``, ``server``: the P4Runtime server.
- ``cli``: ``lhc-softswitch``.
"""
