/* Many puts into a ShardedMap (mds/sharded.py) in one call: a restart stores millions of keys into
 * each of the index's maps, and in Python each key's shard cost four big-int operations before the
 * dict's own store (about half of the index's restore).
 *
 * Python API:
 *   sharded_put(dicts, table, keys, values, keep_first) -> list of the values stored, or None
 *     dicts: the map's shard dicts in rotated order (ShardedMap._rot, len(table)'s range of shards)
 *     table: bucket -> shard index, one byte a bucket (2^16 buckets: the top 16 bits of
 *            (hash(key) * 0x9E3779B97F4A7C15) mod 2^64, as ShardedMap computes them)
 *     keep_first: a key already there keeps its value (setdefault), and the values stored are
 *            returned in order; else each pair is stored (d[k] = v) and None is returned.
 * The keys' own hashes are CPython's (PyObject_Hash), so a key lands where ShardedMap looks for it. */
#include "_native.h"

#define SH_MIX 0x9E3779B97F4A7C15ull
#define SH_BUCKET_BITS 16

PyObject *py_sharded_put(PyObject *self, PyObject *args) {
    PyObject *dicts, *keys, *values; Py_buffer table; int keep_first;
    if (!PyArg_ParseTuple(args, "O!y*OOp", &PyList_Type, &dicts, &table, &keys, &values, &keep_first)) return NULL;
    PyObject *ks = NULL, *vs = NULL, *kept = NULL, *r = NULL;
    if (table.len != (Py_ssize_t)1 << SH_BUCKET_BITS) {
        PyErr_SetString(PyExc_ValueError, "sharded_put: the table must have one byte per bucket (65536)");
        goto done;
    }
    Py_ssize_t nd = PyList_GET_SIZE(dicts);
    const uint8_t *tab = table.buf;
    for (Py_ssize_t i = 0; i < table.len; i++) {
        if (tab[i] >= nd) { PyErr_SetString(PyExc_ValueError, "sharded_put: a bucket names no shard"); goto done; }
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (!PyDict_CheckExact(PyList_GET_ITEM(dicts, i))) { PyErr_SetString(PyExc_TypeError, "sharded_put: a shard is not a dict"); goto done; }
    }
    if (!(ks = PySequence_Fast(keys, "sharded_put: keys must be a sequence"))) goto done;
    if (!(vs = PySequence_Fast(values, "sharded_put: values must be a sequence"))) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ks);
    if (PySequence_Fast_GET_SIZE(vs) != n) { PyErr_SetString(PyExc_ValueError, "sharded_put: keys and values differ in length"); goto done; }
    if (keep_first && !(kept = PyList_New(0))) goto done;
    PyObject **kk = PySequence_Fast_ITEMS(ks), **vv = PySequence_Fast_ITEMS(vs);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_hash_t h = PyObject_Hash(kk[i]);
        if (h == -1 && PyErr_Occurred()) goto done;
        uint64_t bucket = ((uint64_t)h * SH_MIX) >> (64 - SH_BUCKET_BITS);
        PyObject *d = PyList_GET_ITEM(dicts, tab[bucket]);
        if (keep_first) {
            PyObject *got = PyDict_SetDefault(d, kk[i], vv[i]); /* borrowed */
            if (!got) goto done;
            if (got == vv[i] && PyList_Append(kept, got) < 0) goto done;
        } else if (PyDict_SetItem(d, kk[i], vv[i]) < 0) {
            goto done;
        }
    }
    if (keep_first) { r = kept; kept = NULL; }
    else { r = Py_None; Py_INCREF(r); }
done:
    PyBuffer_Release(&table);
    Py_XDECREF(ks); Py_XDECREF(vs); Py_XDECREF(kept);
    return r;
}
