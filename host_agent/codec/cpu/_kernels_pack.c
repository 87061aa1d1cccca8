/*
 * The Python bindings of kernels_pack.c (word_packing.py's pack and unpack), which _kernels.c adds to its
 * module; their interface is listed there. Each releases the interpreter's lock while it runs, so the
 * training thread runs beside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "kernels.h"

/* pack(words, n, out, capacity) -> bytes written */
static PyObject *py_pack(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long words, out;
    long long n, capacity, size;
    if (!PyArg_ParseTuple(args, "KLKL", &words, &n, &out, &capacity)) {
        return NULL;
    }
    if (n < 0 || n > PACK_MAX_WORDS || capacity < packed_capacity(n)) {
        PyErr_Format(PyExc_ValueError, "pack: %lld words (at most %lld) need %lld bytes of room, not %lld", n,
                     (long long)PACK_MAX_WORDS, n >= 0 && n <= PACK_MAX_WORDS ? (long long)packed_capacity(n) : -1LL,
                     capacity);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    size = pack_words((const int32_t *)(uintptr_t)words, n, (uint8_t *)(uintptr_t)out);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(size);
}

/* unpack(packed, size, n, out, add) -> whether packed held n words */
static PyObject *py_unpack(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long packed, out;
    long long size, n;
    int add, done;
    if (!PyArg_ParseTuple(args, "KLLKp", &packed, &size, &n, &out, &add)) {
        return NULL;
    }
    if (n < 0 || n > PACK_MAX_WORDS || size < 0) {
        PyErr_Format(PyExc_ValueError, "unpack: size %lld or length %lld out of range", size, n);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = unpack_words((const uint8_t *)(uintptr_t)packed, size, n, (int32_t *)(uintptr_t)out, add);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

PyMethodDef pack_methods[] = {
    {"pack", py_pack, METH_VARARGS, "int32 words to blocks of zigzag values as wide as each block needs."},
    {"unpack", py_unpack, METH_VARARGS, "Packed words back to int32, written or added mod 2^32."},
    {NULL, NULL, 0, NULL},
};
