// lhc-ina on v1model: the ingress control, where all stateful work happens inside one @atomic block: an lhc
// packet is admitted, aggregated into its slot and its outcome decided; everything else is forwarded
// (included by lhc.p4).
// Lane macros, expanded for every lane by LHC_FOR_EACH_LANE. `vbase` is cell * LANES.
// Read the stored value of lane L into the packet (a retransmitted result).
#define LHC_READ_LANE(L) slot_values.read(hdr.payload.w##L, vbase + L);
// First contribution of a round: the packet's word becomes the stored value.
#define LHC_FIRST_LANE(L) slot_values.write(vbase + L, hdr.payload.w##L);
// Later contributions: stored (+) word, modulo 2^32 (bit<32> addition wraps, never saturates).
#define LHC_ADD_LANE(L) {                                   \
        bit<32> v;                                          \
        slot_values.read(v, vbase + L);                     \
        hdr.payload.w##L = v + hdr.payload.w##L;            \
        slot_values.write(vbase + L, hdr.payload.w##L);     \
    }
// Later contributions: stored (|) word.
#define LHC_OR_LANE(L) {                                    \
        bit<32> v;                                          \
        slot_values.read(v, vbase + L);                     \
        hdr.payload.w##L = v | hdr.payload.w##L;            \
        slot_values.write(vbase + L, hdr.payload.w##L);     \
    }

