// lhc-ina on TNA: the parsers and deparsers of both pipes (included by lhc.p4; the lhc part of the
// ingress parse is ../shared/parser.p4's).
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
        meta.parent_bitmap = 0;
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
        transition select(ig_intr_md.ingress_port[LHC_TNA_PIPE_SHIFT - 1:0]) {
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
