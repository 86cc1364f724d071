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
 * Sure means: at most 1024 bytes of this shape, every byte printable ASCII,
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
#include <string.h>

#define LINE_MAX_BYTES 1024
#define TAG_MAX_BYTES 1024
#define NAME_CACHE 256
#define FLOAT_MAX_BYTES 64

enum kind { KIND_FLOAT, KIND_INT, KIND_UNSURE };

/* a byte a measurement, tag key or tag value may hold here (as in `_scan.c`): printable ASCII without
 * separators, escapes, quotes, '=' and '#' */
static int name_byte(unsigned char c) {
    return c > 0x20 && c < 0x7f && c != ',' && c != '=' && c != ' ' && c != '\\' && c != '"' && c != '#';
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int equals(const char *s, Py_ssize_t n, const char *word) {
    size_t w = strlen(word);
    return (size_t)n == w && memcmp(s, word, w) == 0;
}

/* The kind of the value of the text [s, s+n) when `_body` forwards it spliced (given the measurement's type),
 * KIND_UNSURE when the Python way decides; `*name` is the measurement's length. */
static enum kind usual(const char *s, Py_ssize_t n, int aggregate, Py_ssize_t *name) {
    if (n > LINE_MAX_BYTES)
        return KIND_UNSURE;
    Py_ssize_t i = 0;
    while (i < n && name_byte((unsigned char)s[i]))
        i++;
    if (i == 0 || i >= n || s[i] != ',')
        return KIND_UNSURE;
    *name = i;
    int has_type = 0, has_stype = 0;
    while (i < n && s[i] == ',') {
        i++;
        Py_ssize_t k = i;
        while (i < n && name_byte((unsigned char)s[i]))
            i++;
        Py_ssize_t klen = i - k;
        if (klen == 0 || i >= n || s[i] != '=')
            return KIND_UNSURE;
        i++;
        Py_ssize_t v = i;
        while (i < n && name_byte((unsigned char)s[i]))
            i++;
        Py_ssize_t vlen = i - v;
        if (vlen == 0 || i >= n || (s[i] != ',' && s[i] != ' '))
            return KIND_UNSURE;
        const char *key = s + k, *val = s + v;
        if (equals(key, klen, "cluster"))
            return KIND_UNSURE;
        if (equals(key, klen, "type")) {
            if (has_type || equals(val, vlen, "node"))
                return KIND_UNSURE;
            has_type = 1;
        } else if (equals(key, klen, "stype")) {
            if (has_stype || (aggregate && equals(val, vlen, "process")))
                return KIND_UNSURE;
            has_stype = 1;
        }
    }
    /* the field: ` value=NUMBER` */
    if (i >= n || n - i < 8 || memcmp(s + i, " value=", 7) != 0)
        return KIND_UNSURE;
    i += 7;
    Py_ssize_t v = i;
    if (i < n && s[i] == '-')
        i++;
    Py_ssize_t d = i;
    while (i < n && is_digit((unsigned char)s[i]))
        i++;
    if (i == d || i >= n)
        return KIND_UNSURE;
    enum kind kind = KIND_FLOAT;
    if (s[i] == 'i') {
        if (i - d > 18)
            return KIND_UNSURE;
        kind = KIND_INT;
        i++;
    } else {
        if (s[i] == '.') {
            i++;
            Py_ssize_t f = i;
            while (i < n && is_digit((unsigned char)s[i]))
                i++;
            if (i == f)
                return KIND_UNSURE;
        }
        if (i - v > FLOAT_MAX_BYTES)
            return KIND_UNSURE;
    }
    /* ` SECONDS` and the end of the text */
    if (i >= n || s[i] != ' ')
        return KIND_UNSURE;
    i++;
    if (n - i < 1 || n - i > 19)
        return KIND_UNSURE;
    for (; i < n; i++)
        if (!is_digit((unsigned char)s[i]))
            return KIND_UNSURE;
    return kind;
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
    char buf[LINE_MAX_BYTES + TAG_MAX_BYTES];
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
                    PyObject *text = PyUnicode_DecodeASCII(buf, n + tag_n, NULL);
                    if (text == NULL || PyList_Append(out, text) < 0) {
                        Py_XDECREF(text);
                        Py_DECREF(item);
                        return NULL;
                    }
                    Py_DECREF(text);
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

static PyMethodDef methods[] = {
    {"splice", splice, METH_VARARGS,
     "splice(items: list[str | Line], tag: str, types: dict[str, type], aggregate: bool, out: list[str], "
     "other: Callable[[str | Line], object]) -> None: each canonical text the InfluxDB sink forwards as it "
     "came, with `tag` spliced in after its measurement, appended to `out`; every other item handed to "
     "`other`, in order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_influxdb", "The InfluxDB sink's compiled splice (see consumers/influx/sink.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__influxdb(void) { return PyModule_Create(&module); }
