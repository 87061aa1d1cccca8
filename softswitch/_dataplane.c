/*
 * softswitch's native data plane: the per-packet semantics of softswitch/pipeline.py in C, over whole
 * bursts (recvmmsg in, sendmmsg out per port), on the very state the P4Runtime server reads and writes.
 *
 * Dataplane(pipeline, layout, actions)
 *     Binds a softswitch.pipeline.Pipeline: its numpy registers and counters through the buffer protocol
 *     (held for the engine's life; Pipeline.reset fills them in place), its tables and PRE by reference.
 *     `layout` is the dict softswitch/native.py builds from the project's constants (every offset, width
 *     and code); `actions` maps set_job, admit_worker, set_uplink, route, set_port, set_replica_dst to
 *     P4Info names.
 * inject(frame, ingress_port) -> [(port, bytes), ...]
 *     One frame through the pipeline, every copy it sends (Pipeline.inject's contract); for tests.
 * attach_udp(number, fd, template) / attach_raw(number, fd)
 *     A port's socket (owned by the caller's UdpPort or RawPort) and, for UDP, its synthesized headers.
 * burst(number) -> frames processed
 *     One recvmmsg on the port, every frame through the pipeline, copies queued on their ports. The
 *     caller holds the switch lock: tables are read with the GIL held, as the Python data plane does.
 * flush()
 *     Every port's queue out with one sendmmsg each (call it outside the lock).
 * set_capture(records, inbound, outbound) / set_capture(None)
 *     While records is a list, burst appends (inbound, port, frame) for every frame it receives (before
 *     the pipeline rewrites it) and (outbound, port, frame) for every frame it queues on a port.
 *
 * Files: dataplane_pipeline.c (the v1model program), dataplane_slots.c (its @atomic block),
 * dataplane_tables.c (table lookups), dataplane_io.c (ports, bursts, sends through
 * lhc_ina/udp_batch.c), this one (the type).
 */
#include "dataplane.h"

#include <errno.h>
#include <structmember.h>

#include "../lhc_ina/udp_python.h"
#include <string.h>

static int parse_layout(PyObject *dict, Layout *L)
{
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "layout must be a dict");
        return -1;
    }
