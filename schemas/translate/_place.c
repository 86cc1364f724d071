/* hpcbus.schemas.translate._place: the compiled reading of the LP -> Sonar translator's input, the fast path
 * of `schemas.translate.lp_read`.
 *
 * Why C: the translator spent two thirds of its time reading payloads (`parse_payload`: the C parser builds
 * a dict per line, then Python checks it and builds the `Line`), one third placing values. This file builds
 * the very `Line`s `parse_payload` keeps for ordinary metric lines straight from the bytes, with one `str`
 * per distinct name of the payload (a node's lines repeat their host, job and process tags), so the
 * placer (`lp_to_sample`, `lp_placer`) runs unchanged on them.
 *
 * Contract (the pure twin is `lp_read.read_pure`, which is `parse.parse_payload`): `read(payload, earliest,
 * end, line_type)` returns (items, rest, plain): rest the number of int items, plain whether the payload
 * is printable ASCII but for its line ends (`parse._plain_ascii`); for each line of `payload` (split at
 * '\n'), in order, one item:
 *   - a `line_type` instance (`model.Line`): the line, when it is a canonical metric line; it equals, tag
 *     order included, the `Line` the pure path keeps for it (which gives no problem, no warning);
 *   - int: the line's number (1-based), for every other line that is not empty: the pure path decides it
 *     (it may keep it, repair it, or name its problem).
 * Empty lines give no item (the pure path skips them without a word).
 *
 * A line is taken only when it is a canonical metric line as `lp_canonical` (`schemas/_lineshape.h`) says:
 * the rules of the InfluxDB sink's scan (`schemas/lineprotocol/_scan.c`, which returns the text instead of a
 * `Line`), written once for both. Anything else is handed to the pure path: this file decides nothing the
 * pure path would decide otherwise.
 *
 * `line_protocol_parser` (what the pure path reads with) gives a line's tags in reverse order of
 * appearance, a float for NUMBER without `i` (correctly rounded, as `PyOS_string_to_double`); the `Line`s
 * built here do the same.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_lineshape.h"

#define CACHE_SLOTS 4096 /* at most; a power of two, at most 3/4 of it filled, then names are made afresh */

/* One `str` per distinct name of a payload (open addressing, keyed by the bytes in the payload, which
 * outlives the call's use of it), sized by the payload (a one-line message gets a small table). Owns a
 * reference to each str it holds; `cache_clear` drops them. */
typedef struct {
    const char *p;
    Py_ssize_t n;
    uint64_t hash;
    PyObject *str;
} slot;

typedef struct {
    slot *slots;
    Py_ssize_t size; /* a power of two */
    Py_ssize_t used;
} cache;

