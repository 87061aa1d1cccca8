// lhc-ina on Tofino-1 (TNA): the behaviour of p4src/v1model/lhc.p4 under Tofino's limits.
//
// docs/tofino.md explains the layout and gives bf-p4c's measured placement; in short:
//   - Every register is touched by at most one RegisterAction per pass, and has at most four.
//   - Slot state: the round of each copy, {seq, epoch}, held twice (`round_stale_cV` says whether the
//     packet is of an older round, `round_start_cV` whether it starts one: a Tofino-1 stateful ALU has one
//     output), one register per copy indexed by slot_base + slot; then `bitmaps` (per cell: the
//     contributors, and whether a leaf's copy awaits its parent). A round is finished when its bitmap is
//     the job's full mask (TNA admits only fan_in == the worker count), and a leaf's copy awaits its parent
//     when the bitmap is the leaf's workers' mask: the controller's table `full_round`, keyed on (job,
//     bitmap), tells both; there is no count-down register.
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
// Compile: p4c --target tofino --arch tna (docs/tofino.md).
#include <core.p4>
#include <tna.p4>

#include "../shared/headers.p4"

// Recirculation port of pipe 0; the pipe bits of the ingress port are kept, so each pipe uses its own.
const bit<7> LHC_RECIRC_PORT_LOCAL = 68;

// Prepended to a packet between its passes (recirculation), before Ethernet. `flags` says what is left.
const bit<8> LHC_RECIRC_RESULT = 1;   // a finished copy: read the high halves, multicast
const bit<8> LHC_RECIRC_RETX_LO = 2;  // a duplicate of a finished copy: read the low halves (OR zeros)
const bit<8> LHC_RECIRC_RETX_HI = 3;  // ... then the high halves, unicast to the sender
const bit<8> LHC_RECIRC_UP = 4;       // a leaf's copy got its last worker: read the high halves, send up
const bit<8> LHC_RECIRC_UP_RETX_LO = 5;  // a repeat while the copy awaits its parent: the low halves
const bit<8> LHC_RECIRC_UP_RETX_HI = 6;  // ... then the high halves, the partial up again
// bitmaps.hi of a leaf's copy whose partial went up and whose parent's result has not come back.
const bit<32> LHC_AWAITING_PARENT = 1;
// A copy's cell: ver ++ slot, i.e. ver * MAX_SLOTS + slot (two PHV sources, which one Tofino instruction
// can combine; v1model's slot * 2 + ver would need a shift and an add).
typedef bit<LHC_CELL_INDEX_BITS> cell_index_t;

header lhc_recirc_t {
    bit<8>  flags;
    bit<16> mcast_grp;
    bit<16> slot;  // slot_base + slot; a later pass forms the cell again from it and hdr.lhc.ver
    @padding bit<7> _pad;
    PortId_t sender_port;
}

struct lhc_ig_headers_t {
    lhc_recirc_t  recirc;
    ethernet_t    ethernet;
    ipv4_t        ipv4;
    udp_t         udp;
    lhc_t         lhc;
    lhc_payload_t payload;
}

struct lhc_eg_headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    lhc_t      lhc;
}

// What the value registers do with this packet (the key of the `update_A_B` tables, with meta.seen).
const bit<8> LHC_VMODE_NONE = 0;   // nothing (not lhc, dropped, stale, ...)
const bit<8> LHC_VMODE_START = 1;  // the first contribution of a round: its words become the values
const bit<8> LHC_VMODE_SAME = 2;   // the copy's round: add or or (seen == 0), or a repeat (values untouched)
const bit<8> LHC_VMODE_OR = 3;     // OR zeros: read the low halves (retransmission, second pass)
const bit<8> LHC_VMODE_HI = 4;     // read the high halves (result or retransmission, last pass)

struct lhc_ig_metadata_t {
    bit<1>  later;         // a recirculated pass (set by the parser)
    bit<1>  job_hit;
    bit<1>  worker_hit;
    bit<8>  job_index;
    bit<8>  row;           // lhc_stats row: job_index once the packet passed the header checks, else 0
    bit<16> mcast_grp;
    bit<32> epoch;         // the job's epoch, widened to the register half
    bit<32> worker_bit;
    bit<16> slot;          // slot_base + slot: the bitmap registers' index
    bit<16> slot_room;     // slot_count - slot mod 2^16: in [1, MAX_SLOTS] exactly when slot < slot_count
    cell_index_t cell;     // ver ++ slot
    bit<32> stale;         // nonzero: the packet is of a round older than its copy's (round_stale_cV);
                           // a parent's result: not of the copy's round (round_other_cV)
    bit<32> starts;        // nonzero: it starts the copy's round: a fresh copy or a newer round
    bit<32> old_bitmap;    // this copy's bitmap before this packet (0 for the first of a round)
    bit<32> seen;          // old_bitmap & worker_bit: a repeat
    bit<1>  finished;      // hdr.lhc.bitmap (old | this worker) is the job's full mask (full_round)
    bit<1>  awaits;        // ... is a leaf's workers' mask: the copy awaits its parent (full_round)
    bit<8>  vmode;
    bit<8>  stat;
    // Two levels: a leaf's way up (`uplinks`), and whether this packet is its parent's result.
    bit<1>  has_uplink;
    PortId_t up_port;
    bit<8>  up_worker_id;
    bit<48> up_src_mac;
    bit<48> up_dst_mac;
    bit<32> up_src_addr;
    bit<32> up_dst_addr;
    bit<16> up_src_port;
    bit<16> up_dst_port;
    bit<32> parent_addr_diff;  // IPv4 source ^ the uplink's dst_addr: 0 from the parent's address
    bit<16> parent_udp_diff;   // UDP source port ^ its dst_port
    PortId_t parent_port_diff; // ingress port ^ its port
    bit<1>  from_parent;       // the leaf's parent's result of its copy's round (RESULT or RESULT_RETX)
}

