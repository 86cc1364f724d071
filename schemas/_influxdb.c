/* hpcbus.schemas._influxdb: the compiled twin of the InfluxDB sink's usual line (`consumers.influx.sink`).
 *
 * Why C: once the line scan is compiled (`lineprotocol/_scan.c`), the sink's per-line Python work in
 * `InfluxSink._body` (a dict lookup per tag, the measurement's splice, the value's type, a new str) is what is
 * left of its CPU per line; a Python prototype of this splice reached 0.63x of bare `parse_line`, the target is
 * 0.5x (issue 24). One call handles a whole message's items, so the per-line cost is C only.
 *
 * Contract: splice(items, tag, types, aggregate, out, other) -> None. For each item of `items` (a list of the
 * canonical texts and `Line`s `scan` kept, in order):
 *   - a str this file is sure of (below) gets `tag` (`,cluster=<c>`, escaped, ASCII) spliced in right after
 *     its measurement and is appended to `out`: what `_body` writes for it (`new + text[len(old):]`);
 *   - anything else is handed to `other(item)` (the sink's Python way, which appends it wherever it goes),
 *     in its place, so the order of `out` is the pure path's.
 * Sure means: at most 1024 bytes of the line shape the scan reads too (`schemas/_lineshape.h`, its pieces
 * written once for both), every byte printable ASCII,
 *     measurement(,key=value)+ value=NUMBER SECONDS
 * with no escape, quote, '=' or '#' anywhere but the separators (so `parse_line` reads measurement and tag
 * keys exactly as they stand), no tag key `cluster`, one `type` tag at most and not `type=node` (a node-level
 * line gets `type-id=0`: `_node_text`), one `stype` tag at most and, when `aggregate`, not `stype=process`
 * (aggregated); NUMBER `-?D{1,18}i` (an int) or `-?D+(.D+)?` (a float, at most 64 bytes), SECONDS 1 to 19
 * digits; and the value's kind is the one `types` (the sink's `FieldTypes`: measurement -> int or float,
 * float when missing) holds for the measurement. That is exactly when `_body` forwards the text spliced;
 * anything else (a value to write in the other type, ...) is `other`'s: this file decides nothing the pure
 * path would decide otherwise.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_lineshape.h"

#define TAG_MAX_BYTES 1024
#define NAME_CACHE 256
#define SECONDS_MAX_DIGITS 19 /* what `_body` forwards as it came: ns too */

enum kind { KIND_FLOAT, KIND_INT, KIND_UNSURE };

/* The kind of the value of the text [s, s+n) when `_body` forwards it spliced (given the measurement's type),
 * KIND_UNSURE when the Python way decides; `*name` is the measurement's length. The shape and its pieces are
 * `_lineshape.h`'s, shared with the scan. */
static enum kind usual(const char *s, Py_ssize_t n, int aggregate, Py_ssize_t *name) {
    if (n > LP_LINE_MAX_BYTES)
        return KIND_UNSURE;
    Py_ssize_t i = lp_measurement(s, n);
    if (i == 0)
        return KIND_UNSURE;
    *name = i;
    int has_type = 0, has_stype = 0;
    while (i < n && s[i] == ',') {
        lp_span key, val;
        if (!lp_tag(s, n, &i, &key, &val))
            return KIND_UNSURE;
        if (lp_equals(key.p, key.n, "cluster"))
            return KIND_UNSURE;
        if (lp_equals(key.p, key.n, "type")) {
            if (has_type || lp_equals(val.p, val.n, "node"))
                return KIND_UNSURE;
            has_type = 1;
        } else if (lp_equals(key.p, key.n, "stype")) {
            if (has_stype || (aggregate && lp_equals(val.p, val.n, "process")))
                return KIND_UNSURE;
            has_stype = 1;
        }
    }
    lp_span number;
    unsigned long long ts;
    enum lp_number kind = lp_value_field(s, n, &i, &number);
    if (kind == LP_NOT_A_NUMBER || !lp_seconds(s, n, i, SECONDS_MAX_DIGITS, &ts))
        return KIND_UNSURE;
    return kind == LP_INT ? KIND_INT : KIND_FLOAT;
}

/* The type `types` holds for the measurement [s, s+n) as a kind (`types.get(name, float)`); -1 with an
 * exception set on error. */
