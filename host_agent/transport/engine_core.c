/*
 * The engine's state machine (see engine_core.h). Each function names the method of
 * host_agent/transport/engine_core.py or window.py it mirrors; keep the two in step.
 */
#include "engine_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

Constants engine_constants;
int engine_configured = 0;

/* One constant by name into its field, converted as the field's type. */
static int constant(PyObject *constants, const char *name, double *value)
{
    PyObject *item = PyDict_GetItemString(constants, name);
    if (item == NULL) {
        PyErr_Format(PyExc_KeyError, "configure(): missing %s", name);
        return -1;
    }
    *value = PyFloat_AsDouble(item);
    return PyErr_Occurred() ? -1 : 0;
}

PyObject *core_configure(PyObject *constants)  /* engine_io.py: SHARED_CONSTANTS */
{
    if (!PyDict_Check(constants))
        return PyErr_Format(PyExc_TypeError, "configure() takes a dict");
    Constants k;
    double value;
#define CONSTANT_READ(type, field, name)                                                                  \
    if (constant(constants, name, &value) < 0)                                                            \
        return NULL;                                                                                      \
    k.field = (type)value;
    ENGINE_CONSTANTS(CONSTANT_READ)
#undef CONSTANT_READ
    if (k.packet_bytes != k.header_bytes + 4 * k.lanes || k.packet_bytes + 1 > RX_SLOT)
        return PyErr_Format(PyExc_ValueError, "configure(): inconsistent packet layout");
    /* sized into the engine's receive buffers at compile time: they must agree */
    if (k.receive_batch != RX_BATCH || k.receive_burst != RX_BURST)
        return PyErr_Format(PyExc_ValueError, "configure(): receive batch %d and burst %d, compiled %d and %d",
                            k.receive_batch, k.receive_burst, RX_BATCH, RX_BURST);
    engine_constants = k;
    engine_configured = 1;
    Py_RETURN_NONE;
}

static double max2(double a, double b) { return b > a ? b : a; }  /* Python's max(a, b) */
static double min2(double a, double b) { return b < a ? b : a; }  /* Python's min(a, b) */

static void reset_positions(Core *c)  /* PacketEngine._reset_positions */
{
    for (int i = 0; i < c->n_segs; i++) {
        PyBuffer_Release(&c->segs[i].raw);
        PyBuffer_Release(&c->segs[i].result);
    }
    c->n_segs = 0;
    c->stalled = 0;
    memset(c->ring, 0, sizeof(Flight) * c->slot_count);
    memset(c->received, 0, c->slot_count);
    c->next_free = c->send_next = c->low = 0;
    c->highest = -1;
    c->inflight = 0;
    c->rack_sent = c->rack_answered = c->progress_at = -INFINITY;
    c->probes = 0;
    c->n_out = 0;
}

int core_init(Core *c, unsigned job_id, unsigned rank, unsigned epoch, unsigned slot_count, uint32_t result_mask)
{
    core_free(c);
    memset(c, 0, sizeof(*c));
    c->job_id = job_id, c->rank = rank, c->epoch = epoch, c->slot_count = slot_count;
    c->full_mask = result_mask;
    c->rto = engine_constants.initial_rto;
    c->wsize = min2((double)slot_count, engine_constants.initial_window);
    c->min_rtt = INFINITY;
    c->last_decrease = -INFINITY;
    c->ring = calloc(slot_count, sizeof(Flight));
    c->received = calloc(slot_count, 1);
    c->out = calloc(slot_count + 1, sizeof(*c->out));
    if (c->ring == NULL || c->received == NULL || c->out == NULL)
        return -1;
    reset_positions(c);
    return 0;
}

void core_free(Core *c)
{
    if (c->ring != NULL)
        reset_positions(c);
    free(c->ring), free(c->received), free(c->out), free(c->segs), free(c->done);
    c->ring = NULL, c->received = NULL, c->out = NULL, c->segs = NULL, c->done = NULL;
    c->cap_segs = c->cap_done = 0;
}

int core_add(Core *c, const Segment *segment)  /* PacketEngine.add (checked by the caller) */
{
    if (c->n_segs == c->cap_segs) {
        int cap = c->cap_segs ? 2 * c->cap_segs : 16;
        Segment *grown = realloc(c->segs, sizeof(Segment) * cap);
        if (grown == NULL)
            return -1;
        c->segs = grown, c->cap_segs = cap;
    }
    c->segs[c->n_segs++] = *segment;
    c->next_free = segment->first + segment->count;
    return 0;
}

void core_restart(Core *c, unsigned epoch)  /* PacketEngine.restart */
{
    c->epoch = epoch;
    reset_positions(c);
}

int core_from_switch(const Core *c, const struct sockaddr_in *from)
{
    return c->have_switch && from->sin_family == AF_INET && from->sin_port == c->sw.sin_port &&
           from->sin_addr.s_addr == c->sw.sin_addr.s_addr;
}

