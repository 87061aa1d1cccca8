// lhc-ina on Tofino-1 (TNA): the behaviour of p4src/v1model/lhc.p4 under Tofino's limits.
//
// docs/tofino.md explains the layout and gives bf-p4c's measured placement; in short:
//   - Every register is touched by at most one RegisterAction per pass, and has at most four.
//   - Slot state: the round of each copy, {seq, epoch}, held twice (`round_stale_cV` says whether the
//     packet is of an older round, `round_start_cV` whether it starts one: a Tofino-1 stateful ALU has one
//     output), one register per copy indexed by slot_base + slot; then `bitmaps` (per cell: the
//     contributors, and whether a leaf's copy awaits its parent). A round is finished when its bitmap is
//     the job's result mask (TNA admits only fan_in == the worker count; over two levels, one bit per leaf:
//     docs/switch.md, "Ranks per level"), and a leaf's copy awaits its parent when the bitmap is the leaf's
//     workers' mask: the controller's table `full_round`, keyed on (job, bitmap), tells both; there is no
//     count-down register.
//   - Two levels (docs/switch.md, "Two levels"): `uplinks` as in v1model; a result is taken only from the
//     leaf's parent (address, UDP port and switch port, compared by XOR in `set_uplink`), stored in one
//     pass by a copy that awaits exactly its round, and multicast. The partial goes up after the pass that
//     reads its high halves, as a result does.
//   - Values: all LANES lanes in 64-bit register pairs `values_A_B` (lanes A and A + 1), updated in the
//     first pass. A stateful ALU returns 32 bits, so the update returns the low half; the high halves of a
//     result are read in a second pass. Only results (and retransmitted results) recirculate.
//   - One slot-logic stage each: jobs + workers | rounds | bitmaps | seen; the 32 pair registers fill the
//     other 8 stages, 4 stateful ALUs each.
//   - ADD is bit<32> addition: wraps mod 2^32 (Tofino's stateful ALU adds without saturation).
//   - A job's workers sit on one pipe (registers are per pipe); the recirculation port is that pipe's.
//
// Per-lane code is written once and expanded by the generated X-macros (p4src/shared/constants.p4).
// Files, in order: types.p4, parser.p4, value_pairs.p4, ingress.p4 (with ingress_slot_state.p4 and
// ingress_results.p4 inside its body), egress.p4.
// Compile: p4c --target tofino --arch tna (docs/tofino.md).
#include <core.p4>
#include <tna.p4>

#include "../shared/headers.p4"
#include "types.p4"
#include "parser.p4"
#include "value_pairs.p4"
#include "ingress.p4"
#include "egress.p4"

Pipeline(LhcIngressParser(), LhcIngress(), LhcIngressDeparser(),
         LhcEgressParser(), LhcEgress(), LhcEgressDeparser()) pipe;

Switch(pipe) main;
