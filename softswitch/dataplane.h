/*
 * softswitch's native data plane: what its C files share (see _dataplane.c for the overview).
 *
 * No protocol number is written here: every offset, width, code and limit arrives at construction in
 * a dict built by softswitch/native.py from lhc_ina.constants, lhc_ina.wire and softswitch.program
 * (the one source of truth), and lands in a Layout.
 */
#ifndef SOFTSWITCH_DATAPLANE_H
#define SOFTSWITCH_DATAPLANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <sys/socket.h>

#include "../lhc_ina/udp_batch.h"

/* Every name softswitch/native.py's layout() must provide; X-macro so parsing and storage agree. */
#define LAYOUT_FIELDS(X)                                                                               \
    X(ethernet_bytes) X(frame_ipv4) X(frame_udp) X(frame_lhc) X(frame_payload) X(frame_end)               \
    X(eth_dst) X(eth_src) X(mac_bytes) X(eth_type) X(ip_total_len) X(ip_frag) X(ip_ttl) X(ip_proto)       \
    X(ip_checksum) X(ip_src) X(ip_dst) X(ip_addr_bytes) X(ipv4_bytes) X(udp_sport) X(udp_dport) X(udp_port_bytes) \
    X(udp_len) X(udp_checksum) X(udp_bytes)                                                               \
    X(ipv4_version_ihl) X(frag_offset_mask) X(ethertype_ipv4) X(ip_proto_udp)                             \
    X(udp_port_base) X(udp_port_mask) X(udp_length) X(ipv4_total_length)                                  \
    X(lhc_byte0) X(lhc_worker_id) X(lhc_job_id) X(lhc_slot) X(lhc_epoch) X(lhc_seq) X(lhc_bitmap)          \
    X(worker_id_bytes) X(job_id_bytes) X(slot_bytes) X(epoch_bytes) X(seq_bytes) X(bitmap_bytes)          \
    X(type_shift) X(op_shift) X(op_mask) X(ver_shift) X(ver_mask) X(flags_shift) X(flags_mask) X(byte0_keep)          \
    X(msg_data) X(msg_result) X(msg_result_retx) X(op_add) X(op_or)                                       \
    X(stat_absorbed) X(stat_result) X(stat_retx) X(stat_drop_duplicate) X(stat_drop_malformed)            \
    X(stat_drop_bad_type) X(stat_drop_bad_op) X(stat_drop_unknown_job) X(stat_drop_stale_epoch)           \
    X(stat_drop_slot_range) X(stat_drop_bad_worker) X(stat_drop_stale_round)                              \
    X(stat_up) X(stat_up_retx) X(stat_drop_stale_result)                                                 \
    X(lanes) X(lane_bytes) X(slot_copies) X(num_stats) X(drop_port) X(max_port) X(rx_bytes) X(burst)      \
    X(udp_gso_segments) X(udp_gso_refusals) X(udp_gso_bytes)                                              \
    X(workers_job_shift) X(workers_worker_shift) X(workers_src_shift) X(workers_sport_shift)              \
    X(replicas_job_shift) X(lpm_width)                                                                    \
    X(set_job_len) X(job_index_at) X(slot_base_at) X(slot_count_at) X(fan_in_at) X(mcast_grp_at)          \
    X(epoch_at) X(worker_bit_at) X(route_len) X(route_port_at) X(route_src_mac_at) X(route_dst_mac_at)    \
    X(set_port_at) X(replica_len) X(replica_dst_mac_at) X(replica_dst_addr_at) X(replica_dst_port_at)     \
    X(uplink_len) X(uplink_port_at) X(uplink_worker_id_at) X(uplink_src_mac_at) X(uplink_dst_mac_at)      \
    X(uplink_src_addr_at) X(uplink_dst_addr_at) X(uplink_src_port_at) X(uplink_dst_port_at)

typedef struct {
#define LAYOUT_MEMBER(name) long name;
    LAYOUT_FIELDS(LAYOUT_MEMBER)
#undef LAYOUT_MEMBER
} Layout;

/* The Pipeline's objects the data plane reads per packet, fetched afresh (new references) under the
 * switch lock at the start of every burst or inject: P4Runtime may rebind a default or an LPM length
 * list between bursts, never during one. */
typedef struct {
    int configured;
    PyObject *jobs, *jobs_default, *workers, *uplinks, *uplinks_default, *l2, *l2_default, *replicas;
    PyObject *replicas_default;
    PyObject *lpm_by_len, *lpm_lens, *lpm_default, *groups;
} Snapshot;

enum { PORT_UDP = 1, PORT_RAW = 2 };

/* One attached switch port and the frames queued to leave it at the next flush. */
typedef struct {
    int number, fd, kind;
    uint8_t *template; /* UDP: the synthesized headers (frame_lhc bytes) of every received datagram */
    struct mmsghdr *messages;
    struct iovec *iov;
    struct sockaddr_in *destinations; /* UDP: datagram i goes to destinations[i] */
    Py_ssize_t queued;
    UdpSender sender; /* GSO state and the sent / dropped counts (dropped: send_errors, per errno too) */
    unsigned long long frames_in, dropped_non_udp;
} Port;

/* Where the copies a frame produces go: a Python list (inject) or the ports' send queues (burst). */
typedef struct {
    PyObject *list;
} Sink;

