"""The protocol's constants: the one source every other part reads.

The P4 program includes ``p4src/shared/constants.p4``, which ``make p4-constants`` generates from this
module (``lhc_ina.p4gen``); a test regenerates it and fails if the committed file differs. The wire
codecs (``lhc_ina.wire``), softswitch, the controller, the PTF tests and ``docs/protocol.md`` all read
the values below, never a copy of them.
"""

from __future__ import annotations

from enum import IntEnum

# --- Transport -------------------------------------------------------------------------------------
#: lhc DATA packets are UDP datagrams whose destination port lies in [UDP_PORT_BASE, UDP_PORT_BASE +
#: UDP_PORT_COUNT). The switch matches the range with a ternary mask, so the count is a power of two
#: and the base is aligned to it.
UDP_PORT_BASE = 0x4C40  # 19520
UDP_PORT_COUNT = 16
UDP_PORT_MASK = 0xFFFF & ~(UDP_PORT_COUNT - 1)

# --- Payload ---------------------------------------------------------------------------------------
#: 32-bit words per packet. 64 words = 256 B: one Tofino-1 pass (SwitchML's finding); BMv2 and
#: softswitch use the same.
LANES = 64
LANE_BYTES = 4
PAYLOAD_BYTES = LANES * LANE_BYTES

# --- Limits ----------------------------------------------------------------------------------------
#: A switch's members of one job are ranks 0..MAX_WORKERS-1, each owning one bit of the 32-bit contributor
#: bitmap: a one-switch job's workers, a leaf's own workers (its wire ``worker_id`` is the rank within its
#: leaf), a spine's leaves (docs/switch.md, "Ranks per level").
MAX_WORKERS = 32
#: Leaves one two-level job spans at most: the spine's members, one bitmap bit each.
MAX_LEAVES = 32
#: Workers of one job at most (job-global ranks 0..MAX_JOB_WORKERS-1, what the codec and torch see):
#: MAX_WORKERS per leaf under MAX_LEAVES leaves. One switch holds MAX_WORKERS of them.
MAX_JOB_WORKERS = MAX_WORKERS * MAX_LEAVES
#: Aggregator slots in the switch (each has two shadow copies, so registers hold 2 * MAX_SLOTS cells).
MAX_SLOTS = 4096
SLOT_COPIES = 2
#: Jobs the switch counts separately. Counter row 0 is for packets that belong to no admitted job.
MAX_JOBS = 64

#: Tofino-1 (p4src/tna): a 9-bit port number's pipe is its bits from TNA_PIPE_SHIFT up, and the port whose
#: low bits are TNA_RECIRC_PORT_LOCAL in each pipe recirculates; a job's packets recirculate in its pipe.
TNA_PIPE_SHIFT = 7
TNA_RECIRC_PORT_LOCAL = 68

# --- Header ----------------------------------------------------------------------------------------
#: The lhc header, in wire order, as (field name, width in bits). Big-endian, no padding: 16 bytes.
#: ``msg_type`` is the header's type field (``type`` is a keyword in P4_16).
HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("msg_type", 4),
    ("op", 2),
    ("ver", 1),
    ("flags", 1),
    ("worker_id", 8),
    ("job_id", 16),
    ("slot", 16),
    ("epoch", 16),
    ("seq", 32),
    ("bitmap", 32),
)
HEADER_BITS = sum(width for _, width in HEADER_FIELDS)
HEADER_BYTES = HEADER_BITS // 8

#: Ethernet (14) + IPv4 without options (20) + UDP (8) in front of the lhc header.
ETHERNET_BYTES = 14
IPV4_BYTES = 20
UDP_BYTES = 8
UDP_LENGTH = UDP_BYTES + HEADER_BYTES + PAYLOAD_BYTES
IPV4_TOTAL_LENGTH = IPV4_BYTES + UDP_LENGTH
FRAME_BYTES = ETHERNET_BYTES + IPV4_TOTAL_LENGTH
ETHERTYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17

