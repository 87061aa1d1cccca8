/*
 * The per-packet engine of a worker's stream, in C: the state machine of host_agent/transport/engine.py
 * (the reference; read its docstring first) plus the socket work around it.
 *
 * Why: in Python every packet cost a dict lookup, a struct unpack, a numpy slice and a timer scan, and a
 * worker moved ~185k datagrams/s at best. Here a pump is one recvmmsg and one sendmmsg per batch of up to
 * 64 datagrams, with the GIL released while the kernel works, and the per-packet work a few loads and
 * stores. The Python stream above still owns messages, futures and epoch changes; it hands segments in
 * and gets whole segments back.
 *
 * Engine(fd, job_id, rank, epoch, slot_count, world_size, timeout_s, loss, duplicate, seed)
 *   .set_switch(host, port)          where results must come from, and where packets go
 *   .add(ident, first, raw, result)  a segment: raw = its packets' bytes, result = writable uint32 buffer
 *   .restart(epoch)                  everything starts over at position 0 (the window and RTT stay)
 *   .step(now, [(bytes, (host, port))], recover=True) -> ([bytes to send], [(ident, started)])  (no I/O)
 *   .pump(wake_fd, max_wait) -> [(ident, started)]   one turn of the I/O loop (see pump() below)
 *   .next_wakeup(), .stats(), .rtt(), .window(), .stalled(), .io_counters(), .next_free, .low
 * configure(constants): the constants shared with the reference (host_agent/transport/engines.py).
 *
 * The arithmetic on doubles is written in the reference's order, so that both take the same decisions
 * from the same inputs (tests/test_engine_differential.py compares them bit for bit).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine_core.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* linux/udp.h: the GSO segment size of a sendmsg, as a cmsg */
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#define GSO_MAX 64 /* datagrams per GSO message (UDP_MAX_SEGMENTS on older kernels) */

/* ---- the Python type ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Core core;
    int fd;
    double loss, duplicate;
    uint64_t rng;
    long long io_sent, io_received, dropped_out, dropped_in, duplicated_out, duplicated_in;
    /* receive buffers for one recvmmsg */
    unsigned char rx[RX_BATCH][RX_SLOT];
    struct mmsghdr rx_msgs[RX_BATCH];
    struct iovec rx_iov[RX_BATCH];
    struct sockaddr_in rx_from[RX_BATCH];
    /* one sendmmsg: every packet a decision queued, twice where the impairment doubles it; with UDP GSO a
     * message carries up to GSO_MAX of them (one kernel traversal), else one each */
    struct mmsghdr *tx_msgs;
    struct iovec *tx_iov;
    char (*tx_ctrl)[CMSG_SPACE(sizeof(uint16_t))];
    int gso;
} Engine;

static double uniform(Engine *e)  /* splitmix64 -> [0, 1): the impairment's draws */
{
    uint64_t z = (e->rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"fd", "job_id", "rank", "epoch", "slot_count", "world_size", "timeout_s",
                            "loss", "duplicate", "seed", "gso", NULL};
    unsigned job_id, rank, epoch, slot_count, world_size;
    unsigned long long seed;
    double timeout_s;
    e->gso = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iIIIIIdddK|p", names, &e->fd, &job_id, &rank, &epoch,
                                     &slot_count, &world_size, &timeout_s, &e->loss, &e->duplicate, &seed,
                                     &e->gso))
        return -1;
    if (!g_configured) {
        PyErr_SetString(PyExc_RuntimeError, "_engine.configure() was not called");
        return -1;
    }
    if (slot_count < 1 || world_size < 1 || world_size > 32) {
        PyErr_Format(PyExc_ValueError, "slot_count %u and world_size %u (1..32) are not valid", slot_count,
                     world_size);
        return -1;
    }
    e->rng = seed;
    free(e->tx_msgs), free(e->tx_iov), free(e->tx_ctrl);
    e->tx_msgs = calloc(2 * (slot_count + 1), sizeof(*e->tx_msgs));
    e->tx_iov = calloc(2 * (slot_count + 1), sizeof(*e->tx_iov));
    e->tx_ctrl = calloc(2 * (slot_count + 1), sizeof(*e->tx_ctrl));
    if (e->tx_msgs == NULL || e->tx_iov == NULL || e->tx_ctrl == NULL ||
        core_init(&e->core, job_id, rank, epoch, slot_count, world_size) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    e->core.timeout_s = timeout_s;
    for (int i = 0; i < RX_BATCH; i++) {
        e->rx_iov[i].iov_base = e->rx[i];
        e->rx_iov[i].iov_len = RX_SLOT;
        memset(&e->rx_msgs[i], 0, sizeof(e->rx_msgs[i]));
        e->rx_msgs[i].msg_hdr.msg_iov = &e->rx_iov[i];
        e->rx_msgs[i].msg_hdr.msg_iovlen = 1;
        e->rx_msgs[i].msg_hdr.msg_name = &e->rx_from[i];
        e->rx_msgs[i].msg_hdr.msg_namelen = sizeof(e->rx_from[i]);
    }
    return 0;
}

