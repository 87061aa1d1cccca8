/*
 * Batched UDP I/O: sendmmsg and recvmmsg, one system call for many datagrams.
 *
 * The worker's channel sends a window of packets and drains results in bursts; softswitch sends every
 * copy of a result (one per worker). One system call per datagram made the kernel entry, the socket
 * lookup and the Python call the larger part of the per-packet cost. The functions work on a non-blocking
 * IPv4 UDP socket that the caller owns, and release the GIL while the kernel works, so the caller's other
 * threads (the codec, the P4Runtime server) keep running.
 *
 * send_batch(fd, datagrams, host, port) -> (sent, failed)
 *     Sends every datagram (any buffer) to host:port, in order. A datagram the kernel refuses (a full
 *     socket buffer, "port unreachable", an address it may not send to) is counted in `failed` and
 *     skipped, as one sendto would have lost it; only an unusable socket (EBADF, ENOTSOCK, EFAULT)
 *     raises OSError.
 * send_each(fd, datagrams, destinations) -> (sent, failed)
 *     The same, datagram i to destinations[i]: 6 bytes, the IPv4 address then the UDP port, both in
 *     network order (as they lie in the packet's headers, so the caller need not convert them).
 * recv_batch(fd, buffer, slot, capacity) -> [(length, (host, port)), ...]
 *     Receives up to `capacity` waiting datagrams, datagram i into buffer[i * slot : (i + 1) * slot];
 *     a longer datagram arrives cut to `slot` bytes. An empty list when nothing is waiting.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

/* The kernel takes at most UIO_MAXIOV (1024) messages per call; larger batches loop. */
#define MAX_PER_CALL 1024

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

/* Send datagrams[i] to addresses[i % n_addresses] for every i, in order: (sent, failed) or NULL. */
static PyObject *send_all(int fd, PyObject *datagrams, const struct sockaddr_in *addresses,
                          Py_ssize_t n_addresses)
{
    PyObject *sequence = PySequence_Fast(datagrams, "datagrams must be a sequence of buffers");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    PyObject **items = PySequence_Fast_ITEMS(sequence);
    Py_buffer *views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc(count ? count : 1, sizeof(struct iovec));
    struct mmsghdr *messages = PyMem_Calloc(count ? count : 1, sizeof(struct mmsghdr));
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (views == NULL || iov == NULL || messages == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < count; held++) {
        if (PyObject_GetBuffer(items[held], &views[held], PyBUF_SIMPLE) < 0)
            goto done;
        iov[held].iov_base = views[held].buf;
        iov[held].iov_len = (size_t)views[held].len;
        messages[held].msg_hdr.msg_name = (void *)&addresses[held % n_addresses];
        messages[held].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
        messages[held].msg_hdr.msg_iov = &iov[held];
        messages[held].msg_hdr.msg_iovlen = 1;
    }
    Py_ssize_t next = 0, sent = 0, failed = 0;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    while (next < count) {
        unsigned int chunk = (unsigned int)(count - next < MAX_PER_CALL ? count - next : MAX_PER_CALL);
        int accepted = sendmmsg(fd, &messages[next], chunk, MSG_DONTWAIT);
        if (accepted > 0) {
            next += accepted;
            sent += accepted;
        } else if (accepted < 0 && errno == EINTR) {
            continue;
        } else if (accepted < 0 && (errno == EBADF || errno == ENOTSOCK || errno == EFAULT)) {
            error = errno; /* the socket itself is unusable: nothing after this would leave either */
            break;
        } else {
            /* this datagram is lost (a full buffer, an unreachable port or host, a forbidden address),
               as one sendto would have lost it; the rest of the batch still leaves */
            next++;
            failed++;
        }
    }
    Py_END_ALLOW_THREADS
    if (error != 0) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = Py_BuildValue("(nn)", sent, failed);
done:
    release_views(views, held);
    PyMem_Free(views);
    PyMem_Free(iov);
    PyMem_Free(messages);
    Py_DECREF(sequence);
    return result;
}

static PyObject *py_send_batch(PyObject *self, PyObject *args)
{
    int fd, port;
    const char *host;
    PyObject *datagrams;
    if (!PyArg_ParseTuple(args, "iOsi", &fd, &datagrams, &host, &port))
        return NULL;
    struct sockaddr_in address;
    if (parse_destination(host, port, &address) < 0)
        return NULL;
    return send_all(fd, datagrams, &address, 1);
}

