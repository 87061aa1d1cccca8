/*
 * The native pipeline's view of the tables: the Python dicts the P4Runtime server writes, read in place.
 *
 * snapshot_take fetches, under the switch lock, the objects a burst reads (ExactTable.entries and
 * .default, LpmTable._by_len, ._lens and .default, MulticastGroups.groups, Pipeline.configured): new
 * references, because P4Runtime rebinds some of them (a default, the LPM length list) between bursts.
 * Lookups then go to those very dicts with the GIL held; nothing is copied.
 */
#include "dataplane.h"

#include <string.h>

int snapshot_take(Dataplane *e)
{
    Snapshot *s = &e->s;
    memset(s, 0, sizeof(*s));
    PyObject *configured = PyObject_GetAttrString(e->pipeline, "configured");
    if (configured == NULL)
        return -1;
    s->configured = PyObject_IsTrue(configured);
    Py_DECREF(configured);
    if (s->configured < 0)
        return -1;
    struct { PyObject **slot; PyObject *owner; const char *name; } want[] = {
        {&s->jobs, e->jobs_table, "entries"}, {&s->jobs_default, e->jobs_table, "default"},
        {&s->workers, e->workers_table, "entries"}, {&s->uplinks, e->uplinks_table, "entries"},
        {&s->uplinks_default, e->uplinks_table, "default"}, {&s->l2, e->l2_table, "entries"},
        {&s->l2_default, e->l2_table, "default"}, {&s->replicas, e->replicas_table, "entries"},
        {&s->replicas_default, e->replicas_table, "default"}, {&s->lpm_by_len, e->lpm_table, "_by_len"},
        {&s->lpm_lens, e->lpm_table, "_lens"}, {&s->lpm_default, e->lpm_table, "default"},
        {&s->groups, e->pre, "groups"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        *want[i].slot = PyObject_GetAttrString(want[i].owner, want[i].name);
        if (*want[i].slot == NULL) {
            snapshot_drop(e);
            return -1;
        }
    }
    if (!PyDict_Check(s->jobs) || !PyDict_Check(s->workers) || !PyDict_Check(s->uplinks) || !PyDict_Check(s->l2)
        || !PyDict_Check(s->replicas)
        || !PyDict_Check(s->lpm_by_len) || !PyList_Check(s->lpm_lens) || !PyDict_Check(s->groups)) {
        PyErr_SetString(PyExc_TypeError, "a table's entries are not the dict (or list) the pipeline keeps");
        snapshot_drop(e);
        return -1;
    }
    return 0;
}

void snapshot_drop(Dataplane *e)
{
    Snapshot *s = &e->s;
    Py_CLEAR(s->jobs); Py_CLEAR(s->jobs_default); Py_CLEAR(s->workers); Py_CLEAR(s->uplinks);
    Py_CLEAR(s->uplinks_default); Py_CLEAR(s->l2);
    Py_CLEAR(s->l2_default); Py_CLEAR(s->replicas); Py_CLEAR(s->replicas_default);
    Py_CLEAR(s->lpm_by_len); Py_CLEAR(s->lpm_lens); Py_CLEAR(s->lpm_default); Py_CLEAR(s->groups);
}

/* dict.get(key) for an int key: a borrowed reference, NULL on a miss (check PyErr_Occurred). */
PyObject *lookup(PyObject *dict, uint64_t key)
{
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    if (k == NULL)
        return NULL;
    PyObject *value = PyDict_GetItemWithError(dict, k);
    Py_DECREF(k);
    return value;
}

/* lookup() for a key wider than 64 bits (the workers table's 81): built from its 16 big-endian bytes. */
PyObject *lookup_wide(PyObject *dict, unsigned __int128 key)
{
    unsigned char bytes[16];
    for (int i = 15; i >= 0; i--, key >>= 8)
        bytes[i] = (unsigned char)key;
    PyObject *k = _PyLong_FromByteArray(bytes, sizeof bytes, 0, 0);
    if (k == NULL)
        return NULL;
    PyObject *value = PyDict_GetItemWithError(dict, k);
    Py_DECREF(k);
    return value;
}

/* Whether an action call (name, *params) is `name`: `action[0] == NAME` in pipeline.py. */
int is_action(PyObject *call, PyObject *name)
{
    if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) < 1) {
        PyErr_SetString(PyExc_TypeError, "a table action is not a (name, *params) tuple");
        return -1;
    }
    return PyObject_RichCompareBool(PyTuple_GET_ITEM(call, 0), name, Py_EQ);
}

/* Param `at` of an action call; `size`, when > 0, is the tuple length pipeline.py unpacks. */
int param(PyObject *call, long at, long size, uint64_t *out)
{
    if (size > 0 && PyTuple_GET_SIZE(call) != size) {
        PyErr_Format(PyExc_ValueError, "an action call of %zd items where %ld are unpacked",
                     PyTuple_GET_SIZE(call), size);
        return -1;
    }
    if (PyTuple_GET_SIZE(call) <= at) {
        PyErr_SetString(PyExc_IndexError, "an action call lacks a parameter");
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(call, at));
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* The action of the longest prefix of ipv4_routes matching `value` (LpmTable.lookup), or NULL. */
PyObject *lpm_lookup(Dataplane *e, uint64_t value)
{
    const Layout *L = &e->L;
    PyObject *lens = e->s.lpm_lens;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lens); i++) {
        PyObject *len_object = PyList_GET_ITEM(lens, i);
        long prefix_len = PyLong_AsLong(len_object);
        if (prefix_len == -1 && PyErr_Occurred())
            return NULL;
        if (prefix_len < 0 || prefix_len > L->lpm_width) {
            PyErr_Format(PyExc_ValueError, "an LPM prefix length %ld outside 0..%ld", prefix_len, L->lpm_width);
            return NULL;
        }
        PyObject *by_value = PyDict_GetItemWithError(e->s.lpm_by_len, len_object);
        if (by_value == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "an LPM prefix length without its dict");
            return NULL;
        }
        uint64_t mask = ((UINT64_C(1) << prefix_len) - 1) << (L->lpm_width - prefix_len);
        PyObject *action = lookup(by_value, value & mask);
        if (action != NULL || PyErr_Occurred())
            return action;
    }
    return NULL;
}