struct lhc_eg_metadata_t { }

struct pair_t {
    bit<32> lo;
    bit<32> hi;
}

// ------------------------------------------------------------------------------------------------------
parser LhcIngressParser(packet_in packet,
                        out lhc_ig_headers_t hdr,
                        out lhc_ig_metadata_t meta,
                        out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        packet.extract(ig_intr_md);
        packet.advance(PORT_METADATA_SIZE);
        // Every metadata field starts at zero (Tofino does not clear metadata by itself).
        meta.later = 0;
        meta.job_hit = 0;
        meta.worker_hit = 0;
        meta.job_index = 0;
        meta.row = 0;
        meta.mcast_grp = 0;
        meta.epoch = 0;
        meta.worker_bit = 0;
        meta.slot = 0;
        meta.slot_room = 0;
        meta.cell = 0;
        meta.stale = 0;
        meta.starts = 0;
        meta.old_bitmap = 0;
        meta.seen = 0;
        meta.finished = 0;
        meta.awaits = 0;
        meta.vmode = LHC_VMODE_NONE;
        meta.stat = 0;
        meta.has_uplink = 0;
        meta.up_port = 0;
        meta.up_worker_id = 0;
        meta.up_src_mac = 0;
        meta.up_dst_mac = 0;
        meta.up_src_addr = 0;
        meta.up_dst_addr = 0;
        meta.up_src_port = 0;
        meta.up_dst_port = 0;
        meta.parent_addr_diff = 0;
        meta.parent_udp_diff = 0;
        meta.parent_port_diff = 0;
        meta.from_parent = 0;
        transition select(ig_intr_md.ingress_port[6:0]) {
            LHC_RECIRC_PORT_LOCAL: parse_recirc;
            default: parse_ethernet;
        }
    }

    // Only accepted lhc packets recirculate, and they keep their lhc port until the last pass: a
    // recirculated packet is always a whole lhc frame, parsed without looking at it again.
    state parse_recirc {
        packet.extract(hdr.recirc);
        meta.later = 1;
        packet.extract(hdr.ethernet);
        packet.extract(hdr.ipv4);
        packet.extract(hdr.udp);
        packet.extract(hdr.lhc);
        packet.extract(hdr.payload);
        transition accept;
    }

#include "../shared/parser.p4"
}

// A register pair of value lanes A and B = A + 1, its four RegisterActions and the table that picks one.
// The update returns the new low half; `hi` reads the high half in a later pass. A retransmission reads
// the low halves by OR-ing zeros, so four RegisterActions suffice.
#define LHC_TNA_PAIR(A, B)                                                                        \
    Register<pair_t, cell_index_t>(LHC_SLOT_CELLS) values_##A##_##B;                              \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) first_##A##_##B = {           \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = hdr.payload.w##A;                                                              \
            v.hi = hdr.payload.w##B;                                                              \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) add_##A##_##B = {             \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = v.lo + hdr.payload.w##A;                                                       \
            v.hi = v.hi + hdr.payload.w##B;                                                       \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) or_##A##_##B = {              \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = v.lo | hdr.payload.w##A;                                                       \
            v.hi = v.hi | hdr.payload.w##B;                                                       \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) hi_##A##_##B = {              \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            rv = v.hi;                                                                            \
        }                                                                                         \
    };                                                                                            \
    action do_first_##A##_##B() { hdr.payload.w##A = first_##A##_##B.execute(meta.cell); }        \
    action do_add_##A##_##B() { hdr.payload.w##A = add_##A##_##B.execute(meta.cell); }            \
    action do_or_##A##_##B() { hdr.payload.w##A = or_##A##_##B.execute(meta.cell); }              \
    action do_hi_##A##_##B() { hdr.payload.w##B = hi_##A##_##B.execute(meta.cell); }              \
    table update_##A##_##B {                                                                      \
        key = {                                                                                   \
            meta.vmode: ternary;                                                                  \
            meta.seen: ternary;                                                                   \
            hdr.lhc.op: ternary;                                                                  \
        }                                                                                         \
        actions = { do_first_##A##_##B; do_add_##A##_##B; do_or_##A##_##B; do_hi_##A##_##B;       \
                    @defaultonly NoAction; }                                                      \
        const default_action = NoAction();                                                        \
        size = 8;                                                                                 \
        const entries = {                                                                         \
            (LHC_VMODE_START, _, _): do_first_##A##_##B();                                        \
            (LHC_VMODE_SAME, 0, LHC_OP_ADD): do_add_##A##_##B();                                  \
            (LHC_VMODE_SAME, 0, LHC_OP_OR): do_or_##A##_##B();                                    \
            (LHC_VMODE_OR, _, _): do_or_##A##_##B();                                              \
            (LHC_VMODE_HI, _, _): do_hi_##A##_##B();                                              \
        }                                                                                         \
    }