static PyObject *py_send_each(PyObject *self, PyObject *args)
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
    addresses = PyMem_Calloc(count, sizeof(struct sockaddr_in));
    if (addresses == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, i), &view, PyBUF_SIMPLE) < 0)
            goto done;
        if (view.len != 6) {
            PyErr_Format(PyExc_ValueError, "destination %zd has %zd bytes, not 6 (IPv4 address, port)", i,
                         view.len);
            PyBuffer_Release(&view);
            goto done;
        }
        addresses[i].sin_family = AF_INET;
        memcpy(&addresses[i].sin_addr, view.buf, 4);
        memcpy(&addresses[i].sin_port, (const char *)view.buf + 4, 2);
        PyBuffer_Release(&view);
    }
    result = send_all(fd, datagrams, addresses, count);
done:
    PyMem_Free(addresses);
    Py_DECREF(sequence);
    return result;
}

/* The (host, port) tuple of a source; consecutive datagrams from one source share one tuple. */
static PyObject *source_tuple(const struct sockaddr_in *source, const struct sockaddr_in *previous,
                              PyObject *previous_tuple)
{
    if (previous_tuple != NULL && source->sin_addr.s_addr == previous->sin_addr.s_addr
        && source->sin_port == previous->sin_port) {
        Py_INCREF(previous_tuple);
        return previous_tuple;
    }
    char text[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &source->sin_addr, text, sizeof(text)) == NULL)
        return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("(si)", text, (int)ntohs(source->sin_port));
}

static PyObject *py_recv_batch(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t slot, capacity;
    Py_buffer buffer;
    if (!PyArg_ParseTuple(args, "iw*nn", &fd, &buffer, &slot, &capacity))
        return NULL;
    PyObject *result = NULL;
    struct mmsghdr *messages = NULL;
    struct iovec *iov = NULL;
    struct sockaddr_in *sources = NULL;
    if (slot < 1 || capacity < 1 || capacity > MAX_PER_CALL) {
        PyErr_Format(PyExc_ValueError, "need slot >= 1 and capacity in 1..%d, not slot %zd, capacity %zd",
                     MAX_PER_CALL, slot, capacity);
        goto done;
    }
    if (buffer.len / slot < capacity) {
        PyErr_Format(PyExc_ValueError, "a buffer of %zd bytes holds fewer than %zd slots of %zd bytes",
                     buffer.len, capacity, slot);
        goto done;
    }
    messages = PyMem_Calloc(capacity, sizeof(struct mmsghdr));
    iov = PyMem_Calloc(capacity, sizeof(struct iovec));
    sources = PyMem_Calloc(capacity, sizeof(struct sockaddr_in));
    if (messages == NULL || iov == NULL || sources == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < capacity; i++) {
        iov[i].iov_base = (char *)buffer.buf + i * slot;
        iov[i].iov_len = (size_t)slot;
        messages[i].msg_hdr.msg_name = &sources[i];
        messages[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
        messages[i].msg_hdr.msg_iov = &iov[i];
        messages[i].msg_hdr.msg_iovlen = 1;
    }
    int received, error = 0;
    Py_BEGIN_ALLOW_THREADS
    do {
        received = recvmmsg(fd, messages, (unsigned int)capacity, MSG_DONTWAIT, NULL);
    } while (received < 0 && errno == EINTR);
    if (received < 0)
        error = errno;
    Py_END_ALLOW_THREADS
    if (received < 0) {
        if (error == EAGAIN || error == EWOULDBLOCK) {
            result = PyList_New(0);
            goto done;
        }
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyList_New(received);
    if (result == NULL)
        goto done;
    PyObject *source = NULL;
    for (int i = 0; i < received; i++) {
        PyObject *next = source_tuple(&sources[i], i ? &sources[i - 1] : NULL, source);
        Py_XDECREF(source);
        source = next;
        PyObject *entry = next ? Py_BuildValue("(IO)", messages[i].msg_len, next) : NULL;
        if (entry == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, entry);
    }
    Py_XDECREF(source);
done:
    PyMem_Free(messages);
    PyMem_Free(iov);
    PyMem_Free(sources);
    PyBuffer_Release(&buffer);
    return result;
}

static PyMethodDef methods[] = {
    {"send_batch", py_send_batch, METH_VARARGS, "send_batch(fd, datagrams, host, port) -> (sent, failed)"},
    {"send_each", py_send_each, METH_VARARGS, "send_each(fd, datagrams, destinations) -> (sent, failed)"},
    {"recv_batch", py_recv_batch, METH_VARARGS,
     "recv_batch(fd, buffer, slot, capacity) -> [(length, (host, port)), ...]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_udp", "Batched UDP I/O (sendmmsg, recvmmsg) for the worker's channel and softswitch.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__udp(void)
{
    return PyModule_Create(&module);
}
