/*
 * Batched UDP I/O: sendmmsg and recvmmsg, one system call for many datagrams.
 *
 * The worker's channel sends a window of packets and drains results in bursts; softswitch sends every
 * copy of a result (one per worker). One system call per datagram made the kernel entry, the socket
 * lookup and the Python call the larger part of the per-packet cost. The functions work on a non-blocking
 * IPv4 UDP socket that the caller owns, and release the GIL while the kernel works, so the caller's other
 * threads (the codec, the P4Runtime server) keep running.
 *
 * Sender(segments_max, refusals_max, bytes_max, gso=True, capacity=1024, slots=0): one socket's sends, as
 *   udp_batch.c's runs, its destination table kept from one flush to the next (as a data plane port's is).
 *   .send_batch(fd, datagrams, host, port) -> (sent, failed): every datagram (any buffer) to host:port,
 *     in order. A datagram the kernel refuses (a full socket buffer, "port unreachable", an address it
 *     may not send to) is counted in `failed` and skipped; only an unusable socket raises OSError.
 *   .send_each(fd, datagrams, destinations) -> (sent, failed): datagram i to destinations[i] (6 bytes, the
 *     IPv4 address then the UDP port, in network order, as they lie in the packet's headers).
 *   .plan(sizes, destinations) -> [(destination index, [datagram indices])]: the messages send_each would
 *     send now (the same table, limits and GSO state), without a socket: what the property tests read.
 *   .home(destination) -> the table slot a destination's probe starts at (for tests that force collisions).
 *   .gso, .refusals, .drops ({errno: datagrams dropped for it}, since the sender was made).
 * FATAL_ERRORS: the errnos that make a socket unusable (udp_batch.h's UDP_FATAL_ERRORS); any other is a drop.
 * recv_batch(fd, buffer, slot, capacity) -> [(length, (host, port)), ...]
 *     Up to `capacity` waiting datagrams, datagram i into buffer[i * slot : (i + 1) * slot]; a longer one
 *     arrives cut to `slot` bytes. An empty list when nothing is waiting.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "udp.h"
#include "udp_python.h"

/* A sender: udp_batch.h's GSO state, limits and run scratch, kept per socket by lhc_ina/udp.py's NativeIO.
 * `busy` while a send works without the GIL: the scratch serves one call at a time. */
typedef struct {
    PyObject_HEAD
    UdpSender sender;
    UdpRuns runs;
    int busy;
} Sender;

static int parse_destination(const char *host, int port, struct sockaddr_in *address)
{
    memset(address, 0, sizeof(*address));
    address->sin_family = AF_INET;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port must be in 0..65535, not %d", port);
        return -1;
    }
    address->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &address->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not a dotted IPv4 address: %s", host);
        return -1;
    }
    return 0;
}

static void release_views(Py_buffer *views, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
}

PyObject *udp_raise_errno(int error)
{
    errno = error;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* Take the sender's scratch for this call (the call sets `busy` back to 0), or say why not. */
static int take_sender(Sender *self)
{
    if (self->runs.capacity == 0) {
        PyErr_SetString(PyExc_ValueError, "this Sender was never initialized (Sender.__init__ not run)");
        return 0;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this Sender is in use by another thread (one call at a time)");
        return 0;
    }
    self->busy = 1;
    return 1;
}

/* Send datagrams[i] to addresses[per_datagram ? i : 0], as runs per destination where GSO is on, in
 * chunks of the sender's capacity: (sent, failed), or NULL with OSError when the socket is unusable. */
static PyObject *send_all(Sender *self, int fd, PyObject *datagrams, const struct sockaddr_in *addresses,
                          int per_datagram)
{
    PyObject *sequence = PySequence_Fast(datagrams, "datagrams must be a sequence of buffers");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    PyObject **items = PySequence_Fast_ITEMS(sequence);
    Py_buffer *views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc(count ? count : 1, sizeof(struct iovec));
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (views == NULL || iov == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < count; held++) {
        if (PyObject_GetBuffer(items[held], &views[held], PyBUF_SIMPLE) < 0)
            goto done;
        iov[held].iov_base = views[held].buf;
        iov[held].iov_len = (size_t)views[held].len;
    }
    if (!take_sender(self))
        goto done;
    UdpSender *s = &self->sender;
    UdpRuns *runs = &self->runs;
    unsigned long long sent = s->sent, dropped = s->dropped;
    int error = 0;
    Py_ssize_t at = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; at < count && !error; at += runs->capacity) {
        int32_t n = (int32_t)(count - at < runs->capacity ? count - at : runs->capacity);
        const struct sockaddr_in *to = per_datagram ? addresses + at : addresses;
        error = udp_runs_send(runs, fd, udp_runs_build(runs, iov + at, to, per_datagram, n, s), s);
    }
    if (error && at < count) /* the chunks after an unusable socket's are lost too */
        udp_sender_drop(s, error, (unsigned long long)(count - at));
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (error != 0) {
        udp_raise_errno(error);
        goto done;
    }
    result = Py_BuildValue("(KK)", s->sent - sent, s->dropped - dropped);
done:
    release_views(views, held);
    PyMem_Free(views);
    PyMem_Free(iov);
    Py_DECREF(sequence);
    return result;
}