static void Engine_dealloc(Engine *e)
{
    core_free(&e->core);
    free(e->tx_msgs), free(e->tx_iov), free(e->tx_ctrl);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int parse_address(const char *host, int port, struct sockaddr_in *out)
{
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &out->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not a dotted IPv4 address and port: %s:%d", host, port);
        return -1;
    }
    return 0;
}

static PyObject *Engine_set_switch(Engine *e, PyObject *args)
{
    const char *host;
    int port;
    if (!PyArg_ParseTuple(args, "si", &host, &port) || parse_address(host, port, &e->core.sw) < 0)
        return NULL;
    e->core.have_switch = 1;
    Py_RETURN_NONE;
}

static PyObject *Engine_add(Engine *e, PyObject *args)
{
    long long ident, first;
    PyObject *raw, *result;
    if (!PyArg_ParseTuple(args, "LLOO", &ident, &first, &raw, &result))
        return NULL;
    Segment s = {.ident = ident, .first = first, .started = -1.0};
    if (PyObject_GetBuffer(raw, &s.raw, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(result, &s.result, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&s.raw);
        return NULL;
    }
    s.count = s.raw.len / g.packet_bytes;
    s.missing = s.count;
    if (first != e->core.next_free || s.count * g.packet_bytes != s.raw.len ||
        s.result.len != s.count * g.lanes * 4) {
        PyErr_Format(PyExc_ValueError, "segment %lld at %lld does not continue the stream at %lld", ident,
                     first, e->core.next_free);
        PyBuffer_Release(&s.raw);
        PyBuffer_Release(&s.result);
        return NULL;
    }
    if (core_add(&e->core, &s) < 0) {
        PyBuffer_Release(&s.raw);
        PyBuffer_Release(&s.result);
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyObject *Engine_restart(Engine *e, PyObject *args)
{
    unsigned epoch;
    if (!PyArg_ParseTuple(args, "I", &epoch))
        return NULL;
    core_restart(&e->core, epoch);
    Py_RETURN_NONE;
}

/* The completed segments of a core call, as the list [(ident, started)] the stream expects. */
static PyObject *take_completed(Core *c, PyObject *into)
{
    for (int i = 0; i < c->n_done; i++) {
        PyObject *item = Py_BuildValue("(Ld)", c->done[i].ident, c->done[i].started);
        if (item == NULL || PyList_Append(into, item) < 0) {
            Py_XDECREF(item);
            return NULL;
        }
        Py_DECREF(item);
    }
    c->n_done = 0;
    return into;
}

static PyObject *Engine_step(Engine *e, PyObject *args)
{
    double now;
    PyObject *datagrams;
    int recover = 1;
    if (!PyArg_ParseTuple(args, "dO!|p", &now, &PyList_Type, &datagrams, &recover))
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(datagrams); i++) {
        const char *host;
        int port;
        Py_buffer view;
        struct sockaddr_in from;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(datagrams, i), "y*(si)", &view, &host, &port))
            return NULL;
        if (parse_address(host, port, &from) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        core_result(&e->core, now, view.buf, view.len, &from);
        PyBuffer_Release(&view);
    }
    core_decide(&e->core, now, recover);
    PyObject *out = PyList_New(0), *completed = PyList_New(0);
    if (out == NULL || completed == NULL || take_completed(&e->core, completed) == NULL)
        goto fail;
    for (int i = 0; i < e->core.n_out; i++) {
        PyObject *packet = PyBytes_FromStringAndSize((const char *)e->core.out[i], g.packet_bytes);
        if (packet == NULL || PyList_Append(out, packet) < 0) {
            Py_XDECREF(packet);
            goto fail;
        }
        Py_DECREF(packet);
    }
    e->core.n_out = 0;
    return Py_BuildValue("(NN)", out, completed);
fail:
    Py_XDECREF(out);
    Py_XDECREF(completed);
    return NULL;
}

static double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Messages for the n datagrams of tx_iov: GSO runs of up to GSO_MAX, or one per datagram. */
static int build_messages(Engine *e, int n)
{
    int per = e->gso ? GSO_MAX : 1, m = 0;
    for (int at = 0; at < n; at += per, m++) {
        struct msghdr *h = &e->tx_msgs[m].msg_hdr;
        memset(&e->tx_msgs[m], 0, sizeof(e->tx_msgs[m]));
        h->msg_iov = &e->tx_iov[at];
        h->msg_iovlen = (size_t)(n - at < per ? n - at : per);
        h->msg_name = &e->core.sw;
        h->msg_namelen = sizeof(e->core.sw);
        if (h->msg_iovlen > 1) {
            h->msg_control = e->tx_ctrl[m];
            h->msg_controllen = sizeof(e->tx_ctrl[m]);
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(h);
            cmsg->cmsg_level = SOL_UDP;
            cmsg->cmsg_type = UDP_SEGMENT;
            cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t size = (uint16_t)g.packet_bytes;
            memcpy(CMSG_DATA(cmsg), &size, sizeof(size));
        }
    }
    return m;
}

/* Send what the core queued, each datagram lost or doubled on its own where impaired, one sendmmsg. */
static void send_out(Engine *e)
{
    int n = 0;
    for (int i = 0; i < e->core.n_out; i++) {
        int copies = 1;
        if (e->loss > 0 || e->duplicate > 0) {
            if (uniform(e) < e->loss) {
                e->dropped_out++;
                continue;
            }
            if (uniform(e) < e->duplicate) {
                e->duplicated_out++;
                copies = 2;
            }
        }
        for (int k = 0; k < copies; k++, n++) {
            e->tx_iov[n].iov_base = (void *)e->core.out[i];
            e->tx_iov[n].iov_len = (size_t)g.packet_bytes;
        }
    }
    e->core.n_out = 0;
    int m = build_messages(e, n), at = 0;
    Py_BEGIN_ALLOW_THREADS
    while (at < m) {
        int sent = sendmmsg(e->fd, e->tx_msgs + at, (unsigned)(m - at), 0);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && e->gso && (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT ||
                                   errno == EOPNOTSUPP)) {
            e->gso = 0;  /* this kernel or route takes no GSO: one message per datagram from now on */
            int done = 0;
            for (int k = 0; k < at; k++)
                done += (int)e->tx_msgs[k].msg_hdr.msg_iovlen;
            memmove(e->tx_iov, e->tx_iov + done, sizeof(*e->tx_iov) * (size_t)(n - done));
            n -= done;
            m = build_messages(e, n), at = 0;
            continue;
        }
        if (sent < 0) {  /* this message is lost (a full buffer, an unreachable port), as a sendto's */
            e->dropped_out += (long long)e->tx_msgs[at].msg_hdr.msg_iovlen;
            at++;
            continue;
        }
        for (int k = at; k < at + sent; k++)
            e->io_sent += (long long)e->tx_msgs[k].msg_hdr.msg_iovlen;
        at += sent;
    }
    Py_END_ALLOW_THREADS
}

