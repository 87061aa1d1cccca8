/*
 * The per-packet engine of a worker's stream, in C: the state machine of host_agent/transport/engine_core.py
 * (the reference; read its docstring first) plus the socket work around it.
 *
 * Why: in Python every packet cost a dict lookup, a struct unpack, a numpy slice and a timer scan, and a
 * worker moved ~185k datagrams/s at best. Here a pump is one recvmmsg and one sendmmsg per batch of up to
 * 64 datagrams, with the GIL released while the kernel works, and the per-packet work a few loads and
 * stores. The Python stream above still owns messages, futures and epoch changes; it hands segments in
 * and gets whole segments back.
 *
 * PacketEngine(fd, job_id, rank, epoch, slot_count, result_mask, timeout_s, loss, duplicate, seed, gso, loss_burst)
 *   .set_switch(host, port)          where results must come from, and where packets go
 *   .add(ident, first, raw, result)  a segment: raw = its packets' bytes, result = writable uint32 buffer
 *   .restart(epoch)                  everything starts over at position 0 (the window and RTT stay)
 *   .step(now, [(bytes, (host, port))], recover=True) -> ([bytes to send], [(ident, started)])  (no I/O)
 *   .pump(wake_fd, max_wait) -> [(ident, started)]   one turn of the I/O loop (see pump() below)
 *   .next_wakeup(), .stats(), .rtt(), .window(), .stalled(), .io_counters(), .next_free, .low
 * configure(constants): the constants shared with the reference (host_agent/transport/engine_io.py).
 *
 * The arithmetic on doubles is written in the reference's order, so that both take the same decisions
 * from the same inputs (tests/test_engine_differential.py compares them bit for bit).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "engine.h"

/* Whether a call may change the engine now: not while a pump of another thread works on its buffers, core
 * and scratch without the GIL (as _udp.Sender's take_sender); else RuntimeError. No Python twin: the
 * reference engine changes its state only with the GIL held. */
static int idle(PacketEngine *e)
{
    if (e->busy)
        PyErr_SetString(PyExc_RuntimeError, "this PacketEngine is in use by another thread's pump (one call at a "
                        "time)");
    return !e->busy;
}

