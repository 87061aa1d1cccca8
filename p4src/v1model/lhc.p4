// lhc-ina: in-network aggregation with lossless homomorphic compression, for BMv2 simple_switch_grpc.
//
// The contract (names, keys, actions, per-packet semantics) is docs/switch.md; the wire format is
// docs/protocol.md; the constants come from p4src/shared/constants.p4, generated from
// lhc_ina/constants.py. All stateful work happens in ingress inside one @atomic block.
//
// Per-lane code is written once as a macro and expanded for every lane by LHC_FOR_EACH_LANE: p4c's bmv2
// backend keeps a single iteration of a `for` loop in a control, so there is none here. The ingress
// control, where the aggregation lives, is ingress.p4; this file has the rest of the pipeline.
#include <core.p4>
#include <v1model.p4>

#include "../shared/headers.p4"

struct lhc_metadata_t {
    bit<8>  job_index;   // row of lhc_stats; 0 until `jobs` hits
    bit<16> slot_base;   // the job's first register slot
    bit<16> slot_count;  // the job's slots: 0 <= hdr.lhc.slot < slot_count
    bit<8>  fan_in;      // workers per aggregation (W)
    bit<16> mcast_grp;   // PRE group with one replica per worker (instance = rank)
    bit<16> epoch;       // the job's current epoch
    bit<32> worker_bit;  // 1 << rank, from `workers` (at a spine: the mask of a leaf's workers)
    // A leaf's way to its parent (docs/switch.md, "Two levels"), from `uplinks`; has_uplink 0 elsewhere.
    bit<1>  has_uplink;
    bit<9>  up_port;
    bit<8>  up_worker_id;
    bit<48> up_src_mac;
    bit<48> up_dst_mac;
    bit<32> up_src_addr;
    bit<32> up_dst_addr;
    bit<16> up_src_port;
    bit<16> up_dst_port;
}

parser LhcParser(packet_in packet,
                 out lhc_headers_t hdr,
                 inout lhc_metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    state start {
        transition parse_ethernet;
    }

#include "../shared/parser.p4"
}

control LhcVerifyChecksum(inout lhc_headers_t hdr, inout lhc_metadata_t meta) {
    apply { }
}

#include "ingress.p4"

control LhcEgress(inout lhc_headers_t hdr,
                  inout lhc_metadata_t meta,
                  inout standard_metadata_t standard_metadata) {

    // One multicast copy of a RESULT, addressed to the worker of rank egress_rid.
    action set_replica_dst(bit<48> dst_mac, bit<32> dst_addr, bit<16> dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_addr;
        hdr.udp.dst_port = dst_port;
    }

    action drop_replica() {
        mark_to_drop(standard_metadata);
    }

    table replicas {
        key = {
            hdr.lhc.job_id: exact;
            standard_metadata.egress_rid: exact;
        }
        actions = {
            set_replica_dst;
            @defaultonly drop_replica;
        }
        const default_action = drop_replica();
        size = 2048;
    }

    apply {
        if (hdr.lhc.isValid() && hdr.lhc.msg_type == LHC_TYPE_RESULT) {
            replicas.apply();
        }
    }
}

control LhcComputeChecksum(inout lhc_headers_t hdr, inout lhc_metadata_t meta) {
    apply {
        update_checksum(
            hdr.ipv4.isValid(),
            {
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
            },
            hdr.ipv4.hdr_checksum,
            HashAlgorithm.csum16);
    }
}

control LhcDeparser(packet_out packet, in lhc_headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.lhc);
        packet.emit(hdr.payload);
    }
}

V1Switch(LhcParser(), LhcVerifyChecksum(), LhcIngress(), LhcEgress(), LhcComputeChecksum(),
         LhcDeparser()) main;