/* Take what waits in the socket, a recvmmsg batch at a time (at most RX_BURST datagrams), each batch
 * followed by the decisions it allows. */
static void drain(Engine *e)
{
    for (int taken = 0; taken < RX_BURST;) {
        int got;
        for (int i = 0; i < RX_BATCH; i++)
            e->rx_msgs[i].msg_hdr.msg_namelen = sizeof(e->rx_from[i]);
        Py_BEGIN_ALLOW_THREADS
        do
            got = recvmmsg(e->fd, e->rx_msgs, RX_BATCH, MSG_DONTWAIT, NULL);
        while (got < 0 && errno == EINTR);
        Py_END_ALLOW_THREADS
        if (got <= 0)
            return;
        e->io_received += got;
        taken += got;
        double now = monotonic_now();
        for (int i = 0; i < got; i++) {
            int copies = 1;
            if (e->loss > 0 || e->duplicate > 0) {
                if (uniform(e) < e->loss) {
                    e->dropped_in++;
                    continue;
                }
                if (uniform(e) < e->duplicate && core_from_switch(&e->core, &e->rx_from[i])) {
                    e->duplicated_in++;
                    copies = 2;
                }
            }
            for (int k = 0; k < copies; k++)
                core_result(&e->core, now, e->rx[i], (Py_ssize_t)e->rx_msgs[i].msg_len, &e->rx_from[i]);
        }
        core_decide(&e->core, now, 0);  /* new packets at once; losses only once the socket is empty */
        send_out(e);
        if (got < RX_BATCH)
            return;
    }
}

/*
 * One turn of the stream's I/O loop: take the results already waiting (a process that was off the CPU
 * must not fire timers for packets whose results sit unread in its socket), decide and send what is due,
 * sleep until a result, a wake-up on wake_fd or the next timer (at most max_wait s), and take results
 * again. Returns the segments completed.
 */