/* 0, or -1 with MemoryError set */
static int cache_init(cache *c, Py_ssize_t payload_size) {
    Py_ssize_t size = 16;
    while (size < CACHE_SLOTS && size < payload_size / 8)
        size *= 2;
    c->slots = PyMem_Calloc((size_t)size, sizeof(slot));
    c->size = size;
    c->used = 0;
    if (c->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static uint64_t fnv1a(const char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* a new reference to the str of the ASCII span [p, p+n), or NULL with an exception set */
static PyObject *name_of(cache *c, const char *p, Py_ssize_t n) {
    uint64_t h = fnv1a(p, n);
    size_t mask = (size_t)c->size - 1, at = (size_t)h & mask;
    for (;;) {
        slot *e = &c->slots[at];
        if (e->str == NULL)
            break;
        if (e->hash == h && e->n == n && memcmp(e->p, p, (size_t)n) == 0) {
            Py_INCREF(e->str);
            return e->str;
        }
        at = (at + 1) & mask;
    }
    PyObject *str = PyUnicode_DecodeASCII(p, n, NULL);
    if (str == NULL || c->used >= c->size / 4 * 3)
        return str; /* full: made afresh, not kept */
    slot *e = &c->slots[at];
    e->p = p;
    e->n = n;
    e->hash = h;
    e->str = str;
    c->used++;
    Py_INCREF(str);
    return str;
}

static void cache_clear(cache *c) {
    for (Py_ssize_t i = 0; i < c->size; i++)
        Py_XDECREF(c->slots[i].str);
    PyMem_Free(c->slots);
    c->slots = NULL;
}

/* the number of a taken line: an int for `-?D{1,18}i`, else a float (correctly rounded, as the parser's) */
static PyObject *number_of(const lp_span *number, int is_int) {
    if (is_int)
        return PyLong_FromLongLong(lp_int_of(*number));
    double v;
    if (!lp_float_of(*number, &v))
        return NULL;
    return PyFloat_FromDouble(v);
}

/* the tags dict of a taken line, a new reference or NULL with an exception. `prev` is the previous taken
 * line of the payload and `prev_tags` its dict (or NULL): a node's lines come in runs with the same tag keys
 * (the ~10 lines of a process, the lines of a GPU), and such a line starts from a copy of the previous
 * line's dict (its keys in the same order), setting only the values that differ. */
static PyObject *tags_of(const lp_parts *pt, const lp_parts *prev, PyObject *prev_tags, cache *c) {
    int same_keys = prev_tags != NULL && prev->ntags == pt->ntags;
    for (int t = 0; same_keys && t < pt->ntags; t++)
        same_keys = lp_same_span(&pt->keys[t], &prev->keys[t]);
    PyObject *tags = same_keys ? PyDict_Copy(prev_tags) : PyDict_New();
    if (tags == NULL)
        return NULL;
    for (int t = pt->ntags - 1; t >= 0; t--) { /* the parser's order: last tag first */
        if (same_keys && lp_same_span(&pt->values[t], &prev->values[t]))
            continue;
        PyObject *key = name_of(c, pt->keys[t].p, pt->keys[t].n);
        if (key == NULL)
            goto fail;
        PyObject *val = name_of(c, pt->values[t].p, pt->values[t].n);
        if (val == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        int rc = PyDict_SetItem(tags, key, val);
        Py_DECREF(key);
        Py_DECREF(val);
        if (rc < 0)
            goto fail;
    }
    return tags;
fail:
    Py_DECREF(tags);
    return NULL;
}

/* a new `line_type(measurement, tags, {"value": number}, ts)` for a taken line, or NULL with an exception */
static PyObject *line_of(const lp_parts *pt, PyObject *tags, cache *c, PyObject *line_type,
                         PyObject *value_key) {
    PyObject *measurement = NULL, *fields = NULL, *number = NULL, *ts = NULL, *line = NULL;
    if ((measurement = name_of(c, pt->measurement.p, pt->measurement.n)) == NULL)
        goto done;
    if ((number = number_of(&pt->number, pt->is_int)) == NULL)
        goto done;
    if ((ts = PyLong_FromLongLong(pt->ts)) == NULL)
        goto done;
    if ((fields = PyDict_New()) == NULL || PyDict_SetItem(fields, value_key, number) < 0)
        goto done;
    line = PyObject_CallFunctionObjArgs(line_type, measurement, tags, fields, ts, NULL);
done:
    Py_XDECREF(measurement);
    Py_XDECREF(fields);
    Py_XDECREF(number);
    Py_XDECREF(ts);
    return line;
}

static PyObject *read_payload(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *payload, *line_type;
    long long earliest, end;
    if (!PyArg_ParseTuple(args, "OLLO:read", &payload, &earliest, &end, &line_type))
        return NULL;
    char *buf;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(payload, &buf, &size) < 0)
        return NULL;
    if (!PyCallable_Check(line_type)) {
        PyErr_SetString(PyExc_TypeError, "read: line_type must be callable (model.Line)");
        return NULL;
    }
    cache names;
    if (cache_init(&names, size) < 0)
        return NULL;
    PyObject *value_key = PyUnicode_InternFromString("value");
    PyObject *out = PyList_New(0);
    if (value_key == NULL || out == NULL) {
        Py_XDECREF(value_key);
        Py_XDECREF(out);
        cache_clear(&names);
        return NULL;
    }
    lp_lines lines;
    lp_lines_of(&lines, buf, size);
    lp_parts both[2], *pt = &both[0], *prev = &both[1];
    PyObject *prev_tags = NULL; /* the tags dict of the previous taken line */
    const char *line;
    Py_ssize_t len, rest = 0;
    while (lp_next_line(&lines, &line, &len)) {
        PyObject *item;
        if (lp_canonical(line, len, earliest, end, pt)) {
            PyObject *tags = tags_of(pt, prev, prev_tags, &names);
            item = tags == NULL ? NULL : line_of(pt, tags, &names, line_type, value_key);
            Py_XDECREF(prev_tags);
            prev_tags = tags; /* NULL after an error: the loop ends below */
            lp_parts *swap = prev;
            prev = pt;
            pt = swap;
        } else {
            item = PyLong_FromSsize_t(lines.number);
            rest++;
        }
        if (lp_append_new(out, item) < 0) {
            Py_DECREF(out);
            Py_DECREF(value_key);
            Py_XDECREF(prev_tags);
            cache_clear(&names);
            return NULL;
        }
    }
    Py_DECREF(value_key);
    Py_XDECREF(prev_tags);
    cache_clear(&names);
    return Py_BuildValue("(Nni)", out, rest, lines.plain); /* N: the tuple takes `out` over */
}

LP_EXTENSION(_place, "The compiled reading of the LP -> Sonar translator (see lp_read.py).", "read",
             read_payload,
             "read(payload: bytes, earliest: int, end: int, line_type: type) -> (list[Line | int], int, "
             "bool): per non-empty line, its Line when it is a canonical metric line, else its line number "
             "(for the pure path); how many line numbers; whether the payload is plain ASCII.")