static PyObject *Sender_send_batch(Sender *self, PyObject *args)
{
    int fd, port;
    const char *host;
    PyObject *datagrams;
    if (!PyArg_ParseTuple(args, "iOsi", &fd, &datagrams, &host, &port))
        return NULL;
    struct sockaddr_in address;
    if (parse_destination(host, port, &address) < 0)
        return NULL;
    return send_all(self, fd, datagrams, &address, 0);
}

/* The `count` destinations of a sequence of 6-byte buffers (the IPv4 address, then the UDP port, in network
 * order, as they lie in a packet's headers) as socket addresses, or NULL with an error set. PyMem_Free it. */
static struct sockaddr_in *read_destinations(PyObject *sequence, Py_ssize_t count)
{
    struct sockaddr_in *addresses = PyMem_Calloc(count ? count : 1, sizeof(struct sockaddr_in));
    if (addresses == NULL)
        return (struct sockaddr_in *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, i), &view, PyBUF_SIMPLE) < 0)
            goto fail;
        int whole = view.len == 6;
        if (whole) {
            addresses[i].sin_family = AF_INET;
            memcpy(&addresses[i].sin_addr, view.buf, 4);
            memcpy(&addresses[i].sin_port, (const char *)view.buf + 4, 2);
        } else {
            PyErr_Format(PyExc_ValueError, "destination %zd has %zd bytes, not 6 (IPv4 address, port)", i,
                         view.len);
        }
        PyBuffer_Release(&view);
        if (!whole)
            goto fail;
    }
    return addresses;
fail:
    PyMem_Free(addresses);
    return NULL;
}

static PyObject *Sender_send_each(Sender *self, PyObject *args)
{
    int fd;
    PyObject *datagrams, *destinations;
    if (!PyArg_ParseTuple(args, "iOO", &fd, &datagrams, &destinations))
        return NULL;
    PyObject *sequence = PySequence_Fast(destinations, "destinations must be a sequence of 6-byte buffers");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    Py_ssize_t n_datagrams = PyObject_Length(datagrams);
    PyObject *result = NULL;
    struct sockaddr_in *addresses = NULL;
    if (n_datagrams < 0)
        goto done;
    if (n_datagrams != count) {
        PyErr_Format(PyExc_ValueError, "%zd datagrams but %zd destinations", n_datagrams, count);
        goto done;
    }
    if (count == 0) {
        result = Py_BuildValue("(nn)", (Py_ssize_t)0, (Py_ssize_t)0);
        goto done;
    }
    if ((addresses = read_destinations(sequence, count)) != NULL)
        result = send_all(self, fd, datagrams, addresses, 1);
done:
    PyMem_Free(addresses);
    Py_DECREF(sequence);
    return result;
}

/* The messages of one flush as Python: [(destination index, [datagram indices])], datagram i known by its
 * iov_base, which holds i (plan sends nothing, so nothing is read through it). */
static PyObject *messages_as_list(const UdpRuns *runs, int32_t messages, const struct sockaddr_in *to)
{
    PyObject *result = PyList_New(messages);
    for (int32_t m = 0; result != NULL && m < messages; m++) {
        const struct msghdr *header = &runs->messages[m].msg_hdr;
        PyObject *indices = PyList_New((Py_ssize_t)header->msg_iovlen);
        for (size_t k = 0; indices != NULL && k < header->msg_iovlen; k++) {
            PyObject *index = PyLong_FromSize_t((size_t)(uintptr_t)header->msg_iov[k].iov_base);
            if (index == NULL)
                Py_CLEAR(indices);
            else
                PyList_SET_ITEM(indices, k, index);
        }
        PyObject *entry = indices ? Py_BuildValue("(nN)", (const struct sockaddr_in *)header->msg_name - to,
                                                  indices) : NULL;
        if (entry == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, m, entry);
    }
    return result;
}

static PyObject *Sender_plan(Sender *self, PyObject *args)
{
    PyObject *sizes, *destinations;
    if (!PyArg_ParseTuple(args, "OO", &sizes, &destinations))
        return NULL;
    if (!take_sender(self)) /* the table is the sender's: not while a send of another thread uses it */
        return NULL;
    PyObject *sequence = PySequence_Fast(destinations, "destinations must be a sequence of 6-byte buffers");
    if (sequence == NULL) {
        self->busy = 0;
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
    struct iovec *iov = PyMem_Calloc(n ? n : 1, sizeof(*iov));
    struct sockaddr_in *to = NULL;
    PyObject *result = NULL;
    if (iov == NULL || n > self->runs.capacity || PyObject_Length(sizes) != n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd destinations need as many sizes and at most %d", n,
                         self->runs.capacity);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(sizes, i);
        long size = item ? PyLong_AsLong(item) : -1;
        Py_XDECREF(item);
        if (size < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "size %zd is negative", i);
            goto done;
        }
        iov[i].iov_base = (void *)(uintptr_t)i, iov[i].iov_len = (size_t)size;
    }
    if ((to = read_destinations(sequence, n)) != NULL)
        result = messages_as_list(&self->runs, udp_runs_build(&self->runs, iov, to, 1, (int32_t)n, &self->sender),
                                  to);
