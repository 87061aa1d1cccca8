/*
 * The Python bindings of kernels_quantize.c (quantize.py's quantize, dequantize and scan_quantize), which
 * _kernels.c adds to its module; their interface is listed there. Each releases the interpreter's lock
 * while it reads the bucket, so the training thread runs beside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "kernels.h"

static PyObject *py_quantize(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long x, out;
    long long n;
    int scale, clamp, done;
    if (!PyArg_ParseTuple(args, "KLipK", &x, &n, &scale, &clamp, &out)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = quantize_pow2((const float *)(uintptr_t)x, n, scale, clamp, (int32_t *)(uintptr_t)out);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

static PyObject *py_dequantize(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long q, out;
    long long n;
    int scale, done;
    if (!PyArg_ParseTuple(args, "KLiK", &q, &n, &scale, &out)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = dequantize_pow2((const int32_t *)(uintptr_t)q, n, scale, (float *)(uintptr_t)out);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

static PyObject *py_scan_quantize(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long x, out;
    long long n;
    int64_t nonzero = 0;
    uint32_t largest = 0;
    int scale, done;
    if (!PyArg_ParseTuple(args, "KLiK", &x, &n, &scale, &out)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = scan_quantize((const float *)(uintptr_t)x, n, scale, (int32_t *)(uintptr_t)out, &nonzero, &largest);
    Py_END_ALLOW_THREADS
    if (!done) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(Lk)", (long long)nonzero, (unsigned long)largest);
}

PyMethodDef quantize_methods[] = {
    {"quantize", py_quantize, METH_VARARGS, "float32 to int32 at a power-of-two scale, in one pass."},
    {"dequantize", py_dequantize, METH_VARARGS, "int32 sums to float32 at a power-of-two scale, in one pass."},
    {"scan_quantize", py_scan_quantize, METH_VARARGS, "Nonzero count, largest |x| and quantized words, one pass."},
    {NULL, NULL, 0, NULL},
};
