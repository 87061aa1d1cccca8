/*
 * lhc_ina._udp.Planner: the run planning of udp_batch.c (grouping per destination, GSO runs) without a
 * socket, for tests/test_udp_batch.py's properties (every datagram once, to its own destination, in
 * order, across flushes that reuse the table). Part of the _udp extension (_udp.c registers the type).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "udp_batch.h"

/* Planner(capacity, slots=0, segments_max, bytes_max): udp_batch.c's run planning without a socket, its
 * table kept from one plan to the next as a sending port's is, for the property tests. */
typedef struct {
    PyObject_HEAD
    UdpRuns runs;
    UdpLimits limits;
} Planner;

static int Planner_init(Planner *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"capacity", "slots", "segments_max", "bytes_max", NULL};
    int capacity, slots = 0;
    self->limits.refusals_max = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiil", names, &capacity, &slots, &self->limits.segments_max,
                                     &self->limits.bytes_max))
        return -1;
    udp_runs_free(&self->runs);
    int status = capacity < 1 || capacity > UDP_MAX_PER_CALL ? -2 : udp_runs_init(&self->runs, capacity, slots);
    if (status == -1)
        PyErr_NoMemory();
    else if (status == -2)
        PyErr_Format(PyExc_ValueError, "capacity %d (1..%d) or table slots %d (0, or a power of two of at least "
                     "twice the capacity) is not valid", capacity, UDP_MAX_PER_CALL, slots);
    return status < 0 ? -1 : 0;
}

static void Planner_dealloc(Planner *self)
{
    udp_runs_free(&self->runs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Destination i as a sockaddr from its 6 bytes (address and port in network order). */
static int destination_at(PyObject *sequence, Py_ssize_t i, struct sockaddr_in *to)
{
    Py_buffer view;
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, i), &view, PyBUF_SIMPLE) < 0)
        return -1;
    int ok = view.len == 6;
    if (ok) {
        memset(to, 0, sizeof(*to));
        to->sin_family = AF_INET;
        memcpy(&to->sin_addr, view.buf, 4);
        memcpy(&to->sin_port, (const char *)view.buf + 4, 2);
    } else {
        PyErr_Format(PyExc_ValueError, "destination %zd has %zd bytes, not 6", i, view.len);
    }
    PyBuffer_Release(&view);
    return ok ? 0 : -1;
}

/* plan(sizes, destinations, gso=True) -> [(destination index, [datagram indices])], one entry a message. */
static PyObject *Planner_plan(Planner *self, PyObject *args)
{
    PyObject *sizes, *destinations, *sequence, *result = NULL;
    int gso = 1;
    if (!PyArg_ParseTuple(args, "OO|p", &sizes, &destinations, &gso))
        return NULL;
    if ((sequence = PySequence_Fast(destinations, "destinations must be a sequence")) == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
    struct sockaddr_in *to = PyMem_Calloc(n ? n : 1, sizeof(*to));
    struct iovec *iov = PyMem_Calloc(n ? n : 1, sizeof(*iov));
    static char base[1]; /* iov_base = base + i tags datagram i; nothing is read through it */
    if (to == NULL || iov == NULL || n > self->runs.capacity || PyObject_Length(sizes) != n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd destinations need as many sizes and at most %d", n,
                         self->runs.capacity);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(sizes, i);
        long size = item ? PyLong_AsLong(item) : -1;
        Py_XDECREF(item);
        if (size < 0 || destination_at(sequence, i, &to[i]) < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "size %zd is negative", i);
            goto done;
        }
        iov[i].iov_base = base + i, iov[i].iov_len = (size_t)size;
    }
    UdpSender sender;
    udp_sender_init(&sender, &self->limits, gso);
    int32_t messages = udp_runs_build(&self->runs, iov, to, 1, (int32_t)n, &sender);
    result = PyList_New(messages);
    for (int32_t m = 0; result != NULL && m < messages; m++) {
        const struct msghdr *header = &self->runs.messages[m].msg_hdr;
        PyObject *indices = PyList_New((Py_ssize_t)header->msg_iovlen);
        for (size_t k = 0; indices != NULL && k < header->msg_iovlen; k++)
            PyList_SET_ITEM(indices, k, PyLong_FromSsize_t((char *)header->msg_iov[k].iov_base - base));
        PyObject *entry = indices ? Py_BuildValue("(nN)", (const struct sockaddr_in *)header->msg_name - to,
                                                  indices) : NULL;
        if (entry == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, m, entry);
    }
done:
    PyMem_Free(to);
    PyMem_Free(iov);
    Py_DECREF(sequence);
    return result;
}

static PyObject *Planner_home(Planner *self, PyObject *destination)
{
    PyObject *one = PyTuple_Pack(1, destination);
    struct sockaddr_in to;
    int status = one ? destination_at(one, 0, &to) : -1;
    Py_XDECREF(one);
    return status < 0 ? NULL : PyLong_FromUnsignedLong(udp_runs_home(&self->runs, &to));
}

static PyMethodDef Planner_methods[] = {
    {"plan", (PyCFunction)Planner_plan, METH_VARARGS,
     "plan(sizes, destinations, gso=True) -> [(destination index, [datagram indices])]"},
    {"home", (PyCFunction)Planner_home, METH_O, "home(destination) -> the table slot its probe starts at"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PlannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lhc_ina._udp.Planner",
    .tp_doc = "Planner(capacity, slots, segments_max, bytes_max): the run planning of lhc_ina/udp_batch.c",
    .tp_basicsize = sizeof(Planner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Planner_init,
    .tp_dealloc = (destructor)Planner_dealloc,
    .tp_methods = Planner_methods,
};

