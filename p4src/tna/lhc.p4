// lhc-ina on Tofino (TNA): the behaviour of p4src/v1model/lhc.p4 under Tofino's limits.
//
// docs/tofino.md explains the layout; in short:
//   - Every register is touched by at most one RegisterAction per pass.
//   - Slot state per copy: `bitmap_c0` / `bitmap_c1` (one register per copy, indexed by slot, each cell a
//     {bitmap, epoch} pair, so a packet joins its copy and leaves the other in one stage) and `count`
//     ({remaining, epoch} per cell). The epoch lives next to the state it guards: the lazy reset is part of
//     the same RegisterAction.
//   - Values: lanes 0 .. 2*LHC_TNA_PASS1_PAIRS-1 in 64-bit register pairs updated in the first pass (a
//     RegisterAction updates both halves but returns one: the low one); the other lanes in single registers
//     updated in the second pass. Every accepted DATA packet is recirculated once; the second pass updates
//     the single-register lanes and, for a result, harvests the high halves of the pairs.
//   - ADD is bit<32> addition: wraps mod 2^32 (Tofino's stateful ALU adds without saturation).
//   - A job's workers sit on one pipe (registers are per pipe); the recirculation port is that pipe's.
//
// Per-lane code is written once and expanded by the generated X-macros (p4src/shared/constants.p4).
// Written to bf-p4c's TNA (tna.p4); compile: see docs/tofino.md. Not compiled in this repository's CI.
#include <core.p4>
#include <tna.p4>


#include "../shared/headers.p4"

// Recirculation port of pipe 0; the pipe bits of the ingress port are kept, so each pipe uses its own.
const bit<7> LHC_RECIRC_PORT_LOCAL = 68;

// Ingress -> egress bridge: tells the egress parser whether the packet is a RESULT to rewrite per replica.
const bit<8> LHC_BRIDGE_PLAIN = 0;
const bit<8> LHC_BRIDGE_RESULT = 1;
header lhc_bridge_t {
    bit<8> kind;
}

// Prepended to a packet between its two passes (recirculation), before Ethernet.
const bit<8> LHC_PASS2_UPDATE = 1;   // new contribution: update the second-pass lanes
const bit<8> LHC_PASS2_FIRST = 2;    // ... and it is the first of its round (write, not combine)
const bit<8> LHC_PASS2_RESULT = 4;   // the copy finished with this packet: harvest, multicast
const bit<8> LHC_PASS2_RETX = 8;     // duplicate of a finished copy: harvest, unicast to the sender
// A copy's cell: ver ++ slot, i.e. ver * MAX_SLOTS + slot (two PHV sources, which one Tofino instruction
// can combine; v1model's slot * 2 + ver would need a shift and an add).
typedef bit<LHC_CELL_INDEX_BITS> cell_index_t;

header lhc_recirc_t {
    bit<8>  flags;
    bit<8>  job_index;
    bit<16> mcast_grp;
    bit<16> slot;  // slot_base + slot; the second pass forms the cell again from it and hdr.lhc.ver
    @padding bit<7> _pad;
    PortId_t sender_port;
}

struct lhc_ig_headers_t {
    lhc_bridge_t  bridge;
    lhc_recirc_t  recirc;
    ethernet_t    ethernet;
    ipv4_t        ipv4;
    udp_t         udp;
    lhc_t         lhc;
    lhc_payload_t payload;
}

struct lhc_eg_headers_t {
    lhc_bridge_t bridge;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    lhc_t        lhc;
}

struct lhc_ig_metadata_t {
    bit<8>  job_index;
    bit<16> slot_base;
    bit<16> slot_count;
    bit<8>  fan_in;
    bit<16> mcast_grp;
    bit<32> epoch;         // the job's epoch, widened to the register half
    bit<32> worker_bit;
    bit<32> fan_in_m1;     // fan_in - 1
    bit<16> slot;          // slot_base + slot: the bitmap registers' index
    cell_index_t cell;     // ver ++ slot
    bit<32> old_bitmap;    // this copy's bitmap before this packet (0 after a lazy reset)
    bit<32> seen;          // old_bitmap & worker_bit
    bit<32> remaining;     // count after this packet (new contribution) or as found (duplicate)
    bit<16> slot_room;     // slot_count - slot mod 2^16: in [1, MAX_SLOTS] exactly when slot < slot_count
    bit<1>  malformed;
    bit<1>  first;
    bit<1>  finished;
    bit<32> stat;
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
        // The flags below are only ever set by the ingress control: start them at zero.
        meta.job_index = 0;
        meta.worker_bit = 0;
        meta.first = 0;
        meta.finished = 0;
        meta.stat = LHC_STAT_DROP_MALFORMED;
        transition select(ig_intr_md.ingress_port[6:0]) {
            LHC_RECIRC_PORT_LOCAL: parse_recirc;
            default: parse_ethernet;
        }
    }

    state parse_recirc {
        packet.extract(hdr.recirc);
        transition parse_ethernet;
    }