static Segment *segment_at(Core *c, long long position)  /* PacketEngine._segment_at (binary search) */
{
    int lo = 0, hi = c->n_segs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->segs[mid].first <= position)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &c->segs[lo];
}

static void rtt_sample(Core *c, double rtt)  /* RoundTrip.sample */
{
    if (!c->have_srtt) {
        c->srtt = rtt, c->rttvar = rtt / 2, c->have_srtt = 1;
    } else {
        c->rttvar = 0.75 * c->rttvar + 0.25 * fabs(c->srtt - rtt);
        c->srtt = 0.875 * c->srtt + 0.125 * rtt;
    }
    double floor_ = max2(engine_constants.min_rto, engine_constants.rto_floor_rtts * c->srtt);
    c->rto = min2(engine_constants.max_rto, max2(floor_, c->srtt + 4 * c->rttvar));
}

static double pause_s(const Core *c) { return c->have_srtt && c->srtt != 0.0 ? c->srtt : c->rto; }

static void window_on_result(Core *c, double rtt)  /* Window.on_result */
{
    c->min_rtt = min2(c->min_rtt, rtt);
    if (rtt > max2(2 * c->min_rtt, c->min_rtt + engine_constants.queue_target))
        c->wsize = max2(1.0, c->wsize - 1.0 / c->wsize);
    else
        c->wsize = min2((double)c->slot_count, c->wsize + 1.0 / c->wsize);
}

