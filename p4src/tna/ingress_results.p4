// Part of control LhcIngress (ingress.p4), included inside its body: a parent's result on a leaf, and the
// later passes (a recirculated result or partial and its retransmissions). hdr, meta and ig_* are the
// control's parameters.
    // --- a parent's result, on a leaf ------------------------------------------------------------------
    // Of the copy's round (same epoch and seq): the copy stores it if it awaits it (bitmap_store).
    action store_result() {
        meta.from_parent = 1;
        meta.old_bitmap = bitmap_store.execute(meta.cell);
    }

    // Stored: its words become the values (`first`), its bitmap the copy's answer to repeats, and it is the
    // leaf's result as it stands.
    action stored_result() {
        meta.vmode = LHC_VMODE_START;
        parent_bitmap_store.execute(meta.cell);
    }

    // Not stored, because the copy holds its parent's result already: a duplicate. Otherwise (the copy does
    // not await this result) it is stale.
    action result_already_stored() {
        meta.finished = 1;
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
    // full_round's flags matter only for a contribution (START or SAME); a parent's result sets `finished`
    // itself. meta.parent_bitmap is nonzero only for a repeat of a leaf's final copy.
    table outcome {
        key = {
            meta.from_parent: ternary;
            meta.vmode: ternary;
            meta.seen: ternary;
            meta.finished: ternary;
            meta.awaits: ternary;
            hdr.recirc.flags: ternary;
            meta.has_uplink: ternary;
            meta.parent_bitmap: ternary;
        }
        actions = {
            result_from_parent; duplicate; reject_stale_result; result; up; absorbed; retransmit;
            up_retransmit; retransmit_parent_result; read_high_halves_next; read_high_halves_next_up;
            send_result; send_retransmission; send_up; drop; @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = 32;
        const entries = {
            // A parent's result of the copy's round (a leaf): stored, or the copy is final, or not awaiting.
            (1, LHC_VMODE_START, _, _, _, _, _, _): result_from_parent();
            (1, _, _, 1, _, _, _, _): duplicate();
            (1, _, _, _, _, _, _, _): reject_stale_result();
            // A worker's (or, at a spine, a leaf's) packet: the first of a round, or one of its round. On a
            // leaf every worker in means awaiting the parent, or final once its result is stored.
            (0, LHC_VMODE_START, _, 1, _, _, _, _): result();
            (0, LHC_VMODE_START, _, _, 1, _, _, _): up();
            (0, LHC_VMODE_START, _, _, _, _, _, _): absorbed();
            (0, LHC_VMODE_SAME, 0, 1, _, _, _, _): result();
            (0, LHC_VMODE_SAME, 0, _, 1, _, _, _): up();
            (0, LHC_VMODE_SAME, 0, _, _, _, _, _): absorbed();
            (0, LHC_VMODE_SAME, _, 1, _, _, _, _): retransmit();
            (0, LHC_VMODE_SAME, _, _, 1, _, _, 0): up_retransmit();
            (0, LHC_VMODE_SAME, _, _, 1, _, _, _): retransmit_parent_result();
            (0, LHC_VMODE_SAME, _, _, _, _, _, _): duplicate();
            // Later passes: the low halves were read (retransmissions), or the high halves (the last pass).
            (_, LHC_VMODE_OR, _, _, _, LHC_RECIRC_RETX_LO, _, _): read_high_halves_next();
            (_, LHC_VMODE_OR, _, _, _, _, _, _): read_high_halves_next_up();
            (_, LHC_VMODE_HI, _, _, _, LHC_RECIRC_RESULT, _, _): send_result();
            (_, LHC_VMODE_HI, _, _, _, LHC_RECIRC_RETX_HI, _, _): send_retransmission();
            (_, LHC_VMODE_HI, _, _, _, _, 1, _): send_up();
            (_, LHC_VMODE_HI, _, _, _, _, _, _): drop();  // a partial whose uplink went between the passes
        }
    }
