/*
 * The Python bindings of kernels_quantize.c (quantize.py's quantize, dequantize and scan_quantize), which
 * _kernels.c adds to its module; their interface is listed there. Each releases the interpreter's lock
 * while it reads the bucket, so the training thread runs beside it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "kernels.h"

/* What every binding here takes: the input's and output's addresses, the length, the scale and, for
 * quantize, the clamp: (in, n, scale, [clamp,] out). */
struct pass {
    unsigned long long in, out;
    long long n;
    int scale, clamp;
};

static int parse_pass(PyObject *args, struct pass *p, int with_clamp)
{
    p->clamp = 0;
    if (with_clamp) {
        return PyArg_ParseTuple(args, "KLipK", &p->in, &p->n, &p->scale, &p->clamp, &p->out);
    }
    return PyArg_ParseTuple(args, "KLiK", &p->in, &p->n, &p->scale, &p->out);
}

static PyObject *py_quantize(PyObject *self, PyObject *args)
{
    (void)self;
    struct pass p;
    int done;
    if (!parse_pass(args, &p, 1)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = quantize_pow2((const float *)(uintptr_t)p.in, p.n, p.scale, p.clamp, (int32_t *)(uintptr_t)p.out);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

static PyObject *py_dequantize(PyObject *self, PyObject *args)
{
    (void)self;
    struct pass p;
    int done;
    if (!parse_pass(args, &p, 0)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = dequantize_pow2((const int32_t *)(uintptr_t)p.in, p.n, p.scale, (float *)(uintptr_t)p.out);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

/* (nonzero, largest), or None for a scale out of reach; out 0: the scan alone. */
static PyObject *py_scan_quantize(PyObject *self, PyObject *args)
{
    (void)self;
    struct pass p;
    int64_t nonzero = 0;
    uint32_t largest = 0;
    int done;
    if (!parse_pass(args, &p, 0)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    done = scan_quantize((const float *)(uintptr_t)p.in, p.n, p.scale, (int32_t *)(uintptr_t)p.out, &nonzero,
                         &largest);
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
