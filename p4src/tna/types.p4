// lhc-ina on TNA: the constants, the recirculation header and the header and metadata structs of the
// ingress and egress pipes (included by lhc.p4 after ../shared/headers.p4).

// The recirculation port is LHC_RECIRC_PORT_LOCAL (constants.p4) within the ingress port's own pipe.

// Prepended to a packet between its passes (recirculation), before Ethernet. `flags` says what is left.
const bit<8> LHC_RECIRC_RESULT = 1;   // a finished copy: read the high halves, multicast
const bit<8> LHC_RECIRC_RETX_LO = 2;  // a duplicate of a finished copy: read the low halves (OR zeros)
const bit<8> LHC_RECIRC_RETX_HI = 3;  // ... then the high halves, unicast to the sender
const bit<8> LHC_RECIRC_UP = 4;       // a leaf's copy got its last worker: read the high halves, send up
const bit<8> LHC_RECIRC_UP_RETX_LO = 5;  // a repeat while the copy awaits its parent: the low halves
const bit<8> LHC_RECIRC_UP_RETX_HI = 6;  // ... then the high halves, the partial up again
// bitmaps.hi: where a copy stands. Only a leaf's copies leave LHC_COPY_AGGREGATING: the partial went up
// (awaiting), then the parent's result was stored (final). The state, not the bitmap, tells them apart:
// a leaf's workers' mask may equal its parent's mask of leaves (as many workers as the job has leaves).
const bit<32> LHC_COPY_AGGREGATING = 0;
const bit<32> LHC_AWAITING_PARENT = 1;
const bit<32> LHC_COPY_FINAL = 2;
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
    bit<32> old_bitmap;    // this copy's bitmap before this packet (0 for the first of a round); for a
                           // parent's result, the copy's state as found (bitmaps.hi, LHC_COPY_*)
    bit<32> seen;          // old_bitmap & worker_bit: a repeat
    bit<32> parent_bitmap; // a later packet of a round: the bitmap of the parent's result its copy holds
                           // (parent_bitmaps; 0: none), which a leaf's final copy repeats. It shares
                           // `stale`'s container (@pa_alias in ingress.p4), dead by then
    bit<1>  finished;      // hdr.lhc.bitmap (old | this worker) is the job's result mask (full_round);
                           // a parent's result: the copy holds it already (a duplicate)
    bit<1>  awaits;        // ... is a leaf's workers' mask: every worker is in; the copy awaits its
                           // parent, or holds its result when parent_bitmap != 0 (full_round)
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