#include "../shared/parser.p4"
}

// Register-pair value lanes (first pass). A, B: the two lanes of the pair.
#define LHC_TNA_PAIR_DECL(A, B)                                                                   \
    Register<pair_t, cell_index_t>(LHC_SLOT_CELLS) values_##A##_##B;                                   \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) first_##A##_##B = {                \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = hdr.payload.w##A;                                                              \
            v.hi = hdr.payload.w##B;                                                              \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) add_##A##_##B = {                  \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = v.lo + hdr.payload.w##A;                                                       \
            v.hi = v.hi + hdr.payload.w##B;                                                       \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) or_##A##_##B = {                   \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = v.lo | hdr.payload.w##A;                                                       \
            v.hi = v.hi | hdr.payload.w##B;                                                       \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) hi_##A##_##B = {                   \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            rv = v.hi;                                                                            \
        }                                                                                         \
    };
#define LHC_TNA_PAIR_FIRST(A, B) hdr.payload.w##A = first_##A##_##B.execute(meta.cell);
#define LHC_TNA_PAIR_ADD(A, B) hdr.payload.w##A = add_##A##_##B.execute(meta.cell);
#define LHC_TNA_PAIR_OR(A, B) hdr.payload.w##A = or_##A##_##B.execute(meta.cell);
#define LHC_TNA_PAIR_HI(A, B) hdr.payload.w##B = hi_##A##_##B.execute(meta.cell);
// A duplicate of a finished copy reads the low halves by OR-ing zeros (no fifth RegisterAction needed).
#define LHC_TNA_PAIR_ZERO(A, B) hdr.payload.w##A = 0; hdr.payload.w##B = 0;

