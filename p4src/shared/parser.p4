// lhc-ina: parser states shared by the v1model and TNA parsers.
//
// Include this file INSIDE a parser body whose packet_in is named `packet` and whose headers (an
// lhc_headers_t) are named `hdr`; the architecture's own start state transitions to parse_ethernet.
//
//   Ethernet -> IPv4 when ether_type is IPv4 and the first byte is 0x45 (version 4, ihl 5: no options)
//            -> UDP when protocol is UDP and the packet is not a non-first fragment
//            -> lhc header + LANES payload words when the UDP destination port is in the lhc range
//               (LHC_UDP_PORT_BASE &&& LHC_UDP_PORT_MASK), whatever the destination address.
//
// A packet that ends early raises error.PacketTooShort; the header being extracted stays invalid and the
// ingress control sees the error (v1model: standard_metadata.parser_error, TNA: ig_prsr_md.parser_err).
// Packets are never dropped here: the ingress control decides and counts.
#ifndef LHC_PARSER_STATES_P4_
#define LHC_PARSER_STATES_P4_

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4_check;
            default: accept;
        }
    }

    state parse_ipv4_check {
        transition select(packet.lookahead<bit<8>>()) {
            8w0x45: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (13w0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            LHC_UDP_PORT_BASE &&& LHC_UDP_PORT_MASK: parse_lhc;
            default: accept;
        }
    }

    state parse_lhc {
        packet.extract(hdr.lhc);
        packet.extract(hdr.payload);
        transition accept;
    }

#endif  // LHC_PARSER_STATES_P4_
