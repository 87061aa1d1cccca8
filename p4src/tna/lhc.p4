// lhc-ina on Tofino-1 (TNA): the behaviour of p4src/v1model/lhc.p4 under Tofino's limits.
//
// docs/tofino.md explains the layout and gives bf-p4c's measured placement; in short:
//   - Every register is touched by at most one RegisterAction per pass, and has at most four.
//   - Slot state: the round of each copy, {seq, epoch}, held twice (`round_stale_cV` says whether the
//     packet is of an older round, `round_start_cV` whether it starts one: a Tofino-1 stateful ALU has one
//     output), one register per copy indexed by slot_base + slot; then `bitmaps` (per cell). A round is
//     finished when its bitmap is the job's full mask (TNA admits only fan_in == the worker count), which
//     the const table `full_round` tells; there is no count-down register.
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
    bit<8>  fan_in;
    bit<16> mcast_grp;
    bit<32> epoch;         // the job's epoch, widened to the register half
    bit<32> worker_bit;
    bit<16> slot;          // slot_base + slot: the bitmap registers' index
    bit<16> slot_room;     // slot_count - slot mod 2^16: in [1, MAX_SLOTS] exactly when slot < slot_count
    cell_index_t cell;     // ver ++ slot
    bit<32> stale;         // nonzero: the packet is of a round older than its copy's (round_stale_cV)
    bit<32> starts;        // nonzero: it starts the copy's round: a fresh copy or a newer round
    bit<32> old_bitmap;    // this copy's bitmap before this packet (0 for the first of a round)
    bit<32> seen;          // old_bitmap & worker_bit: a repeat
    bit<1>  finished;      // hdr.lhc.bitmap (old | this worker) is the job's full mask (full_round)
    bit<8>  vmode;
    bit<8>  stat;
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
        meta.fan_in = 0;
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
        meta.vmode = LHC_VMODE_NONE;
        meta.stat = 0;
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
    };
    LHC_TNA_ROUND_REGISTERS(c0)
    LHC_TNA_ROUND_REGISTERS(c1)

    // The contributors of each copy's round, indexed by cell. The first of a round sets its bit alone;
    // a later packet of the round ORs its bit in and gets the bitmap as found (its bit set: a repeat).
    Register<bit<32>, cell_index_t>(LHC_SLOT_CELLS) bitmaps;
    RegisterAction<bit<32>, cell_index_t, bit<32>>(bitmaps) bitmap_start = {
        void apply(inout bit<32> v) {
            v = meta.worker_bit;
        }
    };
    RegisterAction<bit<32>, cell_index_t, bit<32>>(bitmaps) bitmap_join = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            v = v | meta.worker_bit;
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

    action set_job(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<8> fan_in,
                   bit<16> mcast_grp, bit<16> epoch) {
        meta.job_hit = 1;
        meta.job_index = job_index;
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

    // The value registers: one table per pair (const entries; the controller never touches them).
    LHC_FOR_EACH_LANE_PAIR(LHC_TNA_PAIR)

    // --- first pass: checks and slot state ----------------------------------------------------------
    // Dropped before `jobs` applies in v1model: counted in row 0.
    action reject(bit<8> stat) {
        meta.stat = stat;
        drop();
    }

    // Dropped after `jobs` hit: counted in the job's row.
    action reject_in_job(bit<8> stat) {
        meta.row = meta.job_index;
        meta.stat = stat;
        drop();
    }

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

    // Is the round's bitmap, this packet's bit included, the job's full mask? The job's ranks are
    // 0 .. fan_in - 1 (TNA admission: fan_in == the worker count), so the mask is 2^fan_in - 1.
    action round_is_full() {
        meta.finished = 1;
    }

#define LHC_TNA_FULL_MASK(N, MASK) (N, MASK): round_is_full();
    table full_round {
        key = {
            meta.fan_in: exact;
            hdr.lhc.bitmap: exact;
        }
        actions = { round_is_full; @defaultonly NoAction; }
        const default_action = NoAction();
        size = LHC_MAX_WORKERS;
        const entries = {
            LHC_FOR_EACH_FULL_MASK(LHC_TNA_FULL_MASK)
        }
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

    // First pass of an lhc packet: checks, slot state and every value lane; the outcome is counted here.
    // Only a result (one more pass: the high halves) and a retransmission (two more: low, then high
    // halves) recirculate. Egress sees only the multicast copies of a result.
    apply {
        if (meta.later == 1) {
            later_pass();
            if (hdr.recirc.flags == LHC_RECIRC_RETX_LO) {
                read_low_halves();
            }
        } else if (hdr.udp.isValid() && (hdr.udp.dst_port & LHC_UDP_PORT_MASK) == LHC_UDP_PORT_BASE) {
            // Both lookups run on every lhc packet (they only read), so that neither waits for the other
            // or for the checks; the checks below decide, in v1model's order, what their results mean.
            jobs.apply();
            workers.apply();
            // One small condition each: a Tofino gateway reads at most 4 bytes + 12 bits of PHV.
            if (ig_prsr_md.parser_err != PARSER_ERROR_OK || !hdr.payload.isValid() || hdr.lhc.flags != 0) {
                reject((bit<8>)LHC_STAT_DROP_MALFORMED);
            } else if (hdr.udp.length != LHC_UDP_LENGTH || hdr.ipv4.total_len != LHC_IPV4_TOTAL_LENGTH) {
                reject((bit<8>)LHC_STAT_DROP_MALFORMED);
            } else if (hdr.lhc.msg_type != LHC_TYPE_DATA) {
                reject((bit<8>)LHC_STAT_DROP_BAD_TYPE);
            } else if (hdr.lhc.op != LHC_OP_ADD && hdr.lhc.op != LHC_OP_OR) {
                reject((bit<8>)LHC_STAT_DROP_BAD_OP);
            } else if (meta.job_hit == 0) {
                reject((bit<8>)LHC_STAT_DROP_UNKNOWN_JOB);
            } else if ((bit<32>)hdr.lhc.epoch != meta.epoch) {
                reject_in_job((bit<8>)LHC_STAT_DROP_STALE_EPOCH);
            } else if (hdr.lhc.slot[15:LHC_SLOT_INDEX_BITS] != 0 || meta.slot_room == 0
                    || meta.slot_room[15:(LHC_SLOT_INDEX_BITS + 1)] != 0
                    || meta.slot[15:LHC_SLOT_INDEX_BITS] != 0) {
                reject_in_job((bit<8>)LHC_STAT_DROP_SLOT_RANGE);
            } else if (meta.worker_hit == 0) {
                reject_in_job((bit<8>)LHC_STAT_DROP_BAD_WORKER);
            } else {
                accept();
                if (hdr.lhc.ver == 0) {
                    meta.stale = round_stale_c0_check.execute(meta.slot);
                    meta.starts = round_start_c0_check.execute(meta.slot);
                } else {
                    meta.stale = round_stale_c1_check.execute(meta.slot);
                    meta.starts = round_start_c1_check.execute(meta.slot);
                }
                if (meta.stale != 0) {
                    reject_in_job((bit<8>)LHC_STAT_DROP_STALE_ROUND);
                } else {
                    if (meta.starts != 0) {
                        start_round();
                    } else {
                        join_round();
                    }
                    note_bitmap();
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
        if (meta.vmode == LHC_VMODE_START || meta.vmode == LHC_VMODE_SAME) {
            full_round.apply();
        }

        if (meta.vmode == LHC_VMODE_START) {
            if (meta.finished == 1) {
                result();
            } else {
                absorbed();
            }
        } else if (meta.vmode == LHC_VMODE_SAME) {
            if (meta.seen == 0) {
                if (meta.finished == 1) {
                    result();
                } else {
                    absorbed();
                }
            } else if (meta.finished == 1) {
                retransmit();
            } else {
                duplicate();
            }
        } else if (meta.vmode == LHC_VMODE_OR) {
            read_high_halves_next();
        } else if (meta.vmode == LHC_VMODE_HI) {
            if (hdr.recirc.flags == LHC_RECIRC_RESULT) {
                send_result();
            } else {
                send_retransmission();
            }
        }
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