#define LHC_TNA_PAIR_APPLY(A, B) update_##A##_##B.apply();
#define LHC_TNA_ZERO_LANE(L) hdr.payload.w##L = 0;

// A drop's outcome and the drop itself each alone in its container: then the many drops of the checks set
// them with an instruction's constant, where a container shared with other fields needs a bitmasked set
// whose value and mask take action-data-bus bytes, which stage 1 needs for the round registers' outputs.
@pa_solitary("ingress", "meta.stat")
@pa_solitary("ingress", "ig_intr_md_for_dprsr.drop_ctl")
control LhcIngress(inout lhc_ig_headers_t hdr,
                   inout lhc_ig_metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    Counter<bit<32>, bit<32>>(LHC_STATS_CELLS, CounterType_t.PACKETS_AND_BYTES) lhc_stats;
    // job_index * NUM_STATS + stat is the concatenation row ++ stat[3:0] (NUM_STATS == 16): an identity
    // hash forms it, because a counter's address must come from the hash unit or one PHV field.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) stats_index;

    // --- slot state ---------------------------------------------------------------------------------
    // Branch order matters below: bf-p4c 9.13.4 decides whether `rv = v.lo` outputs the stored value
    // (mem_lo) or the updated one (alu_lo) by whether *any* earlier statement, even in the other branch
    // of an if, wrote v.lo. So a branch that returns a stored half comes before any write of that half.
    //
    // The round of each copy, {lo: seq, hi: epoch}, indexed by slot_base + slot; two registers hold the
    // same value, each answering one question. Both record the packet's seq unless it is older than the
    // copy's round (equal: no change; newer or a fresh copy: the packet starts that round). Comparisons are
    // unsigned: hosts never let seq wrap within an epoch (docs/protocol.md). Where v1model starts only the
    // round 2 * slot_count after a finished one, this starts any newer round: for hosts that keep the
    // window rule these are the same packets (docs/switch.md, "Round identity"; docs/tofino.md).
#define LHC_TNA_ROUND_REGISTERS(C)                                                                \
    Register<pair_t, bit<16>>(LHC_MAX_SLOTS) round_stale_##C;                                     \
    Register<pair_t, bit<16>>(LHC_MAX_SLOTS) round_start_##C;                                     \
    /* Nonzero (the epoch) when the packet's round is older than the copy's: it is dropped. */    \
    RegisterAction<pair_t, bit<16>, bit<32>>(round_stale_##C) round_stale_##C##_check = {         \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi == meta.epoch && hdr.lhc.seq < v.lo) {                                       \
                rv = v.hi;                                                                        \
            } else {                                                                              \
                rv = 0;                                                                           \
                v.lo = hdr.lhc.seq;                                                               \
                v.hi = meta.epoch;                                                                \
            }                                                                                     \
        }                                                                                         \
    };                                                                                            \
    /* Nonzero (the epoch) when the packet starts the copy's round: a fresh copy or a newer one. */ \
    RegisterAction<pair_t, bit<16>, bit<32>>(round_start_##C) round_start_##C##_check = {         \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi != meta.epoch || hdr.lhc.seq > v.lo) {                                       \
                v.lo = hdr.lhc.seq;                                                               \
                v.hi = meta.epoch;                                                                \
                rv = v.hi;                                                                        \
            } else {                                                                              \
                rv = 0;                                                                           \
            }                                                                                     \
        }                                                                                         \
    };                                                                                            \
    /* A parent's result: nonzero unless it is of the copy's round (it is then stale). Writes     \
       nothing. Its output goes where round_stale's does (one output field per stateful ALU). */  \
    RegisterAction<pair_t, bit<16>, bit<32>>(round_stale_##C) round_other_##C##_check = {         \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi == meta.epoch && hdr.lhc.seq == v.lo) {                                      \
                rv = 0;                                                                           \
            } else {                                                                              \
                rv = 1;                                                                           \
            }                                                                                     \
        }                                                                                         \
    };
    LHC_TNA_ROUND_REGISTERS(c0)
    LHC_TNA_ROUND_REGISTERS(c1)

    // Per cell, {lo: the contributors of the copy's round, hi: LHC_AWAITING_PARENT while a leaf's copy
    // awaits its parent, else 0}. The first of a round sets its bit alone; a later packet of the round ORs
    // its bit in and gets the bitmap as found (its bit set: a repeat). A leaf marks its copy awaiting in the
    // pass that sends the partial up (the first pass cannot: it learns that the leaf's round is complete
    // only in `full_round`, after this stage), and its parent's result is stored only by a marked copy.
    Register<pair_t, cell_index_t>(LHC_SLOT_CELLS) bitmaps;
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_start = {
        void apply(inout pair_t v) {
            v.lo = meta.worker_bit;
            v.hi = 0;
        }
    };
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_join = {
        void apply(inout pair_t v, out bit<32> rv) {
            rv = v.lo;
            v.lo = v.lo | meta.worker_bit;
        }
    };
    // The partial (its bitmap the leaf's workers') goes up: the copy awaits its parent, unless a result
    // was stored meanwhile (a repeat's partial can still be in its later passes then).
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_await = {
        void apply(inout pair_t v) {
            if (v.lo == hdr.lhc.bitmap) {
                v.hi = LHC_AWAITING_PARENT;
            }
        }
    };
    // The parent's result of the copy's round: 0 when the copy awaited it (then it holds the result's
    // bitmap and is final); otherwise the bitmap as found, and nothing is written.
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_store = {
        void apply(inout pair_t v, out bit<32> rv) {
            if (v.hi != LHC_AWAITING_PARENT) {
                rv = v.lo;
            } else {
                v.lo = hdr.lhc.bitmap;
                v.hi = 0;
                rv = 0;
            }
        }
    };

    // --- tables (the same names, keys and actions as v1model; docs/switch.md) -------------------------
    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    action set_port(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
        ig_tm_md.bypass_egress = 1;
    }

    action route(PortId_t port, bit<48> src_mac, bit<48> dst_mac) {
        ig_tm_md.ucast_egress_port = port;
        ig_tm_md.bypass_egress = 1;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    table ipv4_routes {
        key = { hdr.ipv4.dst_addr: lpm; }
        actions = { route; @defaultonly drop; }
        const default_action = drop();
        size = 1024;
    }

    table l2_forward {
        key = { hdr.ethernet.dst_addr: exact; }
        actions = { set_port; @defaultonly drop; }
        const default_action = drop();
        size = 1024;
    }

    action set_job(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, @noWarn("unused") bit<8> fan_in,
                   bit<16> mcast_grp, bit<16> epoch) {
        meta.job_hit = 1;
        meta.job_index = job_index;
        // Here, not in the apply block: a register address must be a plain PHV field, and bf-p4c folds a
        // straight-line `slot_base + slot` into the address expression.
        meta.slot = slot_base + hdr.lhc.slot;
        // A gateway compares a field with a constant, not two fields. With slot < MAX_SLOTS (checked first)
        // and slot_count <= MAX_SLOTS, slot >= slot_count makes this 0 or >= 2^16 - MAX_SLOTS + 1.
        meta.slot_room = slot_count - hdr.lhc.slot;
        // fan_in is v1model's count-down; here a round's end is its bitmap (`full_round`).
        meta.mcast_grp = mcast_grp;
        meta.epoch = (bit<32>)epoch;
    }

    action unknown_job() {
        meta.job_hit = 0;
    }

    table jobs {
        key = { hdr.lhc.job_id: exact; }
        actions = { set_job; @defaultonly unknown_job; }
        const default_action = unknown_job();
        size = LHC_MAX_JOBS;
    }

    action admit_worker(bit<32> worker_bit) {
        meta.worker_hit = 1;
        meta.worker_bit = worker_bit;
    }

    action reject_worker() {
        meta.worker_hit = 0;
    }

    table workers {
        key = {
            hdr.lhc.job_id: exact;
            hdr.lhc.worker_id: exact;
            hdr.ipv4.src_addr: exact;
            hdr.udp.src_port: exact;
            ig_intr_md.ingress_port: exact;
        }
        actions = { admit_worker; @defaultonly reject_worker; }
        const default_action = reject_worker();
        size = 2048;
    }

    // --- two levels: a leaf's way up to its parent (docs/switch.md, "Two levels") -----------------
    // A gateway compares a field with a constant, not two fields: "from the parent" is three differences
    // (address, UDP port, switch port) that must be 0, formed here by XOR with the uplink's values.
    action set_uplink(PortId_t port, bit<8> worker_id, bit<48> src_mac, bit<48> dst_mac, bit<32> src_addr,
                      bit<32> dst_addr, bit<16> src_port, bit<16> dst_port) {
        meta.has_uplink = 1;
        meta.up_port = port;
        meta.up_worker_id = worker_id;
        meta.up_src_mac = src_mac;
        meta.up_dst_mac = dst_mac;
        meta.up_src_addr = src_addr;
        meta.up_dst_addr = dst_addr;
        meta.up_src_port = src_port;
        meta.up_dst_port = dst_port;
        meta.parent_addr_diff = hdr.ipv4.src_addr ^ dst_addr;
        meta.parent_udp_diff = hdr.udp.src_port ^ dst_port;
        meta.parent_port_diff = ig_intr_md.ingress_port ^ port;
    }

    // No uplink: no result is from a parent (a nonzero difference).
    action no_uplink() {
        meta.has_uplink = 0;
        meta.parent_addr_diff = 1;
    }

    table uplinks {
        key = { hdr.lhc.job_id: exact; }
        actions = { set_uplink; @defaultonly no_uplink; }
        const default_action = no_uplink();
        size = LHC_MAX_JOBS;
    }

    // The value registers: one table per pair (const entries; the controller never touches them).
    LHC_FOR_EACH_LANE_PAIR(LHC_TNA_PAIR)

    // --- first pass: checks and slot state ----------------------------------------------------------
    // One action per drop, its outcome a constant in the body (an instruction's immediate): an action
    // argument would be action data, and stage 1's action data bus is needed for the round registers'
    // outputs. Dropped before `jobs` applies in v1model: counted in row 0.
#define LHC_TNA_REJECT(NAME, STAT)                                                                \
    action reject_##NAME() {                                                                      \
        meta.stat = (bit<8>)STAT;                                                                 \
        drop();                                                                                   \
    }
    // Dropped after `jobs` hit: counted in the job's row.