static int PacketEngine_init(PacketEngine *e, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"fd", "job_id", "rank", "epoch", "slot_count", "result_mask", "timeout_s",
                            "loss", "duplicate", "seed", "gso", "loss_burst", NULL};
    unsigned job_id, rank, epoch, slot_count, result_mask;
    unsigned long long seed;
    double timeout_s;
    int gso = 1;
    if (!idle(e))
        return -1;
    e->loss_burst = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iIIIIIdddK|pL", names, &e->fd, &job_id, &rank, &epoch,
                                     &slot_count, &result_mask, &timeout_s, &e->loss, &e->duplicate, &seed,
                                     &gso, &e->loss_burst))
        return -1;
    if (!engine_configured) {
        PyErr_SetString(PyExc_RuntimeError, "_engine.configure() was not called");
        return -1;
    }
    /* a send holds every packet of the window and one more, each possibly doubled by the impairment: that
       count, 2 * (slot_count + 1), must fit one udp_batch.c flush (checked here, before it is formed) */
    unsigned slots_max = UDP_RUNS_CAPACITY_MAX / 2 - 1;
    if (slot_count < 1 || slot_count > slots_max || result_mask == 0 || e->loss_burst < 1) {
        PyErr_Format(PyExc_ValueError, "slot_count %u (1..%u: a window one send holds), result_mask %#x (not 0) "
                     "and loss_burst %lld (>= 1) are not all valid", slot_count, slots_max, result_mask,
                     e->loss_burst);
        return -1;
    }
    e->rng = seed;
    e->error = 0;
    e->run_out = e->run_in = (LossRun){0, 0};
    UdpLimits limits = {.segments_max = engine_constants.gso_segments,
                        .refusals_max = engine_constants.gso_refusals, .bytes_max = engine_constants.gso_bytes};
    udp_sender_init(&e->sender, &limits, gso);
    free(e->tx_iov);
    udp_runs_free(&e->runs);
    int32_t sends_max = 2 * ((int32_t)slot_count + 1);
    e->tx_iov = calloc((size_t)sends_max, sizeof(*e->tx_iov));
    if (e->tx_iov == NULL || udp_runs_init(&e->runs, sends_max, 0) < 0 ||
        core_init(&e->core, job_id, rank, epoch, slot_count, result_mask) < 0) {
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

static void PacketEngine_dealloc(PacketEngine *e)
{
    core_free(&e->core);
    free(e->tx_iov);
    udp_runs_free(&e->runs);
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

static PyObject *PacketEngine_set_switch(PacketEngine *e, PyObject *args)
{
    const char *host;
    int port;
    if (!idle(e) || !PyArg_ParseTuple(args, "si", &host, &port) || parse_address(host, port, &e->core.sw) < 0)
        return NULL;
    e->core.have_switch = 1;
    Py_RETURN_NONE;
}

static PyObject *PacketEngine_add(PacketEngine *e, PyObject *args)
{
    long long ident, first;
    PyObject *raw, *result;
    if (!idle(e) || !PyArg_ParseTuple(args, "LLOO", &ident, &first, &raw, &result))
        return NULL;
    Segment s = {.ident = ident, .first = first, .started = -1.0};
    if (PyObject_GetBuffer(raw, &s.raw, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(result, &s.result, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&s.raw);
        return NULL;
    }
    s.count = s.raw.len / engine_constants.packet_bytes;
    s.missing = s.count;
    if (first != e->core.next_free || s.count * engine_constants.packet_bytes != s.raw.len ||
        s.result.len != s.count * engine_constants.lanes * 4) {
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

static PyObject *PacketEngine_restart(PacketEngine *e, PyObject *args)
{
    unsigned epoch;
    if (!idle(e) || !PyArg_ParseTuple(args, "I", &epoch))
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

static PyObject *PacketEngine_step(PacketEngine *e, PyObject *args)
{
    double now;
    PyObject *datagrams;
    int recover = 1;
    if (!idle(e) || !PyArg_ParseTuple(args, "dO!|p", &now, &PyList_Type, &datagrams, &recover))
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
        PyObject *packet = PyBytes_FromStringAndSize((const char *)e->core.out[i], engine_constants.packet_bytes);
        if (packet == NULL || PyList_Append(out, packet) < 0) {
            Py_XDECREF(packet);
            goto fail;
        }
        Py_DECREF(packet);
    }
    e->core.n_out = 0;
    return Py_BuildValue("(NN)", out, completed);
fail:
    e->core.n_out = 0; /* the packets are lost with the list; the next decide starts an empty one */
    Py_XDECREF(out);
    Py_XDECREF(completed);
    return NULL;
}

/*
 * One turn of the stream's I/O loop: take the results already waiting (a process that was off the CPU
 * must not fire timers for packets whose results sit unread in its socket), decide and send what is due,
 * sleep until a result, a wake-up on wake_fd or the next timer (at most max_wait s), and take results
 * again. Returns the segments completed. Python twin: engine_io.py's ChannelEngine.pump (PacketEngine_pump
 * below only guards it).
 */
static PyObject *pump_turn(PacketEngine *e, int wake_fd, double max_wait)
{
    PyObject *completed = PyList_New(0);
    if (completed == NULL)
        return NULL;
    drain(e);
    double now = monotonic_now();
    core_decide(&e->core, now, 1);
    send_out(e);
    if (e->error) {
        Py_DECREF(completed);
        return socket_error(e);
    }
    double wakeup = core_next_wakeup(&e->core), wait = max_wait;
    if (e->core.n_done)
        wait = 0;  /* a segment is done: hand it up before sleeping */
    else if (wakeup >= 0 && wakeup - now < wait)
        wait = wakeup - now > 0 ? wakeup - now : 0;
    int readable = wait_for_io(e, wake_fd, wait);
    if (readable) {
        drain(e);
        core_decide(&e->core, monotonic_now(), 1);
        send_out(e);
    }
    if (e->error) {
        Py_DECREF(completed);
        return socket_error(e);
    }
    if (take_completed(&e->core, completed) == NULL) {
        Py_DECREF(completed);
        return NULL;
    }
    return completed;
}

static PyObject *PacketEngine_pump(PacketEngine *e, PyObject *args)
{
    int wake_fd;
    double max_wait;
    if (!idle(e) || !PyArg_ParseTuple(args, "id", &wake_fd, &max_wait))
        return NULL;
    if (!e->core.have_switch) {
        PyErr_SetString(PyExc_RuntimeError, "pump() before set_switch()");
        return NULL;
    }
    if (e->error)
        return socket_error(e);
    e->busy = 1;
    PyObject *completed = pump_turn(e, wake_fd, max_wait);
    e->busy = 0;
    return completed;
}

static PyObject *PacketEngine_next_wakeup(PacketEngine *e, PyObject *unused)
{
    double wakeup = core_next_wakeup(&e->core);
    if (wakeup < 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(wakeup);
}

static PyObject *PacketEngine_stats(PacketEngine *e, PyObject *unused)
{
    Core *c = &e->core;
    return Py_BuildValue(
        "{sLsLsLsLsLsLsLsLsLsL}", "packets_sent", c->packets_sent, "retransmissions",
        c->fast_retransmissions + c->timer_retransmissions + c->tail_probes, "fast_retransmissions",
        c->fast_retransmissions, "timer_retransmissions", c->timer_retransmissions, "tail_probes", c->tail_probes,
        "results", c->results, "duplicate_results",
        c->duplicate_results, "stale_results", c->stale_results, "partial_results", c->partial_results,
        "foreign_packets", c->foreign_packets);
}

static PyObject *PacketEngine_io_counters(PacketEngine *e, PyObject *unused)
{
    return Py_BuildValue("{sLsLsLsLsLsL}", "sent", e->io_sent, "received", e->io_received, "dropped_out",
                         e->dropped_out, "dropped_in", e->dropped_in, "duplicated_out", e->duplicated_out,
                         "duplicated_in", e->duplicated_in);
}

static PyObject *PacketEngine_rtt(PacketEngine *e, PyObject *unused)
{
    Core *c = &e->core;
    if (!c->have_srtt)
        return Py_BuildValue("(Odd)", Py_None, c->rttvar, c->rto);
    return Py_BuildValue("(ddd)", c->srtt, c->rttvar, c->rto);
}

static PyObject *PacketEngine_window(PacketEngine *e, PyObject *unused)
{
    return Py_BuildValue("(dLd)", e->core.wsize, e->core.decreases, e->core.min_rtt);
}

static PyObject *PacketEngine_stalled(PacketEngine *e, PyObject *unused)
{
    Core *c = &e->core;
    if (!c->stalled)
        Py_RETURN_NONE;
    return Py_BuildValue("(LLd)", c->stall_position, c->stall_sends, c->stall_age);
}

static PyObject *PacketEngine_get_next_free(PacketEngine *e, void *unused) { return PyLong_FromLongLong(e->core.next_free); }
static PyObject *PacketEngine_get_low(PacketEngine *e, void *unused) { return PyLong_FromLongLong(e->core.low); }

static PyMethodDef PacketEngine_methods[] = {
    {"set_switch", (PyCFunction)PacketEngine_set_switch, METH_VARARGS, NULL},
    {"add", (PyCFunction)PacketEngine_add, METH_VARARGS, NULL},
    {"restart", (PyCFunction)PacketEngine_restart, METH_VARARGS, NULL},
    {"step", (PyCFunction)PacketEngine_step, METH_VARARGS, NULL},
    {"pump", (PyCFunction)PacketEngine_pump, METH_VARARGS, NULL},
    {"next_wakeup", (PyCFunction)PacketEngine_next_wakeup, METH_NOARGS, NULL},
    {"stats", (PyCFunction)PacketEngine_stats, METH_NOARGS, NULL},
    {"io_counters", (PyCFunction)PacketEngine_io_counters, METH_NOARGS, NULL},
    {"rtt", (PyCFunction)PacketEngine_rtt, METH_NOARGS, NULL},
    {"window", (PyCFunction)PacketEngine_window, METH_NOARGS, NULL},
    {"stalled", (PyCFunction)PacketEngine_stalled, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PacketEngine_getset[] = {
    {"next_free", (getter)PacketEngine_get_next_free, NULL, NULL, NULL},
    {"low", (getter)PacketEngine_get_low, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PacketEngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "host_agent.transport._engine.PacketEngine",
    .tp_basicsize = sizeof(PacketEngine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PacketEngine_init,
    .tp_dealloc = (destructor)PacketEngine_dealloc,
    .tp_methods = PacketEngine_methods,
    .tp_getset = PacketEngine_getset,
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
    if (PyType_Ready(&PacketEngineType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&PacketEngineType);
    if (PyModule_AddObject(module, "PacketEngine", (PyObject *)&PacketEngineType) < 0) {
        Py_DECREF(&PacketEngineType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