// Single-register value lanes (second pass).
#define LHC_TNA_LANE_DECL(L)                                                                      \
    Register<bit<32>, cell_index_t>(LHC_SLOT_CELLS) values_##L;                                        \
    RegisterAction<bit<32>, cell_index_t, bit<32>>(values_##L) first_##L = {                           \
        void apply(inout bit<32> v, out bit<32> rv) {                                             \
            v = hdr.payload.w##L;                                                                 \
            rv = v;                                                                               \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<bit<32>, cell_index_t, bit<32>>(values_##L) add_##L = {                             \
        void apply(inout bit<32> v, out bit<32> rv) {                                             \
            v = v + hdr.payload.w##L;                                                             \
            rv = v;                                                                               \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<bit<32>, cell_index_t, bit<32>>(values_##L) or_##L = {                              \
        void apply(inout bit<32> v, out bit<32> rv) {                                             \
            v = v | hdr.payload.w##L;                                                             \
            rv = v;                                                                               \
        }                                                                                         \
    };
#define LHC_TNA_LANE_FIRST(L) hdr.payload.w##L = first_##L.execute(meta.cell);
#define LHC_TNA_LANE_ADD(L) hdr.payload.w##L = add_##L.execute(meta.cell);
#define LHC_TNA_LANE_OR(L) hdr.payload.w##L = or_##L.execute(meta.cell);
#define LHC_TNA_LANE_ZERO(L) hdr.payload.w##L = 0;

control LhcIngress(inout lhc_ig_headers_t hdr,
                   inout lhc_ig_metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    Counter<bit<32>, bit<32>>(LHC_STATS_CELLS, CounterType_t.PACKETS_AND_BYTES) lhc_stats;
    // job_index * NUM_STATS + stat is the concatenation job_index ++ stat[3:0] (NUM_STATS == 16): an
    // identity hash forms it, because a counter's address must come from the hash unit or one PHV field.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) stats_index;

    // --- slot state ---------------------------------------------------------------------------------
    // {lo: bitmap, hi: epoch} of copy 0 / copy 1, indexed by slot_base + slot.
    Register<pair_t, bit<16>>(LHC_MAX_SLOTS) bitmap_c0;
    Register<pair_t, bit<16>>(LHC_MAX_SLOTS) bitmap_c1;
    // {lo: remaining, hi: epoch}, indexed by cell.
    Register<pair_t, cell_index_t>(LHC_SLOT_CELLS) count;

#define LHC_TNA_BITMAP_ACTIONS(REG)                                                               \
    /* Join this copy: lazy reset on a new epoch, then set the worker's bit; return the old bits. */ \
    RegisterAction<pair_t, bit<16>, bit<32>>(REG) REG##_join = {                                  \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi != meta.epoch) {                                                             \
                rv = 0;                                                                           \
                v.lo = meta.worker_bit;                                                           \
                v.hi = meta.epoch;                                                                \
            } else {                                                                              \
                rv = v.lo;                                                                        \
                v.lo = v.lo | meta.worker_bit;                                                    \
            }                                                                                     \
        }                                                                                         \
    };                                                                                            \
    /* Leave the other copy: the worker holds its result. */                                      \
    RegisterAction<pair_t, bit<16>, bit<32>>(REG) REG##_leave = {                                 \
        void apply(inout pair_t v) {                                                              \
            v.lo = v.lo & ~meta.worker_bit;                                                       \
        }                                                                                         \
    };
    LHC_TNA_BITMAP_ACTIONS(bitmap_c0)
    LHC_TNA_BITMAP_ACTIONS(bitmap_c1)

    // A new contribution counts down; the first of a round (or of a new epoch) starts at fan_in - 1.
    RegisterAction<pair_t, cell_index_t, bit<32>>(count) count_new = {
        void apply(inout pair_t v, out bit<32> rv) {
            if (v.hi != meta.epoch || v.lo == 0) {
                v.lo = meta.fan_in_m1;
                v.hi = meta.epoch;
            } else {
                v.lo = v.lo - 1;
            }
            rv = v.lo;
        }
    };
    // A duplicate only looks (0: the copy is finished).
    RegisterAction<pair_t, cell_index_t, bit<32>>(count) count_peek = {
        void apply(inout pair_t v, out bit<32> rv) {
            rv = v.lo;
        }
    };

    LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_DECL)
    LHC_FOR_EACH_TNA_PASS2_LANE(LHC_TNA_LANE_DECL)

    // --- tables (the same names, keys and actions as v1model; docs/switch.md) -------------------------
    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    action set_port(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    action route(PortId_t port, bit<48> src_mac, bit<48> dst_mac) {
        ig_tm_md.ucast_egress_port = port;
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

    action set_job(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<8> fan_in,
                   bit<16> mcast_grp, bit<16> epoch) {
        meta.job_index = job_index;
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        // Here, not in the apply block: a register address must be a plain PHV field, and bf-p4c folds a
        // straight-line `slot_base + slot` into the address expression.
        meta.slot = slot_base + hdr.lhc.slot;
        // A gateway compares a field with a constant, not two fields. With slot < MAX_SLOTS (checked first)
        // and slot_count <= MAX_SLOTS, slot >= slot_count makes this 0 or >= 2^16 - MAX_SLOTS + 1.
        meta.slot_room = slot_count - hdr.lhc.slot;
        meta.fan_in = fan_in;
        meta.mcast_grp = mcast_grp;
        meta.epoch = (bit<32>)epoch;
    }

    action unknown_job() {
        meta.job_index = 0;
    }

    table jobs {
        key = { hdr.lhc.job_id: exact; }
        actions = { set_job; @defaultonly unknown_job; }
        const default_action = unknown_job();
        size = LHC_MAX_JOBS;
    }

    action admit_worker(bit<32> worker_bit) {
        meta.worker_bit = worker_bit;
    }

    action reject_worker() {
        meta.worker_bit = 0;
    }

    table workers {
        key = {
            hdr.lhc.job_id: exact;
            hdr.lhc.worker_id: exact;
            hdr.ipv4.src_addr: exact;
        }
        actions = { admit_worker; @defaultonly reject_worker; }
        const default_action = reject_worker();
        size = 2048;
    }

    // --- helpers ------------------------------------------------------------------------------------
    action to_recirculation() {
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++ LHC_RECIRC_PORT_LOCAL;
        ig_tm_md.bypass_egress = 1;
        hdr.bridge.setInvalid();  // egress is bypassed: nothing to bridge
    }

    action swap_addresses() {
        bit<48> mac = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = mac;
        bit<32> addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = addr;
        bit<16> port = hdr.udp.src_port;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.dst_port = port;
        hdr.udp.checksum = 0;
    }

    // An action, so that bf-p4c keeps `seen` a field for the gateway instead of folding in the AND.
    action compute_seen() {
        meta.seen = meta.old_bitmap & meta.worker_bit;
    }

    action result_addresses() {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
    }

    // First pass of an lhc packet: checks, slot state, the register-pair lanes; counts the outcome.
    // Second pass (hdr.recirc valid): the single-register lanes, the high halves of a result, and out.
    apply {
        hdr.bridge.setValid();
        hdr.bridge.kind = LHC_BRIDGE_PLAIN;
        bool is_lhc = hdr.udp.isValid() && (hdr.udp.dst_port & LHC_UDP_PORT_MASK) == LHC_UDP_PORT_BASE;

        if (hdr.recirc.isValid()) {
            // ---- second pass ----
            meta.cell = hdr.lhc.ver ++ hdr.recirc.slot[(LHC_SLOT_INDEX_BITS - 1):0];
            bit<8> flags = hdr.recirc.flags;
            if ((flags & LHC_PASS2_UPDATE) != 0) {
                if ((flags & LHC_PASS2_FIRST) != 0) {
                    LHC_FOR_EACH_TNA_PASS2_LANE(LHC_TNA_LANE_FIRST)
                } else if (hdr.lhc.op == LHC_OP_ADD) {
                    LHC_FOR_EACH_TNA_PASS2_LANE(LHC_TNA_LANE_ADD)
                } else {
                    LHC_FOR_EACH_TNA_PASS2_LANE(LHC_TNA_LANE_OR)
                }
            } else if ((flags & LHC_PASS2_RETX) != 0) {
                LHC_FOR_EACH_TNA_PASS2_LANE(LHC_TNA_LANE_ZERO)
                LHC_FOR_EACH_TNA_PASS2_LANE(LHC_TNA_LANE_OR)
            }
            if ((flags & (LHC_PASS2_RESULT | LHC_PASS2_RETX)) != 0) {
                LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_HI)
            }
            if ((flags & LHC_PASS2_RESULT) != 0) {
                ig_tm_md.mcast_grp_a = hdr.recirc.mcast_grp;
                hdr.bridge.kind = LHC_BRIDGE_RESULT;
            } else if ((flags & LHC_PASS2_RETX) != 0) {
                ig_tm_md.ucast_egress_port = hdr.recirc.sender_port;
            } else {
                drop();  // absorbed: the second-pass lanes are updated, nothing to send
            }
            hdr.recirc.setInvalid();
        } else if (is_lhc) {
            // ---- first pass ----
            meta.job_index = 0;
            meta.stat = LHC_STAT_DROP_MALFORMED;
            // One small condition each: a Tofino gateway reads at most 4 bytes + 12 bits of PHV.
            meta.malformed = 0;
            if (ig_prsr_md.parser_err != PARSER_ERROR_OK) { meta.malformed = 1; }
            if (!hdr.payload.isValid()) { meta.malformed = 1; }
            if (hdr.udp.length != LHC_UDP_LENGTH) { meta.malformed = 1; }
            if (hdr.ipv4.total_len != LHC_IPV4_TOTAL_LENGTH) { meta.malformed = 1; }
            if (hdr.lhc.flags != 0) { meta.malformed = 1; }
            if (meta.malformed == 1) {
                meta.stat = LHC_STAT_DROP_MALFORMED;
            } else if (hdr.lhc.msg_type != LHC_TYPE_DATA) {
                meta.stat = LHC_STAT_DROP_BAD_TYPE;
            } else if (hdr.lhc.op != LHC_OP_ADD && hdr.lhc.op != LHC_OP_OR) {
                meta.stat = LHC_STAT_DROP_BAD_OP;
            } else if (!jobs.apply().hit) {
                meta.stat = LHC_STAT_DROP_UNKNOWN_JOB;
            } else if ((bit<32>)hdr.lhc.epoch != meta.epoch) {
                meta.stat = LHC_STAT_DROP_STALE_EPOCH;
            } else if (hdr.lhc.slot[15:LHC_SLOT_INDEX_BITS] != 0 || meta.slot_room == 0
                    || meta.slot_room[15:(LHC_SLOT_INDEX_BITS + 1)] != 0
                    || meta.slot[15:LHC_SLOT_INDEX_BITS] != 0) {
                meta.stat = LHC_STAT_DROP_SLOT_RANGE;
            } else if (!workers.apply().hit) {
                meta.stat = LHC_STAT_DROP_BAD_WORKER;
            } else {
                meta.cell = hdr.lhc.ver ++ meta.slot[(LHC_SLOT_INDEX_BITS - 1):0];
                meta.fan_in_m1 = (bit<32>)(meta.fan_in - 1);
                // Join this copy, leave the other (a no-op for a duplicate: its bit is clear there).
                if (hdr.lhc.ver == 0) {
                    meta.old_bitmap = bitmap_c0_join.execute(meta.slot);
                    bitmap_c1_leave.execute(meta.slot);
                } else {
                    meta.old_bitmap = bitmap_c1_join.execute(meta.slot);
                    bitmap_c0_leave.execute(meta.slot);
                }
                compute_seen();
                hdr.recirc.setValid();
                hdr.recirc.flags = 0;
                hdr.recirc.job_index = meta.job_index;
                hdr.recirc.mcast_grp = meta.mcast_grp;
                hdr.recirc.slot = meta.slot;
                hdr.recirc.sender_port = ig_intr_md.ingress_port;
                if (meta.seen != 0) {
                    meta.remaining = count_peek.execute(meta.cell);
                    if (meta.remaining == 0) {
                        // Duplicate of a finished copy: read the pairs' low halves (OR with zeros) now,
                        // the rest in the second pass, then unicast RESULT_RETX to the sender.
                        LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_ZERO)
                        LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_OR)
                        hdr.lhc.msg_type = LHC_TYPE_RESULT_RETX;
                        hdr.lhc.bitmap = meta.old_bitmap;
                        swap_addresses();
                        hdr.recirc.flags = LHC_PASS2_RETX;
                        meta.stat = LHC_STAT_RETX;
                    } else {
                        meta.stat = LHC_STAT_DROP_DUPLICATE;
                    }
                } else {
                    meta.remaining = count_new.execute(meta.cell);
                    if (meta.remaining == meta.fan_in_m1) {
                        meta.first = 1;
                    }
                    if (meta.remaining == 0) {
                        meta.finished = 1;
                    }
                    if (meta.first == 1) {
                        LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_FIRST)
                        hdr.recirc.flags = LHC_PASS2_UPDATE | LHC_PASS2_FIRST;
                    } else if (hdr.lhc.op == LHC_OP_ADD) {
                        LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_ADD)
                        hdr.recirc.flags = LHC_PASS2_UPDATE;
                    } else {
                        LHC_FOR_EACH_TNA_PASS1_PAIR(LHC_TNA_PAIR_OR)
                        hdr.recirc.flags = LHC_PASS2_UPDATE;
                    }
                    if (meta.finished == 1) {
                        hdr.recirc.flags = hdr.recirc.flags | LHC_PASS2_RESULT;
                        hdr.lhc.msg_type = LHC_TYPE_RESULT;
                        hdr.lhc.bitmap = meta.old_bitmap | meta.worker_bit;
                        result_addresses();
                        meta.stat = LHC_STAT_RESULT;
                    } else {
                        meta.stat = LHC_STAT_ABSORBED;
                    }
                }
            }
            lhc_stats.count(stats_index.get({meta.job_index, meta.stat[3:0]}));
            if (meta.stat == LHC_STAT_RESULT || meta.stat == LHC_STAT_RETX || meta.stat == LHC_STAT_ABSORBED) {
                to_recirculation();  // the second pass finishes it (absorbed: updates its lanes, then drops)
            } else {
                hdr.recirc.setInvalid();
                drop();
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
        packet.emit(hdr.bridge);
        packet.emit(hdr.recirc);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.lhc);
        packet.emit(hdr.payload);
    }
}

// ------------------------------------------------------------------------------------------------------
// Egress: only RESULT replicas are parsed (the bridge says which); the payload passes through untouched.
parser LhcEgressParser(packet_in packet,
                       out lhc_eg_headers_t hdr,
                       out lhc_eg_metadata_t meta,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        packet.extract(eg_intr_md);
        packet.extract(hdr.bridge);
        transition select(hdr.bridge.kind) {
            LHC_BRIDGE_RESULT: parse_result;
            default: accept;
        }
    }

    state parse_result {
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
        hdr.bridge.setInvalid();
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
