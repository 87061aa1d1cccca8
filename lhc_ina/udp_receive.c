/*
 * _udp's receive side: recv_batch, many waiting datagrams in one recvmmsg (lhc_ina/udp_batch.c's
 * udp_receive), each into its slot of the caller's buffer, with the GIL released while the kernel works.
 * Its Python twin is lhc_ina/udp.py's PythonIO.receive (recvfrom_into, one datagram per call).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include "udp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "udp_batch.h"

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

PyObject *udp_recv_batch(PyObject *self, PyObject *args)
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
    if (slot < 1 || capacity < 1 || capacity > UDP_MAX_PER_CALL) {
        PyErr_Format(PyExc_ValueError, "need slot >= 1 and capacity in 1..%d, not slot %zd, capacity %zd",
                     UDP_MAX_PER_CALL, slot, capacity);
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
    received = udp_receive(fd, messages, (unsigned int)capacity, &error);
    Py_END_ALLOW_THREADS
    if (received < 0) {
        udp_raise_errno(error);
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
