// lhc-ina on TNA: the egress control, which addresses each multicast copy of a result to its worker
// (included by lhc.p4).
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