#define LAYOUT_READ(name)                                                                              \
    {                                                                                                  \
        PyObject *value = PyDict_GetItemString(dict, #name);                                           \
        if (value == NULL) {                                                                           \
            PyErr_SetString(PyExc_KeyError, "layout lacks " #name);                                    \
            return -1;                                                                                 \
        }                                                                                              \
        L->name = PyLong_AsLong(value);                                                                \
        if (L->name == -1 && PyErr_Occurred())                                                         \
            return -1;                                                                                 \
    }
    LAYOUT_FIELDS(LAYOUT_READ)
#undef LAYOUT_READ
    return 0;
}

/* A register or counter array: writable, contiguous, of the element size the C code uses. */
static int get_array(PyObject *pipeline, const char *name, Py_buffer *view, Py_ssize_t itemsize)
{
    PyObject *array = PyObject_GetAttrString(pipeline, name);
    if (array == NULL)
        return -1;
    int status = PyObject_GetBuffer(array, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
    Py_DECREF(array);
    if (status < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "pipeline.%s has %zd-byte elements, the native pipeline needs %zd", name,
                     view->itemsize, itemsize);
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 0;
}

static int dataplane_init(Dataplane *e, PyObject *args, PyObject *kwargs)
{
    PyObject *pipeline, *layout, *actions;
    static char *keywords[] = {"pipeline", "layout", "actions", NULL};
    if (e->pipeline != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Dataplane is initialized once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!", keywords, &pipeline, &PyDict_Type, &layout,
                                     &PyDict_Type, &actions))
        return -1;
    if (parse_layout(layout, &e->L) < 0)
        return -1;
    e->pipeline = Py_NewRef(pipeline);
    struct { PyObject **slot; PyObject *owner; const char *name; int by_key; } want[] = {
        {&e->jobs_table, pipeline, "jobs", 0}, {&e->workers_table, pipeline, "workers", 0},
        {&e->uplinks_table, pipeline, "uplinks", 0}, {&e->name_set_uplink, actions, "set_uplink", 1},
        {&e->l2_table, pipeline, "l2_forward", 0}, {&e->replicas_table, pipeline, "replicas", 0},
        {&e->lpm_table, pipeline, "ipv4_routes", 0}, {&e->pre, pipeline, "pre", 0},
        {&e->name_set_job, actions, "set_job", 1}, {&e->name_admit_worker, actions, "admit_worker", 1},
        {&e->name_route, actions, "route", 1}, {&e->name_set_port, actions, "set_port", 1},
        {&e->name_set_replica_dst, actions, "set_replica_dst", 1},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (want[i].by_key) {
            *want[i].slot = Py_XNewRef(PyDict_GetItemString(want[i].owner, want[i].name));
            if (*want[i].slot == NULL)
                PyErr_Format(PyExc_KeyError, "actions lacks %s", want[i].name);
        } else {
            *want[i].slot = PyObject_GetAttrString(want[i].owner, want[i].name);
        }
        if (*want[i].slot == NULL)
            return -1;
    }
    if (get_array(pipeline, "slot_epoch", &e->epoch, 2) < 0 || get_array(pipeline, "slot_round", &e->round, 4) < 0
        || get_array(pipeline, "slot_bitmap", &e->bitmap, 4) < 0
        || get_array(pipeline, "slot_remaining", &e->remaining, 1) < 0
        || get_array(pipeline, "slot_values", &e->values, 4) < 0
        || get_array(pipeline, "stats_packets", &e->stat_packets, 8) < 0
        || get_array(pipeline, "stats_bytes", &e->stat_bytes, 8) < 0)
        return -1;
    e->cells = e->epoch.len / 2;
    e->max_slots = e->cells / e->L.slot_copies;
    e->stat_cells = e->stat_packets.len / 8;
    if (e->round.len != e->cells * 4 || e->bitmap.len != e->cells * 4 || e->remaining.len != e->cells
        || e->values.len != e->cells * e->L.lanes * 4 || e->stat_bytes.len != e->stat_packets.len
        || e->L.lane_bytes != 4) {
        PyErr_SetString(PyExc_ValueError, "the pipeline's registers and counters disagree on their sizes");
        return -1;
    }
    e->last_error = Py_NewRef(Py_None);
    return io_setup(e);
}

static void dataplane_dealloc(Dataplane *e)
{
    Py_buffer *views[] = {&e->epoch, &e->round, &e->bitmap, &e->remaining, &e->values, &e->stat_packets,
                          &e->stat_bytes};
    for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++)
        if (views[i]->obj != NULL)
            PyBuffer_Release(views[i]);
    snapshot_drop(e);
    Py_CLEAR(e->pipeline); Py_CLEAR(e->jobs_table); Py_CLEAR(e->workers_table); Py_CLEAR(e->l2_table);
    Py_CLEAR(e->replicas_table); Py_CLEAR(e->lpm_table); Py_CLEAR(e->pre); Py_CLEAR(e->name_set_job);
    Py_CLEAR(e->name_admit_worker); Py_CLEAR(e->name_route); Py_CLEAR(e->name_set_port);
    Py_CLEAR(e->name_set_replica_dst); Py_CLEAR(e->uplinks_table); Py_CLEAR(e->name_set_uplink);
    Py_CLEAR(e->last_error); Py_CLEAR(e->capture);
    io_free(e);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int ready(Dataplane *e)
{
    if (e->rx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Dataplane is not initialized");
        return -1;
    }
    return 0;
}

static PyObject *dataplane_inject(Dataplane *e, PyObject *args)
{
    Py_buffer frame;
    long ingress_port;
    if (ready(e) < 0 || !PyArg_ParseTuple(args, "y*l", &frame, &ingress_port))
        return NULL;
    PyObject *out = NULL;
    if (frame.len > e->L.rx_bytes) {
        PyErr_Format(PyExc_ValueError, "frame of %zd bytes exceeds the receive buffer (%ld)", frame.len,
                     e->L.rx_bytes);
    } else if (snapshot_take(e) == 0) {
        memcpy(e->rx, frame.buf, (size_t)frame.len);
        out = PyList_New(0);
        Sink sink = {out};
        if (out != NULL && process_frame(e, e->rx, frame.len, ingress_port, &sink) < 0)
            Py_CLEAR(out);
        snapshot_drop(e);
    }
    PyBuffer_Release(&frame);
    return out;
}

static PyObject *attach(Dataplane *e, PyObject *args, int kind)
{
    int number, fd;
    Py_buffer template = {0};
    if (ready(e) < 0)
        return NULL;
    if (kind == PORT_UDP ? !PyArg_ParseTuple(args, "iiy*", &number, &fd, &template)
                         : !PyArg_ParseTuple(args, "ii", &number, &fd))
        return NULL;
    int status;
    if (kind == PORT_UDP && template.len != e->L.frame_lhc) {
        PyErr_Format(PyExc_ValueError, "a UDP port's template has %zd bytes, not %ld", template.len,
                     e->L.frame_lhc);
        status = -1;
    } else {
        status = port_attach(e, number, fd, kind, template.buf);
    }
    if (template.obj != NULL)
        PyBuffer_Release(&template);
    return status < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *dataplane_attach_udp(Dataplane *e, PyObject *args) { return attach(e, args, PORT_UDP); }
static PyObject *dataplane_attach_raw(Dataplane *e, PyObject *args) { return attach(e, args, PORT_RAW); }

static PyObject *dataplane_burst(Dataplane *e, PyObject *arg)
{
    long number = PyLong_AsLong(arg);
    if (ready(e) < 0 || (number == -1 && PyErr_Occurred()))
        return NULL;
    if (number < 0 || number > e->L.max_port || e->port_index[number] < 0)
        return PyErr_Format(PyExc_ValueError, "no port %ld is attached", number);
    Port *port = &e->ports[e->port_index[number]];
    if (snapshot_take(e) < 0)
        return NULL;
    int error;
    Py_ssize_t received = burst_receive(e, port, &error), processed = 0;
    if (received < 0) {
        snapshot_drop(e);
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Sink sink = {NULL};
    for (Py_ssize_t i = 0; i < received; i++) {
        Py_ssize_t length = e->rx_messages[i].msg_len;
        if (length == 0)
            continue;
        processed++;
        port->frames_in++;
        uint8_t *frame = e->rx + i * e->L.rx_bytes;
        if ((e->capture != NULL && capture_frame(e, e->capture_in, number, frame, length) < 0)
            || process_frame(e, frame, length, number, &sink) < 0) {
            /* a broken table entry costs this frame, not the burst: keep the error for the caller's log */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            Py_XSETREF(e->last_error, value ? value : Py_NewRef(Py_None));
            Py_XDECREF(type);
            Py_XDECREF(traceback);
            e->errors++;
        }
    }
    snapshot_drop(e);
    return PyLong_FromSsize_t(processed);
}

/* Python twin: DataPlane._flush_ports (softswitch/receive_loop.py). */
static PyObject *dataplane_flush(Dataplane *e, PyObject *Py_UNUSED(ignored))
{
    if (ready(e) < 0)
        return NULL;
    int error = flush_all(e);
    if (e->pending_error) /* the first error of the burst: a flush within it met it */
        error = e->pending_error;
    e->pending_error = 0;
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* Called by NativePipeline.set_capture; the Python pipeline's twin is DataPlane._captured
 * (softswitch/receive_loop.py), which records the same (direction, port, frame) tuples. */
static PyObject *dataplane_set_capture(Dataplane *e, PyObject *args)
{
    PyObject *records;
    long inbound = 0, outbound = 0;
    if (!PyArg_ParseTuple(args, "O|ll", &records, &inbound, &outbound))
        return NULL;
    if (records != Py_None && !PyList_Check(records))
        return PyErr_Format(PyExc_TypeError, "set_capture takes a list or None, not %s",
                            Py_TYPE(records)->tp_name);
    Py_XSETREF(e->capture, records == Py_None ? NULL : Py_NewRef(records));
    e->capture_in = inbound;
    e->capture_out = outbound;
    Py_RETURN_NONE;
}

static PyObject *dataplane_port_counters(Dataplane *e, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyDict_New();
    for (Py_ssize_t i = 0; out != NULL && i < e->n_ports; i++) {
        Port *p = &e->ports[i];
        PyObject *key = PyLong_FromLong(p->number);
        PyObject *value = Py_BuildValue("{sKsKsKsN}", "frames_in", p->frames_in, "dropped_non_udp",
                                        p->dropped_non_udp, "send_errors", p->sender.dropped,
                                        "send_errors_by_errno", udp_drops_by_errno(&p->sender));
        if (key == NULL || value == NULL || PyDict_SetItem(out, key, value) < 0)
            Py_CLEAR(out);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    return out;
}

static PyMethodDef dataplane_methods[] = {
    {"inject", (PyCFunction)dataplane_inject, METH_VARARGS,
     "inject(frame, ingress_port) -> [(port, bytes)]: one frame through the pipeline"},
    {"attach_udp", (PyCFunction)dataplane_attach_udp, METH_VARARGS,
     "attach_udp(number, fd, template): a UDP port and its synthesized headers"},
    {"attach_raw", (PyCFunction)dataplane_attach_raw, METH_VARARGS, "attach_raw(number, fd): an AF_PACKET port"},
    {"burst", (PyCFunction)dataplane_burst, METH_O,
     "burst(number) -> frames processed: one recvmmsg on the port through the pipeline (hold the lock)"},
    {"flush", (PyCFunction)dataplane_flush, METH_NOARGS, "flush(): every port's queue out, one sendmmsg each"},
    {"set_capture", (PyCFunction)dataplane_set_capture, METH_VARARGS,
     "set_capture(records, inbound, outbound): burst appends (direction, port, frame) per frame in and out"},
    {"port_counters", (PyCFunction)dataplane_port_counters, METH_NOARGS,
     "port_counters() -> {port: {frames_in, dropped_non_udp, send_errors, send_errors_by_errno}}"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef dataplane_members[] = {
    {"errors", T_ULONGLONG, offsetof(Dataplane, errors), READONLY, "frames that raised (a broken table entry)"},
    {"last_error", T_OBJECT, offsetof(Dataplane, last_error), READONLY, "the last such frame's exception"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DataplaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "softswitch._dataplane.Dataplane",
    .tp_basicsize = sizeof(Dataplane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The lhc v1model pipeline in C over a softswitch Pipeline's state (see the module doc).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)dataplane_init,
    .tp_dealloc = (destructor)dataplane_dealloc,
    .tp_methods = dataplane_methods,
    .tp_members = dataplane_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dataplane", "softswitch's data plane in C: the lhc v1model pipeline over bursts.",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__dataplane(void)
{
    if (PyType_Ready(&DataplaneType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Dataplane", (PyObject *)&DataplaneType) < 0)
        Py_CLEAR(m);
    return m;
}
