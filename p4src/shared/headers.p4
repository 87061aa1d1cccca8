// lhc-ina: the headers of an lhc packet, shared by the v1model and TNA programs.
//
// Ethernet / IPv4 (no options) / UDP / lhc header / LANES payload words. Every multi-byte field is
// big-endian on the wire. The lhc header type `lhc_t` and the lane count come from the generated
// constants.p4 (lhc_ina/constants.py is the single source); docs/protocol.md shows the bytes.
#ifndef LHC_HEADERS_P4_
#define LHC_HEADERS_P4_

#include "constants.p4"

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

// IPv4 without options: the parser only extracts a header whose first byte is 0x45 (version 4, ihl 5).
header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

// The payload: LANES 32-bit words w0 .. w(LANES-1), one header so that it is extracted whole or not at
// all (a truncated payload is a parser error, never a partial stack). The fields are written out by the
// lane X-macro, so the lane count is the generated one.
#define LHC_PAYLOAD_FIELD(L) bit<32> w##L;
header lhc_payload_t {
    LHC_FOR_EACH_LANE(LHC_PAYLOAD_FIELD)
}

struct lhc_headers_t {
    ethernet_t    ethernet;
    ipv4_t        ipv4;
    udp_t         udp;
    lhc_t         lhc;
    lhc_payload_t payload;
}

#endif  // LHC_HEADERS_P4_