control LhcIngress(inout lhc_headers_t hdr,
                   inout lhc_metadata_t meta,
                   inout standard_metadata_t standard_metadata) {

    // One cell per (job index, outcome): cell job_index * NUM_STATS + Stat.
    counter(LHC_STATS_CELLS, CounterType.packets_and_bytes) lhc_stats;

    // Per slot copy, cell = (slot_base + slot) * SLOT_COPIES + ver.
    register<bit<16>>(LHC_SLOT_CELLS) slot_epoch;
    register<bit<32>>(LHC_SLOT_CELLS) slot_round;  // seq of the round the copy holds (docs/switch.md)
    register<bit<32>>(LHC_SLOT_CELLS) slot_bitmap;
    register<bit<8>>(LHC_SLOT_CELLS) slot_remaining;
    // Per slot copy and lane: cell * LANES + lane.
    register<bit<32>>(LHC_VALUE_CELLS) slot_values;

    action drop() {
        mark_to_drop(standard_metadata);
    }

    // --- L2/L3 forwarding of everything that is not lhc --------------------------------------------
    action set_port(bit<9> port) {
        standard_metadata.egress_spec = port;
    }

    action route(bit<9> port, bit<48> src_mac, bit<48> dst_mac) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    table ipv4_routes {
        key = {
            hdr.ipv4.dst_addr: lpm;
        }
        actions = {
            route;
            @defaultonly drop;
        }
        const default_action = drop();
        size = 1024;
    }

    table l2_forward {
        key = {
            hdr.ethernet.dst_addr: exact;
        }
        actions = {
            set_port;
            @defaultonly drop;
        }
        const default_action = drop();
        size = 1024;
    }

    // --- lhc admission -----------------------------------------------------------------------------
    action set_job(bit<8> job_index, bit<16> slot_base, bit<16> slot_count, bit<8> fan_in,
                   bit<16> mcast_grp, bit<16> epoch) {
        meta.job_index = job_index;
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        meta.fan_in = fan_in;
        meta.mcast_grp = mcast_grp;
        meta.epoch = epoch;
    }

    action unknown_job() {
        meta.job_index = 0;
    }

    table jobs {
        key = {
            hdr.lhc.job_id: exact;
        }
        actions = {
            set_job;
            @defaultonly unknown_job;
        }
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
            hdr.udp.src_port: exact;
            standard_metadata.ingress_port: exact;
        }
        actions = {
            admit_worker;
            @defaultonly reject_worker;
        }
        const default_action = reject_worker();
        size = 2048;
    }

    // --- two levels: a leaf's way up to its parent (docs/switch.md, "Two levels") -----------------
    action set_uplink(bit<9> port, bit<8> worker_id, bit<48> src_mac, bit<48> dst_mac, bit<32> src_addr,
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
    }

    action no_uplink() {
        meta.has_uplink = 0;
    }

    table uplinks {
        key = {
            hdr.lhc.job_id: exact;
        }
        actions = {
            set_uplink;
            @defaultonly no_uplink;
        }
        const default_action = no_uplink();
        size = LHC_MAX_JOBS;
    }

    // The packet (its payload already the copy's values) becomes the leaf's partial: one DATA packet up.
    action send_up(bit<32> bitmap) {
        hdr.lhc.worker_id = meta.up_worker_id;
        hdr.lhc.bitmap = bitmap;
        hdr.ethernet.src_addr = meta.up_src_mac;
        hdr.ethernet.dst_addr = meta.up_dst_mac;
        hdr.ipv4.src_addr = meta.up_src_addr;
        hdr.ipv4.dst_addr = meta.up_dst_addr;
        hdr.udp.src_port = meta.up_src_port;
        hdr.udp.dst_port = meta.up_dst_port;
        hdr.udp.checksum = 0;
        standard_metadata.egress_spec = meta.up_port;
    }

    // The packet becomes the RESULT multicast to the job, sourced from the address it was sent to.
    action multicast_result(bit<32> bitmap) {
        hdr.lhc.msg_type = LHC_TYPE_RESULT;
        hdr.lhc.bitmap = bitmap;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        standard_metadata.mcast_grp = meta.mcast_grp;
    }

    apply {
        bool is_lhc = hdr.udp.isValid() && (hdr.udp.dst_port & LHC_UDP_PORT_MASK) == LHC_UDP_PORT_BASE;
        if (is_lhc) {
            bit<32> stat = LHC_STAT_DROP_MALFORMED;
            meta.job_index = 0;
            meta.has_uplink = 0;
            bool well_formed = standard_metadata.parser_error == error.NoError && hdr.payload.isValid()
                    && hdr.udp.length == LHC_UDP_LENGTH
                    && hdr.ipv4.total_len == LHC_IPV4_TOTAL_LENGTH
                    && hdr.lhc.flags == 0;
            if (well_formed) {
                uplinks.apply();
            }
            // A result is taken only by a leaf, only from its parent: address, UDP port and switch port.
            bool from_parent = meta.has_uplink == 1
                    && (hdr.lhc.msg_type == LHC_TYPE_RESULT || hdr.lhc.msg_type == LHC_TYPE_RESULT_RETX)
                    && hdr.ipv4.src_addr == meta.up_dst_addr && hdr.udp.src_port == meta.up_dst_port
                    && standard_metadata.ingress_port == meta.up_port;
            if (!well_formed) {
                stat = LHC_STAT_DROP_MALFORMED;
            } else if (hdr.lhc.msg_type != LHC_TYPE_DATA && !from_parent) {
                stat = LHC_STAT_DROP_BAD_TYPE;
            } else if (hdr.lhc.op != LHC_OP_ADD && hdr.lhc.op != LHC_OP_OR) {
                stat = LHC_STAT_DROP_BAD_OP;
            } else if (!jobs.apply().hit) {
                stat = LHC_STAT_DROP_UNKNOWN_JOB;
            } else if (hdr.lhc.epoch != meta.epoch) {
                stat = LHC_STAT_DROP_STALE_EPOCH;
            } else if (hdr.lhc.slot >= meta.slot_count
                    || (bit<32>)meta.slot_base + (bit<32>)hdr.lhc.slot >= LHC_MAX_SLOTS) {
                stat = LHC_STAT_DROP_SLOT_RANGE;
            } else if (!from_parent && !workers.apply().hit) {
                stat = LHC_STAT_DROP_BAD_WORKER;
            } else {
                @atomic {
                    bit<32> cell = ((bit<32>)meta.slot_base + (bit<32>)hdr.lhc.slot) * LHC_SLOT_COPIES
                                   + (bit<32>)hdr.lhc.ver;
                    bit<32> vbase = cell * LHC_LANES;
                    bit<16> cell_epoch = 0;
                    bit<32> round = 0;
                    bit<32> bitmap = 0;
                    bit<8> remaining = 0;
                    bool contributes = true;  // the packet joins the copy's round or starts one
                    bool starts = false;      // ... starts one: its words become the value
                    bool read_back = false;   // the packet leaves with the copy's values (RETX, UP_RETX)
                    bool stores = false;      // a leaf stores its parent's result: its words become the value
                    slot_epoch.read(cell_epoch, cell);
                    if (from_parent) {
                        // The parent's result (docs/switch.md, "Two levels"): stored only by a copy that
                        // awaits exactly this round; it never starts, joins or stamps a copy.
                        contributes = false;
                        slot_round.read(round, cell);
                        slot_remaining.read(remaining, cell);
                        if (cell_epoch != hdr.lhc.epoch || hdr.lhc.seq != round) {
                            stat = LHC_STAT_DROP_STALE_RESULT;
                        } else if (remaining == 0) {
                            stat = LHC_STAT_DROP_DUPLICATE;
                        } else if (remaining != 1) {
                            stat = LHC_STAT_DROP_STALE_RESULT;
                        } else {
                            stores = true;
                        }
                    } else if (cell_epoch != hdr.lhc.epoch) {
                        // Lazy reset of this copy; the other copy resets on its own epoch check. The
                        // first packet of an epoch to reach a copy can only be of its first round.
                        slot_epoch.write(cell, hdr.lhc.epoch);
                        starts = true;
                    } else {
                        slot_round.read(round, cell);
                        slot_bitmap.read(bitmap, cell);
                        slot_remaining.read(remaining, cell);
                        if (hdr.lhc.seq == round) {
                            if (remaining == 0) {
                                // A repeat of the finished round: send the result back to the sender.
                                contributes = false;
                                read_back = true;
                                hdr.lhc.msg_type = LHC_TYPE_RESULT_RETX;
                                hdr.lhc.bitmap = bitmap;
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
                                standard_metadata.egress_spec = standard_metadata.ingress_port;
                                stat = LHC_STAT_RETX;
                            } else if (remaining == 1 && meta.has_uplink == 1) {
                                // A repeat while a leaf's copy awaits its parent: the partial goes up again.
                                contributes = false;
                                read_back = true;
                                send_up(bitmap);
                                stat = LHC_STAT_UP_RETX;
                            } else if ((bitmap & meta.worker_bit) != 0) {
                                contributes = false;
                                stat = LHC_STAT_DROP_DUPLICATE;
                            }
                        } else if (remaining == 0
                                && hdr.lhc.seq == round + ((bit<32>)meta.slot_count << 1)) {
                            // The copy's next round (2 * slot_count packets on): it reuses the copy.
                            starts = true;
                        } else {
                            // Neither the copy's round nor its next one: a delayed packet.
                            contributes = false;
                            stat = LHC_STAT_DROP_STALE_ROUND;
                        }
                    }
                    if (read_back) {
                        LHC_FOR_EACH_LANE(LHC_READ_LANE)
                    }
                    if (starts || stores) {
                        LHC_FOR_EACH_LANE(LHC_FIRST_LANE)
                    }
                    if (stores) {
                        slot_bitmap.write(cell, hdr.lhc.bitmap);
                        slot_remaining.write(cell, 0);
                        multicast_result(hdr.lhc.bitmap);
                        stat = LHC_STAT_RESULT;
                    }
                    if (contributes) {
                        if (starts) {
                            slot_round.write(cell, hdr.lhc.seq);
                            bitmap = meta.worker_bit;
                            remaining = meta.fan_in - 1;
                        } else if (hdr.lhc.op == LHC_OP_ADD) {
                            LHC_FOR_EACH_LANE(LHC_ADD_LANE)
                            bitmap = bitmap | meta.worker_bit;
                            remaining = remaining - 1;
                        } else {
                            LHC_FOR_EACH_LANE(LHC_OR_LANE)
                            bitmap = bitmap | meta.worker_bit;
                            remaining = remaining - 1;
                        }
                        slot_bitmap.write(cell, bitmap);
                        slot_remaining.write(cell, remaining);
                        if (remaining == 0) {
                            // The last contribution: the packet becomes the result, multicast to the job.
                            multicast_result(bitmap);
                            stat = LHC_STAT_RESULT;
                        } else if (remaining == 1 && meta.has_uplink == 1) {
                            // A leaf's last worker: the partial (the payload holds it) goes up, once.
                            send_up(bitmap);
                            stat = LHC_STAT_UP;
                        } else {
                            stat = LHC_STAT_ABSORBED;
                        }
                    }
                }
            }
            lhc_stats.count((bit<32>)meta.job_index * LHC_NUM_STATS + stat);
            if (stat != LHC_STAT_RESULT && stat != LHC_STAT_RETX && stat != LHC_STAT_UP
                    && stat != LHC_STAT_UP_RETX) {
                drop();
            }
        } else if (standard_metadata.parser_error != error.NoError) {
            // Not recognisably lhc and cut short before its UDP header: nothing to forward.
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