#define LHC_TNA_REJECT_IN_JOB(NAME, STAT)                                                         \
    action reject_##NAME() {                                                                      \
        meta.row = meta.job_index;                                                                \
        meta.stat = (bit<8>)STAT;                                                                 \
        drop();                                                                                   \
    }
    LHC_TNA_REJECT(malformed, LHC_STAT_DROP_MALFORMED)
    LHC_TNA_REJECT(bad_type, LHC_STAT_DROP_BAD_TYPE)
    LHC_TNA_REJECT(bad_op, LHC_STAT_DROP_BAD_OP)
    LHC_TNA_REJECT(unknown_job, LHC_STAT_DROP_UNKNOWN_JOB)
    LHC_TNA_REJECT_IN_JOB(stale_epoch, LHC_STAT_DROP_STALE_EPOCH)
    LHC_TNA_REJECT_IN_JOB(slot_range, LHC_STAT_DROP_SLOT_RANGE)
    LHC_TNA_REJECT_IN_JOB(bad_worker, LHC_STAT_DROP_BAD_WORKER)
    LHC_TNA_REJECT_IN_JOB(stale_round, LHC_STAT_DROP_STALE_ROUND)
    LHC_TNA_REJECT_IN_JOB(stale_result, LHC_STAT_DROP_STALE_RESULT)

    action accept() {
        meta.row = meta.job_index;
        meta.cell = hdr.lhc.ver ++ meta.slot[(LHC_SLOT_INDEX_BITS - 1):0];
        hdr.recirc.setValid();
        hdr.recirc.flags = 0;
        hdr.recirc.mcast_grp = meta.mcast_grp;
        hdr.recirc.slot = meta.slot;
        hdr.recirc.sender_port = ig_intr_md.ingress_port;
    }

    action start_round() {
        bitmap_start.execute(meta.cell);
        meta.old_bitmap = 0;
        meta.vmode = LHC_VMODE_START;
    }

    action join_round() {
        meta.old_bitmap = bitmap_join.execute(meta.cell);
        meta.vmode = LHC_VMODE_SAME;
    }

    // An action, so that bf-p4c keeps `seen` a field for the gateway instead of folding in the AND.
    // A result's bitmap is the copy's bitmap with this worker in it (a repeat's bit is already there).
    action note_bitmap() {
        meta.seen = meta.old_bitmap & meta.worker_bit;
        hdr.lhc.bitmap = meta.old_bitmap | meta.worker_bit;
    }

    // What the round's bitmap (this packet's bit included) means for the job: its full mask (the round is
    // finished), or on a leaf its workers' mask (the copy awaits its parent). The controller writes one
    // entry per job, two on a leaf (lhc_ina.jobs.job_entries, target "tna"): the masks are per job.
    action round_is_full() {
        meta.finished = 1;
    }

    action round_awaits_parent() {
        meta.awaits = 1;
    }

    table full_round {
        key = {
            hdr.lhc.job_id: exact;
            hdr.lhc.bitmap: exact;
        }
        actions = { round_is_full; round_awaits_parent; @defaultonly NoAction; }
        const default_action = NoAction();
        size = 2 * LHC_MAX_JOBS;
    }

    // --- outcomes -------------------------------------------------------------------------------------
    action to_recirculation() {
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ LHC_RECIRC_PORT_LOCAL;
        ig_tm_md.bypass_egress = 1;
    }

    action result() {
        hdr.lhc.msg_type = LHC_TYPE_RESULT;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        hdr.recirc.flags = LHC_RECIRC_RESULT;
        meta.stat = (bit<8>)LHC_STAT_RESULT;
        to_recirculation();
    }

    action absorbed() {
        meta.stat = (bit<8>)LHC_STAT_ABSORBED;
        drop();
    }

    action retransmit() {
        hdr.lhc.msg_type = LHC_TYPE_RESULT_RETX;
        bit<48> mac = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = mac;
        bit<32> addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = addr;
        // The UDP ports are swapped in the last pass (send_retransmission): until then the destination
        // stays the lhc port, which the counter below and the parser of the later passes rely on.
        hdr.udp.checksum = 0;
        hdr.recirc.flags = LHC_RECIRC_RETX_LO;
        meta.stat = (bit<8>)LHC_STAT_RETX;
        to_recirculation();
    }

    action duplicate() {
        meta.stat = (bit<8>)LHC_STAT_DROP_DUPLICATE;
        drop();
    }

    // A leaf's round is complete (its workers' mask): the partial goes up after the pass that reads the
    // high halves (send_up).
    action up() {
        hdr.recirc.flags = LHC_RECIRC_UP;
        meta.stat = (bit<8>)LHC_STAT_UP;
        to_recirculation();
    }

    // A repeat while the copy awaits its parent: the partial goes up again (low, then high halves).
    action up_retransmit() {
        hdr.recirc.flags = LHC_RECIRC_UP_RETX_LO;
        meta.stat = (bit<8>)LHC_STAT_UP_RETX;
        to_recirculation();
    }

    // --- a parent's result, on a leaf ------------------------------------------------------------------
    // Of the copy's round (same epoch and seq): the copy stores it if it awaits it (bitmap_store).
    action store_result() {
        meta.from_parent = 1;
        meta.old_bitmap = bitmap_store.execute(meta.cell);
    }

    // Stored: its words become the values (`first`), and it is the leaf's result as it stands.
    action stored_result() {
        meta.vmode = LHC_VMODE_START;
    }

    // Not stored: `full_round` on the copy's bitmap tells a final copy (a duplicate) from one that is not
    // awaiting this result (stale). The packet is dropped, so its bitmap field can carry the key.
    action note_result() {
        hdr.lhc.bitmap = meta.old_bitmap;
    }

    // The leaf's RESULT: the parent's result, sourced from the address it was sent to, multicast in this
    // very pass (its payload is the result; `first` returned its low halves unchanged).
    action result_from_parent() {
        hdr.lhc.msg_type = LHC_TYPE_RESULT;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        ig_tm_md.mcast_grp_a = meta.mcast_grp;
        hdr.recirc.setInvalid();
        meta.stat = (bit<8>)LHC_STAT_RESULT;
    }

    // --- later passes -------------------------------------------------------------------------------
    action later_pass() {
        meta.cell = hdr.lhc.ver ++ hdr.recirc.slot[(LHC_SLOT_INDEX_BITS - 1):0];
        meta.vmode = LHC_VMODE_HI;
    }

    action read_low_halves() {
        LHC_FOR_EACH_LANE(LHC_TNA_ZERO_LANE)
        meta.vmode = LHC_VMODE_OR;
    }

    action read_high_halves_next() {
        hdr.recirc.flags = LHC_RECIRC_RETX_HI;
        to_recirculation();
    }

    action read_high_halves_next_up() {
        hdr.recirc.flags = LHC_RECIRC_UP_RETX_HI;
        to_recirculation();
    }

    // The pass that sends the partial up: the copy now awaits its parent.
    action mark_awaiting() {
        bitmap_await.execute(meta.cell);
    }

    action send_result() {
        ig_tm_md.mcast_grp_a = hdr.recirc.mcast_grp;
        hdr.recirc.setInvalid();
    }

    action send_retransmission() {
        bit<16> port = hdr.udp.src_port;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.dst_port = port;
        ig_tm_md.ucast_egress_port = hdr.recirc.sender_port;
        ig_tm_md.bypass_egress = 1;
        hdr.recirc.setInvalid();
    }

    // The leaf's partial (the payload holds the copy's values, the bitmap its workers' mask), one DATA
    // packet up: addresses and port from `uplinks`, looked up again in this pass.
    action send_up() {
        hdr.lhc.worker_id = meta.up_worker_id;
        hdr.ethernet.src_addr = meta.up_src_mac;
        hdr.ethernet.dst_addr = meta.up_dst_mac;
        hdr.ipv4.src_addr = meta.up_src_addr;
        hdr.ipv4.dst_addr = meta.up_dst_addr;
        hdr.udp.src_port = meta.up_src_port;
        hdr.udp.dst_port = meta.up_dst_port;
        hdr.udp.checksum = 0;
        ig_tm_md.ucast_egress_port = meta.up_port;
        ig_tm_md.bypass_egress = 1;
        hdr.recirc.setInvalid();
    }

    // What becomes of the packet, from what the stages before found: one table, so that the outcomes
    // take one stage's logical tables, not one gateway and one table each. Entries in priority order.
    // full_round's flags matter only for a contribution (START or SAME) or a parent's result.
    table outcome {
        key = {
            meta.from_parent: ternary;
            meta.vmode: ternary;
            meta.seen: ternary;
            meta.finished: ternary;
            meta.awaits: ternary;
            hdr.recirc.flags: ternary;
            meta.has_uplink: ternary;
        }
        actions = {
            result_from_parent; duplicate; reject_stale_result; result; up; absorbed; retransmit;
            up_retransmit; read_high_halves_next; read_high_halves_next_up; send_result;
            send_retransmission; send_up; drop; @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = 32;
        const entries = {
            // A parent's result of the copy's round (a leaf): stored, or the copy is final, or not awaiting.
            (1, LHC_VMODE_START, _, _, _, _, _): result_from_parent();
            (1, _, _, 1, _, _, _): duplicate();
            (1, _, _, _, _, _, _): reject_stale_result();
            // A worker's (or, at a spine, a leaf's) packet: the first of a round, or one of its round.
            (0, LHC_VMODE_START, _, 1, _, _, _): result();
            (0, LHC_VMODE_START, _, _, 1, _, _): up();
            (0, LHC_VMODE_START, _, _, _, _, _): absorbed();
            (0, LHC_VMODE_SAME, 0, 1, _, _, _): result();
            (0, LHC_VMODE_SAME, 0, _, 1, _, _): up();
            (0, LHC_VMODE_SAME, 0, _, _, _, _): absorbed();
            (0, LHC_VMODE_SAME, _, 1, _, _, _): retransmit();
            (0, LHC_VMODE_SAME, _, _, 1, _, _): up_retransmit();
            (0, LHC_VMODE_SAME, _, _, _, _, _): duplicate();
            // Later passes: the low halves were read (retransmissions), or the high halves (the last pass).
            (_, LHC_VMODE_OR, _, _, _, LHC_RECIRC_RETX_LO, _): read_high_halves_next();
            (_, LHC_VMODE_OR, _, _, _, _, _): read_high_halves_next_up();
            (_, LHC_VMODE_HI, _, _, _, LHC_RECIRC_RESULT, _): send_result();
            (_, LHC_VMODE_HI, _, _, _, LHC_RECIRC_RETX_HI, _): send_retransmission();
            (_, LHC_VMODE_HI, _, _, _, _, 1): send_up();
            (_, LHC_VMODE_HI, _, _, _, _, _): drop();  // a partial whose uplink went between the passes
        }
    }

    // First pass of an lhc packet: checks, slot state and every value lane; the outcome is counted here.
    // Only a result and a leaf's partial (one more pass: the high halves) and a retransmission of either
    // (two more: low, then high halves) recirculate; a leaf's RESULT from its parent's does not. Egress
    // sees only the multicast copies of a result.
    apply {
        // On every pass: a later pass that sends a partial up needs the uplink's addresses again.
        if (hdr.lhc.isValid()) {
            uplinks.apply();
        }
        if (meta.later == 1) {
            later_pass();
            if (hdr.recirc.flags == LHC_RECIRC_RETX_LO || hdr.recirc.flags == LHC_RECIRC_UP_RETX_LO) {
                read_low_halves();
            } else if (hdr.recirc.flags == LHC_RECIRC_UP || hdr.recirc.flags == LHC_RECIRC_UP_RETX_HI) {
                mark_awaiting();
            }
        } else if (hdr.udp.isValid() && (hdr.udp.dst_port & LHC_UDP_PORT_MASK) == LHC_UDP_PORT_BASE) {
            // Both lookups run on every lhc packet (they only read), so that neither waits for the other
            // or for the checks; the checks below decide, in v1model's order, what their results mean.
            jobs.apply();
            workers.apply();
            // One small condition each: a Tofino gateway reads at most 4 bytes + 12 bits of PHV.
            if (ig_prsr_md.parser_err != PARSER_ERROR_OK || !hdr.payload.isValid() || hdr.lhc.flags != 0) {
                reject_malformed();
            } else if (hdr.udp.length != LHC_UDP_LENGTH || hdr.ipv4.total_len != LHC_IPV4_TOTAL_LENGTH) {
                reject_malformed();
            } else if (hdr.lhc.msg_type != LHC_TYPE_DATA && hdr.lhc.msg_type != LHC_TYPE_RESULT
                    && hdr.lhc.msg_type != LHC_TYPE_RESULT_RETX) {
                reject_bad_type();
            } else if (hdr.lhc.msg_type != LHC_TYPE_DATA && meta.parent_addr_diff != 0) {
                // A result is taken only by a leaf, only from its parent: address (no uplink: nonzero),
                // UDP port and switch port.
                reject_bad_type();
            } else if (hdr.lhc.msg_type != LHC_TYPE_DATA
                    && (meta.parent_udp_diff != 0 || meta.parent_port_diff != 0)) {
                reject_bad_type();
            } else if (hdr.lhc.op != LHC_OP_ADD && hdr.lhc.op != LHC_OP_OR) {
                reject_bad_op();
            } else if (meta.job_hit == 0) {
                reject_unknown_job();
            } else if ((bit<32>)hdr.lhc.epoch != meta.epoch) {
                reject_stale_epoch();
            } else if (hdr.lhc.slot[15:LHC_SLOT_INDEX_BITS] != 0 || meta.slot_room == 0
                    || meta.slot_room[15:(LHC_SLOT_INDEX_BITS + 1)] != 0
                    || meta.slot[15:LHC_SLOT_INDEX_BITS] != 0) {
                reject_slot_range();
            } else if (hdr.lhc.msg_type == LHC_TYPE_DATA && meta.worker_hit == 0) {
                reject_bad_worker();
            } else {
                accept();
                if (hdr.lhc.msg_type != LHC_TYPE_DATA) {
                    // The parent's result: stored only by a copy that awaits exactly this round; it never
                    // starts, joins or stamps a copy.
                    if (hdr.lhc.ver == 0) {
                        meta.stale = round_other_c0_check.execute(meta.slot);
                    } else {
                        meta.stale = round_other_c1_check.execute(meta.slot);
                    }
                    if (meta.stale != 0) {
                        reject_stale_result();
                    } else {
                        store_result();
                        if (meta.old_bitmap == 0) {
                            stored_result();
                        } else {
                            note_result();
                        }
                    }
                } else {
                    if (hdr.lhc.ver == 0) {
                        meta.stale = round_stale_c0_check.execute(meta.slot);
                        meta.starts = round_start_c0_check.execute(meta.slot);
                    } else {
                        meta.stale = round_stale_c1_check.execute(meta.slot);
                        meta.starts = round_start_c1_check.execute(meta.slot);
                    }
                    if (meta.stale != 0) {
                        reject_stale_round();
                    } else {
                        if (meta.starts != 0) {
                            start_round();
                        } else {
                            join_round();
                        }
                        note_bitmap();
                    }
                }
            }
        } else if (ig_prsr_md.parser_err != PARSER_ERROR_OK) {
            drop();
        } else if (hdr.ipv4.isValid()) {
            if (hdr.ipv4.ttl <= 1) {
                drop();
            } else {
                ipv4_routes.apply();
            }
        } else {
            l2_forward.apply();
        }

        // Every pass: the value registers (meta.vmode and meta.seen say what to do; nothing for others).
        LHC_FOR_EACH_LANE_PAIR(LHC_TNA_PAIR_APPLY)
        full_round.apply();
        outcome.apply();
        // The lhc branch above, tested again: no first-pass action rewrites udp.dst_port.
        if (meta.later == 0 && hdr.udp.isValid()
                && (hdr.udp.dst_port & LHC_UDP_PORT_MASK) == LHC_UDP_PORT_BASE) {
            lhc_stats.count(stats_index.get({meta.row, meta.stat[3:0]}));
        }
    }
}

