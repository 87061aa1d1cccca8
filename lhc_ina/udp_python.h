/*
 * udp_batch.c's counters as Python objects, for the extensions that expose them (lhc_ina._udp's Sender,
 * softswitch._dataplane's port counters). Header-only: each extension compiles its own copy, as it does
 * udp_batch.c.
 */
#ifndef LHC_UDP_PYTHON_H
#define LHC_UDP_PYTHON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "udp_batch.h"

/* {errno: datagrams dropped for it} of a sender, the errnos it never saw left out. Python twin:
 * lhc_ina/udp.py's PythonIO.drops (the same dict, counted in _drop). */
static inline PyObject *udp_drops_by_errno(const UdpSender *s)
{
    PyObject *drops = PyDict_New();
    for (int error = 0; drops != NULL && error < UDP_ERRNO_SLOTS; error++) {
        if (s->dropped_by[error] == 0)
            continue;
        PyObject *key = PyLong_FromLong(error), *count = PyLong_FromUnsignedLongLong(s->dropped_by[error]);
        if (key == NULL || count == NULL || PyDict_SetItem(drops, key, count) < 0)
            Py_CLEAR(drops);
        Py_XDECREF(key);
        Py_XDECREF(count);
    }
    return drops;
}

/* udp_batch.h's UDP_FATAL_ERRORS as a tuple of errno numbers (lhc_ina._udp.FATAL_ERRORS), which the tests
 * compare with lhc_ina.constants.UDP_FATAL_ERRORS, the Python side's list. */
static inline PyObject *udp_fatal_errors_tuple(void)
{
    PyObject *errors = PyTuple_New(udp_fatal_error_count);
    for (int i = 0; errors != NULL && i < udp_fatal_error_count; i++) {
        PyObject *number = PyLong_FromLong(udp_fatal_errors[i]);
        if (number == NULL)
            Py_CLEAR(errors);
        else
            PyTuple_SET_ITEM(errors, i, number);
    }
    return errors;
}

#endif
