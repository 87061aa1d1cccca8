/* What the two files of the _udp extension share: _udp.c (the module, the Sender type) and udp_receive.c
 * (recv_batch). */
#ifndef LHC_UDP_H
#define LHC_UDP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* recv_batch(fd, buffer, slot, capacity) -> [(length, (host, port)), ...]; see _udp.c's header. */
PyObject *udp_recv_batch(PyObject *self, PyObject *args);

/* NULL, with OSError(error) raised: the one way both files report a socket's errno. */
PyObject *udp_raise_errno(int error);

#endif