static int wanted(PyObject *types, const char *s, Py_ssize_t n) {
    PyObject *key = PyUnicode_DecodeASCII(s, n, NULL);
    if (key == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(types, key); /* borrowed */
    Py_DECREF(key);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : KIND_FLOAT;
    if (found == (PyObject *)&PyLong_Type)
        return KIND_INT;
    if (found == (PyObject *)&PyFloat_Type)
        return KIND_FLOAT;
    return KIND_UNSURE;
}

/* `other(item)`: 0, or -1 with its exception */
static int hand_over(PyObject *other, PyObject *item) {
    PyObject *done = PyObject_CallFunctionObjArgs(other, item, NULL);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

static PyObject *splice(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items, *tag, *types, *out, *other;
    int aggregate;
    if (!PyArg_ParseTuple(args, "O!UO!pO!O:splice", &PyList_Type, &items, &tag, &PyDict_Type, &types,
                          &aggregate, &PyList_Type, &out, &other))
        return NULL;
    Py_ssize_t tag_n;
    const char *tag_s = PyUnicode_AsUTF8AndSize(tag, &tag_n);
    if (tag_s == NULL)
        return NULL;
    if (tag_n == 0 || tag_n > TAG_MAX_BYTES) {
        PyErr_SetString(PyExc_ValueError, "splice: the tag must be 1 to 1024 bytes");
        return NULL;
    }
    for (Py_ssize_t t = 0; t < tag_n; t++) {
        if ((unsigned char)tag_s[t] >= 0x80) {
            PyErr_SetString(PyExc_ValueError, "splice: the tag must be ASCII");
            return NULL;
        }
    }
    char buf[LP_LINE_MAX_BYTES + TAG_MAX_BYTES];
    /* the last measurement looked up and its kind: a message's lines come in runs of one measurement */
    char last[NAME_CACHE];
    Py_ssize_t last_n = -1;
    int last_kind = KIND_UNSURE;
    for (Py_ssize_t i = 0; i < PyList_Size(items); i++) {
        PyObject *item = PyList_GetItem(items, i); /* borrowed; `other` may run any code: held below */
        if (item == NULL)
            return NULL;
        Py_INCREF(item);
        int taken = 0;
        if (PyUnicode_Check(item)) {
            Py_ssize_t n, name = 0;
            const char *s = PyUnicode_AsUTF8AndSize(item, &n);
            if (s == NULL) {
                PyErr_Clear(); /* not UTF-8 encodable (a lone surrogate): the Python way decides */
            } else {
                enum kind kind = usual(s, n, aggregate, &name);
                int want = KIND_UNSURE;
                if (kind != KIND_UNSURE) {
                    if (name == last_n && memcmp(s, last, (size_t)name) == 0) {
                        want = last_kind;
                    } else {
                        want = wanted(types, s, name);
                        if (want < 0) {
                            Py_DECREF(item);
                            return NULL;
                        }
                        if (name <= NAME_CACHE) {
                            memcpy(last, s, (size_t)name);
                            last_n = name;
                            last_kind = want;
                        }
                    }
                }
                if (kind != KIND_UNSURE && want == (int)kind) {
                    memcpy(buf, s, (size_t)name);
                    memcpy(buf + name, tag_s, (size_t)tag_n);
                    memcpy(buf + name + tag_n, s + name, (size_t)(n - name));
                    if (lp_append_new(out, PyUnicode_DecodeASCII(buf, n + tag_n, NULL)) < 0) {
                        Py_DECREF(item);
                        return NULL;
                    }
                    taken = 1;
                }
            }
        }
        if (!taken) {
            if (hand_over(other, item) < 0) {
                Py_DECREF(item);
                return NULL;
            }
            last_n = -1; /* `other` may have taught `types` something: look again */
        }
        Py_DECREF(item);
    }
    Py_RETURN_NONE;
}

LP_EXTENSION(_influxdb, "The InfluxDB sink's compiled splice (see consumers/influx/sink.py).", "splice",
             splice,
             "splice(items: list[str | Line], tag: str, types: dict[str, type], aggregate: bool, "
             "out: list[str], other: Callable[[str | Line], object]) -> None: each canonical text the InfluxDB "
             "sink forwards as it came, with `tag` spliced in after its measurement, appended to `out`; every "
             "other item handed to `other`, in order.")