control LhcIngressDeparser(packet_out packet,
                           inout lhc_ig_headers_t hdr,
                           in lhc_ig_metadata_t meta,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        hdr.ipv4.hdr_checksum = ipv4_checksum.update({
            hdr.ipv4.version,
            hdr.ipv4.ihl,
            hdr.ipv4.diffserv,
            hdr.ipv4.total_len,
            hdr.ipv4.identification,
            hdr.ipv4.flags,
            hdr.ipv4.frag_offset,
            hdr.ipv4.ttl,
            hdr.ipv4.protocol,
            hdr.ipv4.src_addr,
            hdr.ipv4.dst_addr
        });
        packet.emit(hdr.recirc);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.lhc);
        packet.emit(hdr.payload);
    }
}

// ------------------------------------------------------------------------------------------------------
// Egress: only the multicast copies of a result get here (every other packet bypasses egress), so the
// parser always extracts the headers up to lhc (enough for Tofino's minimum egress parse depth); the
// payload passes through untouched.
parser LhcEgressParser(packet_in packet,
                       out lhc_eg_headers_t hdr,
                       out lhc_eg_metadata_t meta,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        packet.extract(eg_intr_md);
        packet.extract(hdr.ethernet);
        packet.extract(hdr.ipv4);
        packet.extract(hdr.udp);
        packet.extract(hdr.lhc);
        transition accept;
    }
}