static PyObject *Engine_pump(Engine *e, PyObject *args)
{
    int wake_fd;
    double max_wait;
    if (!PyArg_ParseTuple(args, "id", &wake_fd, &max_wait))
        return NULL;
    if (!e->core.have_switch) {
        PyErr_SetString(PyExc_RuntimeError, "pump() before set_switch()");
        return NULL;
    }
    PyObject *completed = PyList_New(0);
    if (completed == NULL)
        return NULL;
    drain(e);
    double now = monotonic_now();
    core_decide(&e->core, now, 1);
    send_out(e);
    double wakeup = core_next_wakeup(&e->core), wait = max_wait;
    if (e->core.n_done)
        wait = 0;  /* a segment is done: hand it up before sleeping */
    else if (wakeup >= 0 && wakeup - now < wait)
        wait = wakeup - now > 0 ? wakeup - now : 0;
    struct pollfd fds[2] = {{.fd = e->fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
    int ready;
    Py_BEGIN_ALLOW_THREADS
    ready = poll(fds, 2, (int)ceil(wait * 1000.0));
    if (ready > 0 && (fds[1].revents & POLLIN)) {
        char sink[256];
        while (read(wake_fd, sink, sizeof(sink)) > 0) {
        }
    }
    Py_END_ALLOW_THREADS
    if (ready > 0 && (fds[0].revents & POLLIN)) {
        drain(e);
        core_decide(&e->core, monotonic_now(), 1);
        send_out(e);
    }
    if (take_completed(&e->core, completed) == NULL) {
        Py_DECREF(completed);
        return NULL;
    }
    return completed;
}

static PyObject *Engine_next_wakeup(Engine *e, PyObject *unused)
{
    double wakeup = core_next_wakeup(&e->core);
    if (wakeup < 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(wakeup);
}

static PyObject *Engine_stats(Engine *e, PyObject *unused)
{
    Core *c = &e->core;
    return Py_BuildValue(
        "{sLsLsLsLsLsLsLsLsLsL}", "packets_sent", c->packets_sent, "retransmissions",
        c->fast_retransmissions + c->timer_retransmissions, "fast_retransmissions", c->fast_retransmissions,
        "timer_retransmissions", c->timer_retransmissions, "spurious_retransmissions",
        c->spurious_retransmissions, "results", c->results, "duplicate_results",
        c->duplicate_results, "stale_results", c->stale_results, "partial_results", c->partial_results,
        "foreign_packets", c->foreign_packets);
}

static PyObject *Engine_io_counters(Engine *e, PyObject *unused)
{
    return Py_BuildValue("{sLsLsLsLsLsL}", "sent", e->io_sent, "received", e->io_received, "dropped_out",
                         e->dropped_out, "dropped_in", e->dropped_in, "duplicated_out", e->duplicated_out,
                         "duplicated_in", e->duplicated_in);
}

static PyObject *Engine_rtt(Engine *e, PyObject *unused)
{
    Core *c = &e->core;
    if (!c->have_srtt)
        return Py_BuildValue("(Odd)", Py_None, c->rttvar, c->rto);
    return Py_BuildValue("(ddd)", c->srtt, c->rttvar, c->rto);
}

static PyObject *Engine_window(Engine *e, PyObject *unused)
{
    return Py_BuildValue("(dLd)", e->core.wsize, e->core.decreases, e->core.min_rtt);
}

static PyObject *Engine_stalled(Engine *e, PyObject *unused)
{
    Core *c = &e->core;
    if (!c->stalled)
        Py_RETURN_NONE;
    return Py_BuildValue("(LLd)", c->stall_position, c->stall_sends, c->stall_age);
}

static PyObject *Engine_get_next_free(Engine *e, void *unused) { return PyLong_FromLongLong(e->core.next_free); }
static PyObject *Engine_get_low(Engine *e, void *unused) { return PyLong_FromLongLong(e->core.low); }

static PyMethodDef Engine_methods[] = {
    {"set_switch", (PyCFunction)Engine_set_switch, METH_VARARGS, NULL},
    {"add", (PyCFunction)Engine_add, METH_VARARGS, NULL},
    {"restart", (PyCFunction)Engine_restart, METH_VARARGS, NULL},
    {"step", (PyCFunction)Engine_step, METH_VARARGS, NULL},
    {"pump", (PyCFunction)Engine_pump, METH_VARARGS, NULL},
    {"next_wakeup", (PyCFunction)Engine_next_wakeup, METH_NOARGS, NULL},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, NULL},
    {"io_counters", (PyCFunction)Engine_io_counters, METH_NOARGS, NULL},
    {"rtt", (PyCFunction)Engine_rtt, METH_NOARGS, NULL},
    {"window", (PyCFunction)Engine_window, METH_NOARGS, NULL},
    {"stalled", (PyCFunction)Engine_stalled, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"next_free", (getter)Engine_get_next_free, NULL, NULL, NULL},
    {"low", (getter)Engine_get_low, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "host_agent.transport._engine.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};

static PyObject *configure(PyObject *module, PyObject *constants)
{
    return core_configure(constants);
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_O, "The constants shared with the Python reference (a dict)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_engine", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__engine(void)
{
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(module, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