typedef struct {
    PyObject_HEAD
    Layout L;
    PyObject *pipeline, *jobs_table, *workers_table, *uplinks_table, *l2_table, *replicas_table, *lpm_table;
    PyObject *pre;
    PyObject *name_set_job, *name_admit_worker, *name_route, *name_set_port, *name_set_replica_dst;
    PyObject *name_set_uplink;
    PyObject *last_error; /* the exception the last failed frame raised (None if none yet) */
    Py_buffer epoch, round, bitmap, remaining, values, stat_packets, stat_bytes;
    Py_ssize_t cells, max_slots, stat_cells;
    Snapshot s;
    uint8_t *rx;                 /* burst slots of rx_bytes each; slot 0 also serves inject */
    struct mmsghdr *rx_messages; /* recvmmsg: one per slot */
    struct iovec *rx_iov;
    struct sockaddr_storage *rx_sources;
    uint8_t *arena; /* copies waiting in send queues */
    Py_ssize_t arena_used, arena_size, queue_capacity;
    Port *ports;
    Py_ssize_t n_ports;
    int16_t *port_index; /* switch port number -> index in ports, -1 when nothing is attached */
    UdpRuns runs; /* lhc_ina/udp_batch.c's scratch for one port's flush, shared by the ports */
    int pending_error; /* the fatal errno a flush within a burst met (flush() raises it), 0 if none */
    unsigned long long errors;
    PyObject *capture;            /* a list while --pcap captures (NULL otherwise): see capture_frame */
    long capture_in, capture_out; /* the direction codes its records carry (softswitch/capture.py) */
} Dataplane;

/* A leaf's set_uplink parameters (docs/switch.md, "Two levels"); `has` is 0 where the job has none. */
typedef struct {
    int has;
    uint64_t port, worker_id, src_mac, dst_mac, src_addr, dst_addr, src_port, dst_port;
} Uplink;

/* dataplane_pipeline.c: one frame through the v1model program; -1 with an exception set if a table
 * entry is unusable (the frame is then lost, as the Python pipeline's ValueError loses it). */
int process_frame(Dataplane *e, uint8_t *rx, Py_ssize_t length, long ingress_port, Sink *sink);

/* dataplane_slots.c: the @atomic block. read_uplink: the job's uplinks entry (0, or -1 with an
 * exception); aggregate (a DATA packet) and store_result (a leaf's parent's result) return the outcome. */
int read_uplink(Dataplane *e, uint64_t job_id, Uplink *up);
long aggregate(Dataplane *e, uint8_t *rx, Py_ssize_t cell, uint64_t epoch, uint32_t seq, uint32_t step,
               uint32_t worker_bit, uint64_t fan_in, uint8_t byte0, const Uplink *up);
long store_result(Dataplane *e, uint8_t *rx, Py_ssize_t cell, uint64_t epoch, uint32_t seq, uint8_t byte0);

/* dataplane_tables.c: the Python objects a burst reads, and lookups in them. */
int snapshot_take(Dataplane *e);
void snapshot_drop(Dataplane *e);
/* dict.get(key) for an int key: borrowed, NULL on a miss (or with an exception set: check). */
PyObject *lookup(PyObject *dict, uint64_t key);
PyObject *lookup_wide(PyObject *dict, unsigned __int128 key);
/* Whether an action call (name, *params) is `name` (1, 0, or -1 with an exception). */
int is_action(PyObject *call, PyObject *name);
/* Param `at` of an action call; `size`, when > 0, is the tuple length pipeline.py unpacks. */
int param(PyObject *call, long at, long size, uint64_t *out);
/* The action of ipv4_routes' longest matching prefix: borrowed, NULL on a miss (or with an exception). */
PyObject *lpm_lookup(Dataplane *e, uint64_t value);

/* dataplane_io.c: ports, bursts and send queues. */
int emit_frame(Dataplane *e, Sink *sink, long port, const uint8_t *frame, Py_ssize_t length);
int io_setup(Dataplane *e);
void io_free(Dataplane *e);
int port_attach(Dataplane *e, int number, int fd, int kind, const uint8_t *template);
Py_ssize_t burst_receive(Dataplane *e, Port *port, int *error);
/* Every port's queue out; 0, or the first fatal errno a port's socket gave (no exception set: the caller
 * raises it, or keeps it in pending_error while a burst goes on). */
int flush_all(Dataplane *e);
/* While capturing: append (direction, port, frame bytes) to e->capture; -1 with an exception if it fails. */
int capture_frame(Dataplane *e, long direction, long port, const uint8_t *frame, Py_ssize_t length);

/* Big-endian fields of 1, 2, 4 or 6 bytes: widths come from the layout, so a generic reader. */
static inline uint64_t get_be(const uint8_t *p, long bytes)
{
    uint64_t value = 0;
    for (long i = 0; i < bytes; i++)
        value = (value << 8) | p[i];
    return value;
}

static inline void put_be(uint8_t *p, long bytes, uint64_t value)
{
    for (long i = bytes - 1; i >= 0; i--, value >>= 8)
        p[i] = (uint8_t)value;
}

/* Ethernet, IPv4 and UDP fields other than addresses are 16 bits wide (RFC 791, RFC 768). */
static inline uint64_t get16(const uint8_t *p) { return get_be(p, 2); }
static inline void put16(uint8_t *p, uint64_t v) { put_be(p, 2, v); }

/* The IPv4 header checksum written in place (lhc_ina/wire.py ipv4_checksum), for the pipeline's deparser
 * and the UDP ports' synthesized frames alike: inline here, so neither file calls into the other for it. */
static inline void ipv4_checksum(const Layout *L, uint8_t *rx)
{
    uint32_t total = 0;
    for (long at = L->frame_ipv4; at < L->frame_ipv4 + L->ipv4_bytes; at += 2)
        if (at != L->ip_checksum)
            total += (uint32_t)get16(rx + at);
    total = (total & 0xFFFF) + (total >> 16);
    total = (total & 0xFFFF) + (total >> 16);
    put16(rx + L->ip_checksum, ~total & 0xFFFF);
}

#endif
