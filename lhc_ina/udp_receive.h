/* _udp's receive side (udp_receive.c), for the module's method table in _udp.c. */
#ifndef LHC_UDP_RECEIVE_H
#define LHC_UDP_RECEIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* recv_batch(fd, buffer, slot, capacity) -> [(length, (host, port)), ...]; see _udp.c's header. */
PyObject *udp_recv_batch(PyObject *self, PyObject *args);

#endif