# --- Batched UDP (lhc_ina/udp_batch.c, for every sender: worker engine, softswitch, lhc_ina.udp) -----
#: Datagrams one UDP GSO send carries at most (the kernel's UDP_MAX_SEGMENTS since Linux 4.18).
UDP_GSO_SEGMENTS = 64
#: Payload bytes of one GSO send at most: one IPv4 datagram's (65535 minus the IPv4 and UDP headers).
UDP_GSO_BYTES = 0xFFFF - IPV4_BYTES - UDP_BYTES
#: GSO runs a socket's kernel or route may refuse before its sender sends one datagram per message for
#: good (one odd refusal, such as a run longer than a route's MTU, must not turn GSO off).
UDP_GSO_REFUSALS = 8
#: The socket-error rule of every sender and receiver: only these errnos, the socket's own faults, make a
#: socket unusable (a closed descriptor, not a socket, a buffer outside memory, no destination or peer where
#: one is needed, a socket shut down for writing); they would fail every later datagram alike, so the call
#: stops and raises. Any other errno concerns one datagram or its destination (EINVAL for an address this
#: socket may not send to, a full buffer, an unreachable host or port, a firewall, a datagram too long, an
#: interface gone): that datagram is dropped and counted under its errno, and the rest still leave.
#: udp_batch.h's UDP_FATAL_ERRORS names the same (a test holds them equal).
UDP_FATAL_ERRORS = ("EBADF", "ENOTSOCK", "EFAULT", "EDESTADDRREQ", "ENOTCONN", "EPIPE")


class MsgType(IntEnum):
    """What a packet is. Only DATA is aggregated; the switch emits RESULT and RESULT_RETX. A leaf takes
    RESULT and RESULT_RETX from its parent (the spine) only; any other switch drops them as BAD_TYPE."""

    DATA = 1  # a worker's contribution to one slot copy (or a leaf's partial, sent up to its spine)
    RESULT = 2  # the finished aggregate, multicast to every worker of the job (or leaf, by a spine)
    RESULT_RETX = 3  # the finished aggregate again, unicast to a worker (or leaf) that asked twice
    CONTROL = 4  # host-to-host signalling; the switch never aggregates it (dropped as BAD_TYPE)


class Op(IntEnum):
    """How a slot combines its lanes. ADD wraps mod 2^32 (two's complement), never saturates."""

    ADD = 0
    OR = 1


class Stat(IntEnum):
    """Outcome of one lhc packet at the switch: the column of the per-job counter it increments.

    Every lhc packet increments exactly one cell, ``lhc_stats[job_index * NUM_STATS + outcome]``;
    packets that match no admitted job (and malformed ones) count under job index 0.
    """

    ABSORBED = 0  # a new contribution, not the last: added and dropped
    RESULT = 1  # the last contribution: the result was multicast to the job
    RETX = 2  # a repeat of the copy's finished round: RESULT_RETX unicast to the sender
    DROP_DUPLICATE = 3  # a repeat while the copy's round still aggregates
    DROP_MALFORMED = 4  # truncated packet, wrong UDP/IP length, or reserved bits set
    DROP_BAD_TYPE = 5  # not a DATA packet (RESULT, RESULT_RETX, CONTROL or unknown type)
    DROP_BAD_OP = 6  # op code not in Op
    DROP_UNKNOWN_JOB = 7  # job_id not admitted
    DROP_STALE_EPOCH = 8  # epoch differs from the job's current one
    DROP_SLOT_RANGE = 9  # slot >= the job's slot count
    DROP_BAD_WORKER = 10  # (job, worker_id, IPv4 source) not admitted: unknown worker or spoofed
    DROP_STALE_ROUND = 11  # seq is neither the copy's round nor its next one: a delayed packet
    # Two levels (docs/switch.md, "Two levels: leaf and spine"): only a job with an `uplinks` entry (a
    # leaf's) reaches these.
    UP = 12  # the leaf's round completed locally: its partial went up to the parent as one DATA packet
    UP_RETX = 13  # a repeat while the copy awaits the parent's result: the partial went up again
    DROP_STALE_RESULT = 14  # a result from the parent for a round the copy does not await


#: Counter columns per job (a power of two, so the index is a shift on Tofino).
NUM_STATS = 16
assert len(Stat) <= NUM_STATS