done:
    self->busy = 0;
    PyMem_Free(to);
    PyMem_Free(iov);
    Py_DECREF(sequence);
    return result;
}

static PyObject *Sender_home(Sender *self, PyObject *destination)
{
    if (self->runs.capacity == 0) {
        PyErr_SetString(PyExc_ValueError, "this Sender was never initialized (Sender.__init__ not run)");
        return NULL;
    }
    PyObject *one = PyTuple_Pack(1, destination);
    struct sockaddr_in *to = one ? read_destinations(one, 1) : NULL;
    Py_XDECREF(one);
    PyObject *home = to ? PyLong_FromUnsignedLong(udp_runs_home(&self->runs, to)) : NULL;
    PyMem_Free(to);
    return home;
}

static int Sender_init(Sender *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"segments_max", "refusals_max", "bytes_max", "gso", "capacity", "slots", NULL};
    UdpLimits limits;
    int gso = 1, capacity = UDP_MAX_PER_CALL, slots = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iil|pii", names, &limits.segments_max, &limits.refusals_max,
                                     &limits.bytes_max, &gso, &capacity, &slots))
        return -1;
    if (limits.segments_max < 1 || limits.refusals_max < 1 || limits.bytes_max < 1) {
        PyErr_SetString(PyExc_ValueError, "segments_max, refusals_max and bytes_max must be positive");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this Sender is in use by another thread");
        return -1;
    }
    udp_runs_free(&self->runs);
    int status = capacity < 1 || capacity > UDP_MAX_PER_CALL ? -2 : udp_runs_init(&self->runs, capacity, slots);
    if (status == -1)
        PyErr_NoMemory();
    else if (status == -2)
        PyErr_Format(PyExc_ValueError, "capacity %d (1..%d) or table slots %d (0, or a power of two of at least "
                     "twice the capacity) is not valid", capacity, UDP_MAX_PER_CALL, slots);
    if (status < 0)
        return -1;
    udp_sender_init(&self->sender, &limits, gso);
    return 0;
}

static void Sender_dealloc(Sender *self)
{
    udp_runs_free(&self->runs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Sender_get_gso(Sender *self, void *unused) { return PyBool_FromLong(self->sender.gso); }
static PyObject *Sender_get_refusals(Sender *self, void *unused) { return PyLong_FromLong(self->sender.refusals); }
static PyObject *Sender_get_drops(Sender *self, void *unused) { return udp_drops_by_errno(&self->sender); }

static PyMethodDef Sender_methods[] = {
    {"send_batch", (PyCFunction)Sender_send_batch, METH_VARARGS,
     "send_batch(fd, datagrams, host, port) -> (sent, failed)"},
    {"send_each", (PyCFunction)Sender_send_each, METH_VARARGS,
     "send_each(fd, datagrams, destinations) -> (sent, failed)"},
    {"plan", (PyCFunction)Sender_plan, METH_VARARGS,
     "plan(sizes, destinations) -> [(destination index, [datagram indices])]: send_each's messages, unsent"},
    {"home", (PyCFunction)Sender_home, METH_O, "home(destination) -> the table slot its probe starts at"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Sender_getset[] = {
    {"gso", (getter)Sender_get_gso, NULL, "whether runs still leave as UDP GSO messages", NULL},
    {"refusals", (getter)Sender_get_refusals, NULL, "GSO runs the kernel refused so far", NULL},
    {"drops", (getter)Sender_get_drops, NULL, "{errno: datagrams dropped for it}", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lhc_ina._udp.Sender",
    .tp_doc = "Sender(segments_max, refusals_max, bytes_max, gso=True, capacity=1024, slots=0): one socket's "
              "batched sends",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sender_init,
    .tp_dealloc = (destructor)Sender_dealloc,
    .tp_methods = Sender_methods,
    .tp_getset = Sender_getset,
};

static PyMethodDef methods[] = {
    {"recv_batch", udp_recv_batch, METH_VARARGS,
     "recv_batch(fd, buffer, slot, capacity) -> [(length, (host, port)), ...]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_udp",
    "Batched UDP I/O (GSO runs, sendmmsg, recvmmsg over lhc_ina/udp_batch.c) for the worker's channel and "
    "softswitch's Python ports.", -1, methods,
};

PyMODINIT_FUNC PyInit__udp(void)
{
    if (PyType_Ready(&SenderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *fatal = udp_fatal_errors_tuple();
    if (fatal == NULL || PyModule_AddObjectRef(m, "Sender", (PyObject *)&SenderType) < 0
        || PyModule_AddObjectRef(m, "FATAL_ERRORS", fatal) < 0)
        Py_CLEAR(m);
    Py_XDECREF(fatal);
    return m;
}