static void window_on_loss(Core *c, double now, double rtt)  /* Window.on_loss */
{
    if (rtt > max2(2 * c->min_rtt, c->min_rtt + engine_constants.queue_target) && now - c->last_decrease >= rtt) {
        c->wsize = max2(1.0, c->wsize / 2);
        c->last_decrease = now;
        c->decreases++;
    }
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
static unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

static void complete(Core *c, Segment *segment)
{
    if (c->n_done == c->cap_done) {
        int cap = c->cap_done ? 2 * c->cap_done : 16;
        Done *grown = realloc(c->done, sizeof(Done) * cap);
        if (grown == NULL)
            return;  /* cannot happen in practice; the segment would then never be reported */
        c->done = grown, c->cap_done = cap;
    }
    c->done[c->n_done++] = (Done){segment->ident, segment->started};
    PyBuffer_Release(&segment->raw);
    PyBuffer_Release(&segment->result);
    int at = (int)(segment - c->segs);
    memmove(&c->segs[at], &c->segs[at + 1], sizeof(Segment) * (c->n_segs - at - 1));
    c->n_segs--;
}

void core_result(Core *c, double now, const unsigned char *d, Py_ssize_t length,
                 const struct sockaddr_in *from)  /* PacketEngine._check_result */
{
    if (!core_from_switch(c, from) || length != engine_constants.packet_bytes) {
        c->foreign_packets++;
        return;
    }
    int type = d[0] >> engine_constants.type_shift;
    if ((type != engine_constants.result_type && type != engine_constants.result_retx_type) || be16(d + engine_constants.off_job) != c->job_id) {
        c->foreign_packets++;
        return;
    }
    if (be16(d + engine_constants.off_epoch) != c->epoch) {
        c->stale_results++;
        return;
    }
    long long position = c->low + (long long)(uint32_t)(be32(d + engine_constants.off_seq) - (uint32_t)c->low);
    unsigned slot = (unsigned)(position % c->slot_count);
    if (position >= c->send_next) {
        c->stale_results++;
        return;
    }
    if (c->received[slot]) {
        c->duplicate_results++;
        return;
    }
    if (be32(d + engine_constants.off_bitmap) != c->full_mask) {
        c->partial_results++;
        return;
    }
    Flight *flight = &c->ring[slot];
    c->results++;
    if (flight->retries == 0) {
        double rtt = now - flight->first_sent;
        rtt_sample(c, rtt);
        window_on_result(c, rtt);
    }
    c->received[slot] = 1;
    c->inflight--;
    if (position > c->highest)
        c->highest = position;
    if (flight->last_sent > c->rack_sent)
        c->rack_sent = flight->last_sent, c->rack_answered = now;
    c->progress_at = now, c->probes = 0;
    Segment *segment = segment_at(c, position);
    uint32_t *into = (uint32_t *)segment->result.buf + (position - segment->first) * engine_constants.lanes;
    const unsigned char *words = d + engine_constants.header_bytes;
    for (Py_ssize_t i = 0; i < engine_constants.lanes; i++)
        into[i] = be32(words + 4 * i);
    if (--segment->missing == 0)
        complete(c, segment);
    while (c->low < c->send_next && c->received[c->low % c->slot_count]) {
        c->received[c->low % c->slot_count] = 0;
        c->low++;
    }
}

static const unsigned char *packet(Core *c, long long position)  /* PacketEngine._packet */
{
    Segment *segment = segment_at(c, position);
    return (const unsigned char *)segment->raw.buf + (position - segment->first) * engine_constants.packet_bytes;
}

static void resend(Core *c, double now, long long position, Flight *flight)  /* PacketEngine._resend */
{
    c->out[c->n_out++] = packet(c, position);
    flight->retries++;
    flight->last_sent = now;
    flight->deadline = now + min2(engine_constants.max_rto, c->rto * ldexp(1.0, (int)flight->retries));
    c->packets_sent++;
    window_on_loss(c, now, pause_s(c));
}

static void fast_retransmit(Core *c, double now)  /* PacketEngine._fast_retransmit */
{
    double pause = pause_s(c);
    long long gap_end = c->highest - engine_constants.duplicate_threshold + 1;
    long long end = now - c->rack_answered >= pause ? c->send_next
                    : (c->send_next < gap_end ? c->send_next : gap_end);
    for (long long p = c->low; p < end; p++) {
        unsigned slot = (unsigned)(p % c->slot_count);
        Flight *flight = &c->ring[slot];
        if (c->received[slot] || now - flight->last_sent < pause)
            continue;
        if (p < gap_end || flight->last_sent < c->rack_sent) {
            resend(c, now, p, flight);
            c->fast_retransmissions++;
        }
    }
}

/* The oldest expired packet is resent, the others' timers re-armed; 0 (and stalled set) when a packet is
 * past timeout_s. */
static int timers(Core *c, double now)  /* PacketEngine._timers */
{
    int resent = 0;
    for (long long p = c->low; p < c->send_next; p++) {
        unsigned slot = (unsigned)(p % c->slot_count);
        Flight *flight = &c->ring[slot];
        if (c->received[slot] || flight->deadline > now)
            continue;
        if (now - flight->first_sent > c->timeout_s) {
            c->stalled = 1;
            c->stall_position = p, c->stall_sends = flight->retries + 1, c->stall_age = now - flight->first_sent;
            return 0;
        }
        if (resent) {
            flight->deadline = now + c->rto;
            continue;
        }
        resend(c, now, p, flight);
        c->timer_retransmissions++;
        resent = 1;
    }
    return 1;
}

static double probe_timeout(const Core *c, int probes)  /* RoundTrip.probe_timeout */
{
    double base = c->have_srtt ? max2(engine_constants.min_pto, engine_constants.pto_rtts * c->srtt) : c->rto;
    return base * ldexp(1.0, probes);
}

static void tail_probe(Core *c, double now)  /* PacketEngine._tail_probe */
{
    if (c->probes >= engine_constants.max_probes || now < c->progress_at + probe_timeout(c, c->probes))
        return;
    for (long long p = c->send_next - 1; p >= c->low; p--) {
        unsigned slot = (unsigned)(p % c->slot_count);
        if (!c->received[slot]) {
            Flight *flight = &c->ring[slot];
            c->out[c->n_out++] = packet(c, p);
            flight->retries++;
            flight->last_sent = now;
            c->probes++;
            c->tail_probes++;
            c->packets_sent++;
            return;
        }
    }
}

static void send_new(Core *c, double now)  /* PacketEngine._send_new */
{
    long long limit = c->low + c->slot_count < c->next_free ? c->low + c->slot_count : c->next_free;
    long long window = c->wsize < 1.0 ? 1 : (long long)c->wsize;
    while (c->send_next < limit && c->inflight < window) {
        long long p = c->send_next;
        Segment *segment = segment_at(c, p);
        if (p == segment->first)
            segment->started = now;
        c->out[c->n_out++] = packet(c, p);
        Flight *flight = &c->ring[p % c->slot_count];
        flight->retries = 0;
        flight->first_sent = flight->last_sent = now;
        flight->deadline = now + c->rto;
        c->inflight++;
        c->send_next++;
        c->packets_sent++;
        c->progress_at = now, c->probes = 0;
    }
}

void core_decide(Core *c, double now, int recover)  /* PacketEngine.step, after the results */
{
    if (recover) {
        fast_retransmit(c, now);
        int sent = c->n_out;
        if (!timers(c, now))
            return;
        if (c->n_out == sent)
            tail_probe(c, now);
    }
    send_new(c, now);
}

double core_next_wakeup(const Core *c)  /* PacketEngine.next_wakeup; -1 for None */
{
    double wakeup = -1.0, pause = pause_s(c);
    for (long long p = c->low; p < c->send_next; p++) {
        unsigned slot = (unsigned)(p % c->slot_count);
        if (c->received[slot])
            continue;
        const Flight *flight = &c->ring[slot];
        double due = flight->deadline;
        if (p <= c->highest - engine_constants.duplicate_threshold)
            due = min2(due, flight->last_sent + pause);
        else if (flight->last_sent < c->rack_sent)
            due = min2(due, max2(flight->last_sent, c->rack_answered) + pause);
        wakeup = wakeup < 0 ? due : min2(wakeup, due);
    }
    if (wakeup >= 0 && c->probes < engine_constants.max_probes)
        wakeup = min2(wakeup, c->progress_at + probe_timeout(c, c->probes));
    return wakeup;
}