control LhcEgress(inout lhc_eg_headers_t hdr,
                  inout lhc_eg_metadata_t meta,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

    action set_replica_dst(bit<48> dst_mac, bit<32> dst_addr, bit<16> dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_addr;
        hdr.udp.dst_port = dst_port;
    }

    action drop_replica() {
        eg_dprsr_md.drop_ctl = 1;
    }

    table replicas {
        key = {
            hdr.lhc.job_id: exact;
            eg_intr_md.egress_rid: exact;
        }
        actions = { set_replica_dst; @defaultonly drop_replica; }
        const default_action = drop_replica();
        size = 2048;
    }

    apply {
        if (hdr.lhc.isValid() && hdr.lhc.msg_type == LHC_TYPE_RESULT) {
            replicas.apply();
        }
    }
}

control LhcEgressDeparser(packet_out packet,
                          inout lhc_eg_headers_t hdr,
                          in lhc_eg_metadata_t meta,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version,
                hdr.ipv4.ihl,
                hdr.ipv4.diffserv,
                hdr.ipv4.total_len,
                hdr.ipv4.identification,
                hdr.ipv4.flags,
                hdr.ipv4.frag_offset,
                hdr.ipv4.ttl,
                hdr.ipv4.protocol,
                hdr.ipv4.src_addr,
                hdr.ipv4.dst_addr
            });
        }
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.lhc);
    }
}

Pipeline(LhcIngressParser(), LhcIngress(), LhcIngressDeparser(),
         LhcEgressParser(), LhcEgress(), LhcEgressDeparser()) pipe;

Switch(pipe) main;
