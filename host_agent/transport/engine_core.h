/*
 * The engine's state machine, shared by _engine.c's Python type: positions, segments, the ring of
 * packets in flight, the window and the round-trip estimator. Mirrors host_agent/transport/engine_core.py
 * and window.py line for line; no I/O here: engine_io.c sends (send_out, through lhc_ina/udp_batch.c) and
 * receives (drain), and _engine.c's pump calls them around the state machine.
 */
#ifndef LHC_ENGINE_CORE_H
#define LHC_ENGINE_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <netinet/in.h>
#include <stdint.h>

/* engine_io.RECEIVE_BATCH and RECEIVE_BURST, checked by configure(): datagrams per recvmmsg, and at most this
 * many per drain before the timers are looked at again */
#define RX_BATCH 64
#define RX_BURST 256
#define RX_SLOT 2048     /* a receive slot: longer than any lhc packet, so a longer datagram is never whole */

/* The constants the reference owns (lhc_ina.constants, window.py, engine_core.py), by the name
 * engine_io.SHARED_CONSTANTS gives each, set by configure(): (C type, field, name). */
#define ENGINE_CONSTANTS(X)                                                                               \
    X(Py_ssize_t, lanes, "LANES") X(Py_ssize_t, header_bytes, "HEADER_BYTES")                              \
    X(Py_ssize_t, packet_bytes, "PACKET_BYTES")                                                             \
    X(int, duplicate_threshold, "DUPLICATE_THRESHOLD") X(double, min_rto, "MIN_RTO_S")                      \
    X(double, max_rto, "MAX_RTO_S") X(double, initial_rto, "INITIAL_RTO_S")                                 \
    X(double, initial_window, "INITIAL_WINDOW") X(double, rto_floor_rtts, "RTO_FLOOR_RTTS")                 \
    X(double, queue_target, "QUEUE_TARGET_S") X(int, result_type, "RESULT")                                 \
    X(int, result_retx_type, "RESULT_RETX") X(int, type_shift, "TYPE_SHIFT") X(int, off_job, "OFF_JOB_ID")  \
    X(int, off_epoch, "OFF_EPOCH") X(int, off_seq, "OFF_SEQ") X(int, off_bitmap, "OFF_BITMAP")              \
    X(int, receive_batch, "RECEIVE_BATCH") X(int, receive_burst, "RECEIVE_BURST")                           \
    X(int, gso_segments, "UDP_GSO_SEGMENTS") X(int, gso_refusals, "UDP_GSO_REFUSALS")                       \
    X(long, gso_bytes, "UDP_GSO_BYTES") X(double, pto_rtts, "PTO_RTTS") X(double, min_pto, "MIN_PTO_S")    \
    X(int, max_probes, "MAX_PROBES")

typedef struct {
#define CONSTANT_MEMBER(type, field, name) type field;
    ENGINE_CONSTANTS(CONSTANT_MEMBER)
#undef CONSTANT_MEMBER
} Constants;

/* The engine's constants: one set per process, filled once by configure() before any PacketEngine exists. */
extern Constants engine_constants;
extern int engine_configured;

typedef struct {
    long long ident, first, count, missing;
    double started;
    Py_buffer raw, result;
} Segment;

typedef struct {
    double first_sent, last_sent, deadline;
    long long retries;
} Flight;

typedef struct {
    long long ident;
    double started;
} Done;

typedef struct {
    /* identity */
    unsigned job_id, rank, epoch, slot_count;
    uint32_t full_mask;
    double timeout_s;
    struct sockaddr_in sw;
    int have_switch;
    /* round trip (window.RoundTrip) */
    int have_srtt;
    double srtt, rttvar, rto;
    /* window (window.Window) */
    double wsize, min_rtt, last_decrease;
    long long decreases;
    /* positions */
    long long next_free, send_next, low, highest, inflight;
    double rack_sent, rack_answered; /* the latest send among answered packets, and when its answer came */
    double progress_at;              /* the last new result or new packet ... */
    int probes;                      /* ... and the tail probes since */
    Flight *ring;
    unsigned char *received;
    Segment *segs;
    int n_segs, cap_segs;
    /* what a call produced: packets to send (pointers into segments' raw bytes), segments completed */
    const unsigned char **out;
    int n_out;
    Done *done;
    int n_done, cap_done;
    /* stall */
    int stalled;
    long long stall_position, stall_sends;
    double stall_age;
    /* counters (engine.EngineStats) */
    long long packets_sent, fast_retransmissions, timer_retransmissions, tail_probes, results, duplicate_results,
        stale_results, partial_results, foreign_packets;
} Core;

PyObject *core_configure(PyObject *constants);
int core_init(Core *c, unsigned job_id, unsigned rank, unsigned epoch, unsigned slot_count, uint32_t result_mask);
void core_free(Core *c);
int core_add(Core *c, const Segment *segment);
void core_restart(Core *c, unsigned epoch);
int core_from_switch(const Core *c, const struct sockaddr_in *from);
void core_result(Core *c, double now, const unsigned char *datagram, Py_ssize_t length,
                 const struct sockaddr_in *from);
/* Fast retransmits and timers (when ``recover``), then new packets, into c->out. */
void core_decide(Core *c, double now, int recover);
double core_next_wakeup(const Core *c);

#endif
