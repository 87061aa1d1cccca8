// lhc-ina on TNA: the ingress control, where an lhc packet is checked, its slot state and value lanes
// updated, and its outcome decided (included by lhc.p4). Two parts of its body are files of their own:
// ingress_slot_state.p4 and ingress_results.p4.

// A drop's outcome and the drop itself each alone in its container: then the many drops of the checks set
// them with an instruction's constant, where a container shared with other fields needs a bitmasked set
// whose value and mask take action-data-bus bytes, which stage 1 needs for the round registers' outputs.
@pa_solitary("ingress", "meta.stat")
@pa_solitary("ingress", "ig_intr_md_for_dprsr.drop_ctl")
// A leaf's parent's bitmap (stages 3 to 5) in the container of the stale check's output (stages 1 and 2):
// a container of its own moved the PHV allocation so that bf-p4c 9.13.4 stopped with an internal error in
// `uplinks`' action data format (docs/tofino.md, "Two levels").
@pa_alias("ingress", "meta.parent_bitmap", "meta.stale")
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

#include "ingress_slot_state.p4"

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

    // The parent's result the copy holds (a leaf's final copy), read by a later packet of the round; the
    // first of a round holds none.
    action forget_parent_result() {
        parent_bitmap_clear.execute(meta.cell);
    }

    action read_parent_result() {
        meta.parent_bitmap = parent_bitmap_read.execute(meta.cell);
    }

    // What the round's bitmap (this packet's bit included) means for the job: its result mask (the round
    // is finished), or on a leaf its workers' mask (every worker is in: the copy awaits its parent, or is
    // final once it stored its result, which `read_parent_result` tells). The controller writes one entry per
    // job (lhc_ina.jobs.job_entries, target "tna"): the masks are per job.
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
        size = LHC_MAX_JOBS;
    }

    // --- outcomes -------------------------------------------------------------------------------------
    action to_recirculation() {
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:LHC_TNA_PIPE_SHIFT] ++ LHC_RECIRC_PORT_LOCAL;
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

    // A repeat of a leaf's final copy: RESULT_RETX with the bitmap of the parent's result it stored.
    action retransmit_parent_result() {
        hdr.lhc.bitmap = meta.parent_bitmap;
        retransmit();
    }

#include "ingress_results.p4"

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
                        if (meta.old_bitmap == LHC_AWAITING_PARENT) {
                            stored_result();
                        } else if (meta.old_bitmap == LHC_COPY_FINAL) {
                            result_already_stored();
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
                            forget_parent_result();
                        } else {
                            join_round();
                            read_parent_result();
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
