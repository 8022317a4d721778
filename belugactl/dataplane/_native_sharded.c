/* Many puts into a ShardedMap (mds/sharded.py) in one call: a restart stores millions of keys into
 * each of the index's maps, and in Python each key's shard cost four big-int operations before the
 * dict's own store (about half of the index's restore).
 *
 * Python API:
 *   sharded_put(dicts, table, keys, values, keep_first) -> list of the values stored, or None
 *     dicts: the map's shard dicts in rotated order (ShardedMap._rot; every byte of `table` names one)
 *     table: bucket -> shard index, one byte a bucket (2^16 buckets: the top 16 bits of
 *            (hash(key) * 0x9E3779B97F4A7C15) mod 2^64, as ShardedMap computes them)
 *     keep_first: a key already there keeps its value (setdefault), and the values stored are
 *            returned in order; else each pair is stored (d[k] = v) and None is returned.
 * The keys' own hashes are CPython's (PyObject_Hash), so a key lands where ShardedMap looks for it. */
#include "_native.h"

#define SH_MIX 0x9E3779B97F4A7C15ull
#define SH_BUCKET_BITS 16

PyObject *py_sharded_put(PyObject *self, PyObject *args) {
    PyObject *dicts_arg, *keys, *values; Py_buffer table; int keep_first;
    if (!PyArg_ParseTuple(args, "Oy*OOp", &dicts_arg, &table, &keys, &values, &keep_first)) return NULL;
    /* Tuples of the arguments: a key's __hash__ or __eq__ runs Python code, which could change a list
     * under us; a tuple cannot change. */
    PyObject *dicts = NULL, *ks = NULL, *vs = NULL, *kept = NULL, *r = NULL;
    if (table.len != (Py_ssize_t)1 << SH_BUCKET_BITS) {
        PyErr_SetString(PyExc_ValueError, "sharded_put: the table must have one byte per bucket (65536)");
        goto done;
    }
    if (!(dicts = PySequence_Tuple(dicts_arg))) goto done;
    Py_ssize_t nd = PyTuple_GET_SIZE(dicts);
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(dicts, i))) { PyErr_SetString(PyExc_TypeError, "sharded_put: a shard is not a dict"); goto done; }
    }
    if (!(ks = PySequence_Tuple(keys))) goto done;
    if (!(vs = PySequence_Tuple(values))) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(ks);
    if (PyTuple_GET_SIZE(vs) != n) { PyErr_SetString(PyExc_ValueError, "sharded_put: keys and values differ in length"); goto done; }
    if (keep_first && !(kept = PyList_New(0))) goto done;
    const uint8_t *tab = table.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(ks, i), *v = PyTuple_GET_ITEM(vs, i);
        Py_hash_t h = PyObject_Hash(k);
        if (h == -1 && PyErr_Occurred()) goto done;
        uint8_t shard = tab[((uint64_t)h * SH_MIX) >> (64 - SH_BUCKET_BITS)];
        if (shard >= nd) { PyErr_SetString(PyExc_ValueError, "sharded_put: a bucket names no shard"); goto done; }
        PyObject *d = PyTuple_GET_ITEM(dicts, shard);
        if (keep_first) {
            PyObject *got = PyDict_SetDefault(d, k, v); /* borrowed */
            if (!got) goto done;
            if (got == v && PyList_Append(kept, v) < 0) goto done;
        } else if (PyDict_SetItem(d, k, v) < 0) {
            goto done;
        }
    }
    if (keep_first) { r = kept; kept = NULL; }
    else { r = Py_None; Py_INCREF(r); }
done:
    PyBuffer_Release(&table);
    Py_XDECREF(dicts); Py_XDECREF(ks); Py_XDECREF(vs); Py_XDECREF(kept);
    return r;
}
