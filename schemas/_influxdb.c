/* hpcbus.schemas._influxdb: the compiled twin of the InfluxDB sink's usual line and of its fold of process
 * lines (`schemas.influxbody`, `schemas.influxdb.aggregate_processes`).
 *
 * Why C: once the line scan is compiled (`lineprotocol/_scan.c`), the sink's per-line Python work in
 * `Bodies.body` (a dict lookup per tag, the measurement's splice, the value's type, a new str) is what is
 * left of its CPU per line; a Python prototype of this splice reached 0.63x of bare `parse_line`, the target is
 * 0.5x (issue 24). One call handles a whole message's items, so the per-line cost is C only.
 *
 * Contract: splice(items, tag, types, aggregate, out, other) -> None. For each item of `items` (a list of the
 * canonical texts and `Line`s `scan` kept, in order):
 *   - a str this file is sure of (below) is appended to `out` as `Bodies.body` writes it: with `tag`
 *     (`,cluster=<c>`, escaped, ASCII) spliced in right after its measurement (`new + text[len(old):]`); as
 *     it came when it carries the part's cluster already (what the node agent sends); or, a node-level line
 *     (`type=node`), written again as `format_line` writes it with the part's cluster and InfluxDB's
 *     `type-id=0` (`_placer`: its tags sorted, `type-id` added or put in place of the bus' own, the value
 *     and the seconds as Python's `repr`/`str` write them);
 *   - anything else is handed to `other(item)` (the sink's Python way, which appends it wherever it goes),
 *     in its place, so the order of `out` is the pure path's.
 * Sure means: at most 1024 bytes of the line shape the scan reads too (`schemas/_lineshape.h`: `lp_read`,
 * written once for both), every byte printable ASCII,
 *     measurement(,key=value)+ value=NUMBER SECONDS
 * with no escape, quote, '=' or '#' anywhere but the separators (so `parse_line` reads measurement and tag
 * keys exactly as they stand), at most 32 tags, no tag key given twice, a `cluster` tag only on a node-level
 * line or holding the part's cluster as `tag` writes it, when `aggregate` no `stype=process` (folded, below);
 * NUMBER `-?D{1,18}i` (an int) or `-?D+(.D+)?` (a float, at most 64 bytes), SECONDS 1 to 19 digits; and the
 * value's kind is the one `types` (the sink's `FieldTypes`: measurement -> int or float, float when missing)
 * holds for the measurement (else `stable_types` changes it). That is exactly when `Bodies.body` writes the line
 * so; anything else is `other`'s: this file decides nothing the pure path would decide otherwise.
 *
 * Process lines (`aggregate`, the default): the node agent publishes one line per process and metric, which
 * `aggregate_processes` folds per job over the whole batch and `format_line` writes at the end of the body.
 * Given `processes`, the splice appends each process text it is sure of (`is_process`) to it as
 * `(text, tag)`, in its place among the process `Line`s the Python way appends; then
 * fold(processes, types, aggs) -> list[str] | None writes the folded lines (the tags as `_placer` and
 * `aggregate_processes` make them, the value by the registry's `agg`, in `types`' type, as `format_line`
 * writes it: ints in C, a sum of floats by Python's own `sum`, floats by `repr`'s `PyOS_double_to_string`),
 * or None when it is not sure of one of them (an int sum beyond int64, ints and floats in one group, a float
 * for an int, a tag that needs escapes but for the dropped `pid`/`ppid`/`cmd`, ...): then the sink folds
 * them all in Python, as before.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdio.h>

#include "_lineshape.h"

#define TAG_MAX_BYTES 1024
#define NAME_CACHE 256
#define SECONDS_MAX_DIGITS 19 /* what `Bodies.body` forwards as it came: ns too */

enum kind { KIND_FLOAT, KIND_INT, KIND_UNSURE };

/* What `Bodies.body` does with a line of the shape (`lp_read`), given the measurement's type. */
enum route {
    ROUTE_SPLICE, /* the part's cluster tag spliced in after the measurement */
    ROUTE_AS_IS,  /* it carries the part's cluster already (what the node agent sends): as it came */
    ROUTE_NODE,   /* a node-level line: written again with `type-id=0` and the part's cluster (`node_line`) */
    ROUTE_PYTHON, /* the Python way decides */
};

/* The route of the line `p`: `type` and `stype` are read as `_placer` reads them; `cluster` the part's cluster
 * as its tag value is written ({NULL, 0}: none that this file may write). */
static enum route route_of(const lp_parts *p, int aggregate, lp_span cluster) {
    lp_span level, stype, own;
    if (aggregate && lp_tag_of(p, "stype", &stype) && lp_equals(stype.p, stype.n, "process"))
        return ROUTE_PYTHON; /* folded, by `fold` or the Python way */
    if (lp_tag_of(p, "type", &level) && lp_equals(level.p, level.n, "node"))
        return cluster.n > 0 ? ROUTE_NODE : ROUTE_PYTHON;
    if (!lp_tag_of(p, "cluster", &own))
        return ROUTE_SPLICE;
    /* another cluster is the Python way's */
    return lp_same_span(&own, &cluster) ? ROUTE_AS_IS : ROUTE_PYTHON;
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

/* --- lines written again: tags sorted, numbers as `format_line` writes them ---------------------------- */

#define WRITTEN_MAX (LP_LINE_MAX_BYTES + TAG_MAX_BYTES + 64) /* a line written again, at most */
#define EXACT_INT (1LL << 53)                                /* ints up to here are exact as doubles */

/* a tag of a line written again: key and value text */
typedef struct {
    lp_span key, value;
} tag_of;

/* `measurement,k=v,...` in `buf` with the `k` tags sorted by key (as `format_line` writes them; `tags` is
 * sorted in place): its length, 0 when it would not leave 64 bytes of `WRITTEN_MAX` for value and time. */
static Py_ssize_t write_head(lp_span measurement, tag_of *tags, int k, char *buf) {
    for (int a = 1; a < k; a++) { /* insertion sort: a few dozen tags at most */
        tag_of t = tags[a];
        int b = a;
        for (; b > 0 && lp_key_before(&t.key, &tags[b - 1].key); b--)
            tags[b] = tags[b - 1];
        tags[b] = t;
    }
    Py_ssize_t at = measurement.n;
    if (at > LP_LINE_MAX_BYTES) /* a `Line`'s measurement may be any length */
        return 0;
    memcpy(buf, measurement.p, (size_t)at);
    for (int t = 0; t < k; t++) {
        if (at + tags[t].key.n + tags[t].value.n + 2 > WRITTEN_MAX - 64)
            return 0;
        buf[at++] = ',';
        memcpy(buf + at, tags[t].key.p, (size_t)tags[t].key.n);
        at += tags[t].key.n;
        buf[at++] = '=';
        memcpy(buf + at, tags[t].value.p, (size_t)tags[t].value.n);
        at += tags[t].value.n;
    }
    return at;
}

/* The int `i` (`is_int`) or the float `x` as `format_line` writes it after `stable_types` made it of kind
 * `want` (in `text`): 1, 0 when the pure path decides (an int beyond 2^53 for a float, a float for an int,
 * inf), -1 with an exception set. */
static int number_text(int is_int, long long i, double x, int want, char *text, size_t size) {
    if (is_int) {
        if (want == KIND_INT) {
            snprintf(text, size, "%lldi", i);
            return 1;
        }
        if (i > EXACT_INT || i < -EXACT_INT)
            return 0;
        x = (double)i;
    } else if (want == KIND_INT) {
        return 0;
    }
    if (!isfinite(x))
        return 0;
    if (-DBL_MIN < x && x < DBL_MIN) {
        snprintf(text, size, "0.0"); /* zero and subnormals: `format_line`'s general rule */
        return 1;
    }
    char *repr = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL)
        return -1;
    int fits = strlen(repr) < size;
    if (fits)
        memcpy(text, repr, strlen(repr) + 1);
    PyMem_Free(repr);
    return fits;
}

/* 1 when the number text `number` (of the shape: `-?D{1,18}` for an int, `-?D+(.D+)?` for a float) is what
 * `format_line` writes for the value `parse_line` reads from it, so it is written as it stands without being
 * read (a node agent's values are `format_line`'s own; `lp_float_of` and `repr` cost most of a node-level line):
 * an int without a leading zero and not `-0`; a float `I.F` without a leading zero in I (but `0`) nor a
 * trailing one in F (but `X.0`), not zero, of at most 15 significant digits, in [1e-4, 1e16). Why that is
 * exact: a decimal of at most 15 significant digits is the one decimal of that length that reads as its
 * double (DBL_DIG), so `repr`'s shortest round trip has its digits, and it writes them in fixed notation
 * exactly in that range. Anything else: 0, read and written (`number_text`). */
static int written_as_is(lp_span number, int is_int) {
    Py_ssize_t i = number.p[0] == '-', n = number.n;
    Py_ssize_t int_start = i;
    while (i < n && number.p[i] != '.')
        i++;
    Py_ssize_t int_n = i - int_start;
    if (int_n > 1 && number.p[int_start] == '0')
        return 0; /* a leading zero */
    if (is_int)
        return !(int_n == 1 && number.p[int_start] == '0' && int_start == 1); /* not `-0` */
    if (i == n || int_n > 16)
        return 0; /* no '.' (`5` is written `5.0`), or 1e16 and beyond */
    Py_ssize_t frac = i + 1, frac_n = n - frac;
    if (frac_n > 1 && number.p[n - 1] == '0')
        return 0; /* a trailing zero */
    Py_ssize_t digits;
    if (int_n == 1 && number.p[int_start] == '0') {
        Py_ssize_t zeros = 0;
        while (zeros < frac_n && number.p[frac + zeros] == '0')
            zeros++;
        if (zeros == frac_n || zeros > 3)
            return 0; /* zero (`-0.0` is written `0.0`), or below 1e-4 */
        digits = frac_n - zeros;
    } else {
        digits = int_n + (frac_n == 1 && number.p[frac] == '0' ? 0 : frac_n);
    }
    return digits <= 15;
}

/* --- node-level lines (`_placer`: `type-id=0`, the part's cluster, `format_line`) ---------------------------- */

/* What `Bodies.body` writes for the node-level line `p` (`route_of`: ROUTE_NODE) of kind `want`, in `buf`: its tags
 * with `cluster` the part's (as written, escaped) and `type-id=0` (InfluxDB's series of old; added or put in
 * place of the bus' `type-id`), sorted; its value and time as `format_line` writes them. Its length, 0 when
 * the pure path decides, -1 with an exception set. */
static Py_ssize_t node_line(const lp_parts *p, lp_span cluster, int want, char *buf) {
    tag_of tags[LP_MAX_TAGS + 2];
    int k = 0;
    for (int t = 0; t < p->ntags; t++) {
        const lp_span *key = &p->keys[t];
        if (lp_equals(key->p, key->n, "cluster") || lp_equals(key->p, key->n, "type-id"))
            continue;
        tags[k].key = *key;
        tags[k++].value = p->values[t];
    }
    tags[k].key.p = "cluster";
    tags[k].key.n = 7;
    tags[k++].value = cluster;
    tags[k].key.p = "type-id";
    tags[k].key.n = 7;
    tags[k].value.p = "0"; /* `model.INFLUX_NODE_ID` */
    tags[k++].value.n = 1;
    Py_ssize_t at = write_head(p->measurement, tags, k, buf);
    if (at == 0)
        return 0;
    char value[LP_FLOAT_MAX_BYTES + 1];
    if (written_as_is(p->number, p->is_int)) {
        memcpy(value, p->number.p, (size_t)p->number.n);
        value[p->number.n] = '\0';
        if (p->is_int)
            strcat(value, "i");
    } else {
        double x = 0.0;
        if (!p->is_int && !lp_float_of(p->number, &x))
            return -1;
        int got = number_text(p->is_int, p->is_int ? lp_int_of(p->number) : 0, x, want, value, sizeof value);
        if (got <= 0)
            return got;
    }
    /* the seconds as `str(line.time)`: without leading zeros */
    Py_ssize_t first = 0;
    while (first < p->seconds.n - 1 && p->seconds.p[first] == '0')
        first++;
    size_t value_n = strlen(value);
    memcpy(buf + at, " value=", 7);
    memcpy(buf + at + 7, value, value_n);
    at += 7 + (Py_ssize_t)value_n;
    buf[at++] = ' ';
    memcpy(buf + at, p->seconds.p + first, (size_t)(p->seconds.n - first));
    return at + p->seconds.n - first;
}

/* --- process lines to fold (`aggregate_processes`) ------------------------------------------------------ */

/* 1 when the line `p` (`lp_read`) is one the pure path reads as a process line to fold: one `stype=process`,
 * SECONDS 1 to 18 digits without a leading zero (the text of the int `parse_line` reads). */
static int is_process(const lp_parts *p) {
    lp_span stype;
    return lp_tag_of(p, "stype", &stype) && lp_equals(stype.p, stype.n, "process") && p->seconds.n <= 18 &&
           (p->seconds.n == 1 || p->seconds.p[0] != '0');
}

/* `item` (a str of `splice`) as `Bodies.body` forwards it, appended to `out`: 1; 0 when the Python way decides; -1
 * with an exception set. `*last_n`, `last`, `*last_kind`: the last measurement looked up in `types` and its
 * kind (a message's lines come in runs of one measurement). */
static int forward(PyObject *item, const lp_parts *parts, enum route route, lp_span tag, lp_span cluster,
                   PyObject *types, PyObject *out, char *last, Py_ssize_t *last_n, int *last_kind) {
    Py_ssize_t name = parts->measurement.n;
    const char *s = parts->measurement.p;
    int want;
    if (name == *last_n && memcmp(s, last, (size_t)name) == 0) {
        want = *last_kind;
    } else {
        want = wanted(types, s, name);
        if (want < 0)
            return -1;
        if (name <= NAME_CACHE) {
            memcpy(last, s, (size_t)name);
            *last_n = name;
            *last_kind = want;
        }
    }
    if (want != (parts->is_int ? KIND_INT : KIND_FLOAT))
        return 0; /* `stable_types` changes it: the Python way */
    Py_ssize_t n = parts->seconds.p + parts->seconds.n - s;
    char buf[WRITTEN_MAX];
    if (route == ROUTE_AS_IS) {
        Py_INCREF(item);
        return lp_append_new(out, item) < 0 ? -1 : 1;
    }
    if (route == ROUTE_NODE) {
        n = node_line(parts, cluster, want, buf);
        if (n <= 0)
            return (int)n;
    } else {
        memcpy(buf, s, (size_t)name);
        memcpy(buf + name, tag.p, (size_t)tag.n);
        memcpy(buf + name + tag.n, s + name, (size_t)(n - name));
        n += tag.n;
    }
    return lp_append_new(out, PyUnicode_DecodeASCII(buf, n, NULL)) < 0 ? -1 : 1;
}

static PyObject *splice(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items, *tag, *types, *out, *other, *processes = NULL;
    int aggregate;
    if (!PyArg_ParseTuple(args, "O!UO!pO!O|O!:splice", &PyList_Type, &items, &tag, &PyDict_Type, &types,
                          &aggregate, &PyList_Type, &out, &other, &PyList_Type, &processes))
        return NULL;
    lp_span tag_s;
    tag_s.p = PyUnicode_AsUTF8AndSize(tag, &tag_s.n);
    if (tag_s.p == NULL)
        return NULL;
    if (tag_s.n == 0 || tag_s.n > TAG_MAX_BYTES) {
        PyErr_SetString(PyExc_ValueError, "splice: the tag must be 1 to 1024 bytes");
        return NULL;
    }
    for (Py_ssize_t t = 0; t < tag_s.n; t++) {
        if ((unsigned char)tag_s.p[t] >= 0x80) {
            PyErr_SetString(PyExc_ValueError, "splice: the tag must be ASCII");
            return NULL;
        }
    }
    /* the part's cluster as its tag value is written (the tag is `,cluster=<value>`) */
    lp_span cluster = {NULL, 0};
    if (tag_s.n > 9 && memcmp(tag_s.p, ",cluster=", 9) == 0) {
        cluster.p = tag_s.p + 9;
        cluster.n = tag_s.n - 9;
    }
    char last[NAME_CACHE];
    Py_ssize_t last_n = -1;
    int last_kind = KIND_UNSURE;
    lp_parts parts;
    for (Py_ssize_t i = 0; i < PyList_Size(items); i++) {
        PyObject *item = PyList_GetItem(items, i); /* borrowed; `other` may run any code: held below */
        if (item == NULL)
            return NULL;
        Py_INCREF(item);
        int taken = 0;
        if (PyUnicode_Check(item)) {
            Py_ssize_t n;
            const char *s = PyUnicode_AsUTF8AndSize(item, &n);
            if (s == NULL) {
                PyErr_Clear(); /* not UTF-8 encodable (a lone surrogate): the Python way decides */
            } else if (!lp_read(s, n, SECONDS_MAX_DIGITS, &parts)) {
                /* not of the shape: the Python way */
            } else if (aggregate && processes != NULL && is_process(&parts)) {
                /* a process line to fold: `fold` later, with the cluster of its part */
                taken = lp_append_new(processes, PyTuple_Pack(2, item, tag)) < 0 ? -1 : 1;
            } else {
                enum route route = route_of(&parts, aggregate, cluster);
                if (route != ROUTE_PYTHON)
                    taken = forward(item, &parts, route, tag_s, cluster, types, out, last, &last_n, &last_kind);
            }
        }
        if (taken == 0) {
            taken = hand_over(other, item);
            last_n = -1; /* `other` may have taught `types` something: look again */
        }
        Py_DECREF(item);
        if (taken < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}


/* --- the fold of process lines ---------------------------------------------------------------------------- */

/* One group of `fold`: the lines of one (measurement, time, tags once folded), in order of first line. */
typedef struct {
    Py_ssize_t name;   /* the measurement's length: the key starts with it */
    Py_ssize_t prefix; /* the key's length up to the ' ' before the time */
    Py_ssize_t count;
    int is_int;
    long long ifirst, isum, imax;
    double ffirst, fmax;
    PyObject *floats; /* the float values, from the second one on (`sum` of them is Python's own) */
} group;

/* The key of the folded line of process line `p` with cluster `cluster` (as written, escaped) in `buf`
 * (`meas,sorted tags SECONDS`), its length, *prefix the length up to the ' '; 0 when the pure path decides
 * (no `stype-id`, an empty job key, ...). What `_placer` and `aggregate_processes` make of the line's tags:
 * `type-id=0` for `type=node`, `cluster` the part's, `pid`/`ppid`/`cmd` dropped, `stype=job`, `stype-id` the
 * job key (up to its last '/'); tags sorted by key as `format_line` writes them. */
static Py_ssize_t fold_key(const lp_parts *p, lp_span cluster, char *buf, Py_ssize_t *prefix) {
    static const char zero[] = "0", job[] = "job";
    tag_of tags[LP_MAX_TAGS + 2];
    int k = 0, node = 0, has_cluster = 0, has_id = 0, type_id = -1;
    for (int t = 0; t < p->ntags; t++) {
        const lp_span *key = &p->keys[t];
        lp_span value = p->values[t];
        if (lp_equals(key->p, key->n, "pid") || lp_equals(key->p, key->n, "ppid") ||
            lp_equals(key->p, key->n, "cmd"))
            continue;
        if (lp_equals(key->p, key->n, "cluster")) {
            value = cluster;
            has_cluster = 1;
        } else if (lp_equals(key->p, key->n, "type")) {
            node = lp_equals(value.p, value.n, "node");
        } else if (lp_equals(key->p, key->n, "type-id")) {
            type_id = k;
        } else if (lp_equals(key->p, key->n, "stype")) {
            value.p = job;
            value.n = 3;
        } else if (lp_equals(key->p, key->n, "stype-id")) {
            Py_ssize_t end = value.n;
            while (end > 0 && value.p[end - 1] != '/')
                end--;
            if (end > 0)
                value.n = end - 1;
            if (value.n == 0)
                return 0;
            has_id = 1;
        }
        tags[k].key = *key;
        tags[k].value = value;
        k++;
    }
    if (!has_id)
        return 0;
    if (node) {
        if (type_id < 0) {
            type_id = k++;
            tags[type_id].key.p = "type-id";
            tags[type_id].key.n = 7;
        }
        tags[type_id].value.p = zero;
        tags[type_id].value.n = 1;
    }
    if (!has_cluster) {
        tags[k].key.p = "cluster";
        tags[k].key.n = 7;
        tags[k].value = cluster;
        k++;
    }
    Py_ssize_t at = write_head(p->measurement, tags, k, buf);
    if (at == 0)
        return 0;
    *prefix = at;
    buf[at++] = ' ';
    memcpy(buf + at, p->seconds.p, (size_t)p->seconds.n);
    return at + p->seconds.n;
}

/* 1 when [s, s+n) is written as it stands in a tag set (no escape needed) and not empty */
static int plain(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (!lp_name_byte((unsigned char)s[i]))
            return 0;
    return n > 0;
}

/* The UTF-8 text of `text` in *span when it is a str (borrowed: its owner outlives the fold): 1, 0 when not
 * (or not encodable: the pure path decides). */
static int span_of(PyObject *text, lp_span *span) {
    if (!PyUnicode_Check(text))
        return 0;
    span->p = PyUnicode_AsUTF8AndSize(text, &span->n);
    if (span->p == NULL) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* A process `Line` the Python way placed (`_as_process`: its cluster and `type-id` already set; a tag value
 * that needs escapes, such as a `cmd` with a space, keeps a line from the scan's texts): its pieces in `p`,
 * its value in *ivalue or *fvalue, its seconds written in `seconds`, its cluster in *cluster. 1, 0 when the
 * pure path decides (a tag that needs escapes beyond `pid`/`ppid`/`cmd`, which are dropped, a value that is
 * no plain int64 or finite float, anything not a `Line`), -1 with an exception set. */
static int line_parts(PyObject *line, lp_parts *p, long long *ivalue, double *fvalue, char *seconds,
                      lp_span *cluster) {
    int sure = 0;
    PyObject *name = PyObject_GetAttrString(line, "measurement");
    PyObject *tags = name == NULL ? NULL : PyObject_GetAttrString(line, "tags");
    PyObject *fields = tags == NULL ? NULL : PyObject_GetAttrString(line, "fields");
    PyObject *time = fields == NULL ? NULL : PyObject_GetAttrString(line, "time");
    if (time == NULL) { /* not a `Line`: the pure path decides (and says what is wrong) */
        PyErr_Clear();
        goto done;
    }
    if (!span_of(name, &p->measurement) || !plain(p->measurement.p, p->measurement.n) ||
        !PyDict_CheckExact(tags) || !PyDict_CheckExact(fields) || !PyLong_CheckExact(time))
        goto done;
    long long t = PyLong_AsLongLong(time);
    if (t == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        goto done;
    }
    if (t < 0 || t > 999999999999999999LL)
        goto done;
    p->seconds.n = snprintf(seconds, 24, "%lld", t);
    p->seconds.p = seconds;
    PyObject *value = PyDict_GetItemString(fields, "value"); /* borrowed */
    if (value == NULL)
        goto done;
    if (PyLong_CheckExact(value)) {
        int overflow;
        *ivalue = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (*ivalue == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            goto done;
        }
        p->is_int = 1;
    } else if (PyFloat_CheckExact(value)) {
        *fvalue = PyFloat_AsDouble(value);
        if (!isfinite(*fvalue))
            goto done;
        p->is_int = 0;
    } else {
        goto done;
    }
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    int process = 0, has_cluster = 0;
    p->ntags = 0;
    while (PyDict_Next(tags, &pos, &key, &val)) {
        if (p->ntags == LP_MAX_TAGS)
            goto done;
        lp_span *k = &p->keys[p->ntags], *v = &p->values[p->ntags];
        if (!span_of(key, k) || !span_of(val, v))
            goto done;
        if (lp_equals(k->p, k->n, "pid") || lp_equals(k->p, k->n, "ppid") || lp_equals(k->p, k->n, "cmd"))
            continue; /* dropped by the fold: written nowhere */
        if (!plain(k->p, k->n) || !plain(v->p, v->n))
            goto done;
        if (lp_equals(k->p, k->n, "stype"))
            process = lp_equals(v->p, v->n, "process");
        if (lp_equals(k->p, k->n, "cluster")) {
            *cluster = *v;
            has_cluster = 1;
        }
        p->ntags++;
    }
    sure = process && has_cluster;
done:
    Py_XDECREF(name);
    Py_XDECREF(tags);
    Py_XDECREF(fields);
    Py_XDECREF(time);
    return sure;
}

enum how { HOW_SUM, HOW_AVG, HOW_MAX };

/* how `aggs` (measurement -> the registry's `agg`) folds the measurement [s, s+n): -1 with an exception set */
static int how_of(PyObject *aggs, const char *s, Py_ssize_t n) {
    PyObject *key = PyUnicode_DecodeASCII(s, n, NULL);
    if (key == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(aggs, key); /* borrowed */
    Py_DECREF(key);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : HOW_SUM;
    if (PyUnicode_Check(found)) {
        if (PyUnicode_CompareWithASCIIString(found, "max") == 0)
            return HOW_MAX;
        if (PyUnicode_CompareWithASCIIString(found, "avg") == 0)
            return HOW_AVG;
    }
    return HOW_SUM;
}

/* The folded value of `g` as `format_line` writes it after `stable_types` (in `text`): 1, 0 when the pure path
 * decides (an int sum beyond 2^53 for a float, a float for an int, inf), -1 with an exception set. */
static int value_text(const group *g, int how, int want, PyObject *sum, char *text, size_t size) {
    int is_int = g->is_int;
    long long i = g->ifirst;
    double x = g->ffirst;
    if (g->count > 1) {
        if (how == HOW_MAX) {
            i = g->imax;
            x = g->fmax;
        } else if (is_int) {
            i = g->isum;
            if (how == HOW_AVG) {
                if (i > EXACT_INT || i < -EXACT_INT)
                    return 0;
                x = (double)i / (double)g->count;
                is_int = 0;
            }
        } else {
            PyObject *total = PyObject_CallFunctionObjArgs(sum, g->floats, NULL);
            if (total == NULL)
                return -1;
            if (!PyFloat_Check(total)) {
                Py_DECREF(total);
                return 0;
            }
            x = PyFloat_AsDouble(total);
            Py_DECREF(total);
            if (how == HOW_AVG)
                x = x / (double)g->count;
        }
    }
    return number_text(is_int, i, x, want, text, size);
}

/* fold(processes, types, aggs) -> list[str] | None: the folded lines (`aggregate_processes`, then
 * `format_line(stable_types(line, types))` each) of the process lines `splice` kept, as `(text, tag)`, and of
 * the process `Line`s the Python way placed among them; None when the pure path decides the whole lot (a
 * `Line` whose tags need escapes, an int sum beyond int64, anything this file is not sure of). */
static PyObject *fold(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *processes, *types, *aggs;
    if (!PyArg_ParseTuple(args, "O!O!O!:fold", &PyList_Type, &processes, &PyDict_Type, &types, &PyDict_Type,
                          &aggs))
        return NULL;
    Py_ssize_t n_items = PyList_Size(processes);
    PyObject *index = NULL, *keys = NULL, *result = NULL, *sum = NULL, *builtins = NULL;
    group *groups = PyMem_Calloc(n_items > 0 ? (size_t)n_items : 1, sizeof(group));
    Py_ssize_t ngroups = 0;
    int sure = 1;
    if (groups == NULL)
        return PyErr_NoMemory();
    index = PyDict_New();
    keys = PyList_New(0);
    if (index == NULL || keys == NULL)
        goto error;
    char buf[WRITTEN_MAX + 128];
    lp_parts parts;
    for (Py_ssize_t it = 0; it < n_items && sure; it++) {
        PyObject *item = PyList_GetItem(processes, it); /* borrowed; nothing here runs Python code */
        if (item == NULL)
            goto error;
        Py_ssize_t prefix, key_n = 0;
        long long ivalue = 0;
        double fvalue = 0.0;
        char seconds[24];
        lp_span cluster;
        if (PyTuple_Check(item) && PyTuple_Size(item) == 2) { /* (text, tag) of the splice */
            PyObject *text = PyTuple_GetItem(item, 0), *tag = PyTuple_GetItem(item, 1);
            if (text == NULL || tag == NULL)
                goto error;
            lp_span line, tag_s;
            if (span_of(text, &line) && span_of(tag, &tag_s) && tag_s.n > 9 && tag_s.n <= TAG_MAX_BYTES &&
                memcmp(tag_s.p, ",cluster=", 9) == 0 && lp_read(line.p, line.n, SECONDS_MAX_DIGITS, &parts) &&
                is_process(&parts)) {
                if (parts.is_int)
                    ivalue = lp_int_of(parts.number);
                else if (!lp_float_of(parts.number, &fvalue))
                    goto error;
                cluster.p = tag_s.p + 9;
                cluster.n = tag_s.n - 9;
                key_n = fold_key(&parts, cluster, buf, &prefix);
            }
        } else { /* a `Line` of the Python way */
            int got = line_parts(item, &parts, &ivalue, &fvalue, seconds, &cluster);
            if (got < 0)
                goto error;
            if (got)
                key_n = fold_key(&parts, cluster, buf, &prefix);
        }
        for (Py_ssize_t b = 0; b < key_n; b++)
            if ((unsigned char)buf[b] < 0x20 || (unsigned char)buf[b] >= 0x7f)
                key_n = 0;
        if (key_n == 0) {
            sure = 0;
            break;
        }
        PyObject *key = PyUnicode_DecodeASCII(buf, key_n, NULL);
        if (key == NULL)
            goto error;
        PyObject *at = PyDict_GetItemWithError(index, key); /* borrowed */
        if (at == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            goto error;
        }
        if (at == NULL) {
            PyObject *number = PyLong_FromSsize_t(ngroups);
            int rc = number == NULL ? -1 : PyDict_SetItem(index, key, number);
            Py_XDECREF(number);
            if (rc < 0 || PyList_Append(keys, key) < 0) {
                Py_DECREF(key);
                goto error;
            }
            Py_DECREF(key);
            group *g = &groups[ngroups++];
            g->name = parts.measurement.n;
            g->prefix = prefix;
            g->count = 1;
            g->is_int = parts.is_int;
            g->ifirst = g->isum = g->imax = ivalue;
            g->ffirst = g->fmax = fvalue;
            continue;
        }
        Py_DECREF(key);
        group *g = &groups[PyLong_AsSsize_t(at)];
        if (g->is_int != parts.is_int) { /* ints and floats in one sum: Python's */
            sure = 0;
            break;
        }
        g->count++;
        if (g->is_int) {
            if (__builtin_add_overflow(g->isum, ivalue, &g->isum)) {
                sure = 0; /* beyond int64: Python's ints */
                break;
            }
            if (ivalue > g->imax)
                g->imax = ivalue;
            continue;
        }
        if (fvalue > g->fmax)
            g->fmax = fvalue;
        if (g->floats == NULL) {
            g->floats = PyList_New(0);
            if (g->floats == NULL || lp_append_new(g->floats, PyFloat_FromDouble(g->ffirst)) < 0)
                goto error;
        }
        if (lp_append_new(g->floats, PyFloat_FromDouble(fvalue)) < 0)
            goto error;
    }
    if (!sure) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    builtins = PyImport_ImportModule("builtins");
    sum = builtins == NULL ? NULL : PyObject_GetAttrString(builtins, "sum");
    result = PyList_New(0);
    if (sum == NULL || result == NULL)
        goto error;
    for (Py_ssize_t at = 0; at < ngroups; at++) {
        group *g = &groups[at];
        Py_ssize_t key_n;
        const char *key = PyUnicode_AsUTF8AndSize(PyList_GetItem(keys, at), &key_n);
        if (key == NULL)
            goto error;
        int want = wanted(types, key, g->name);
        int how = g->count > 1 ? how_of(aggs, key, g->name) : HOW_SUM;
        if (want < 0 || how < 0)
            goto error;
        char value[64];
        int got = want == KIND_UNSURE ? 0 : value_text(g, how, want, sum, value, sizeof value);
        if (got < 0)
            goto error;
        if (got == 0) {
            Py_DECREF(result);
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        size_t value_n = strlen(value);
        memcpy(buf, key, (size_t)g->prefix);
        memcpy(buf + g->prefix, " value=", 7);
        memcpy(buf + g->prefix + 7, value, value_n);
        memcpy(buf + g->prefix + 7 + value_n, key + g->prefix, (size_t)(key_n - g->prefix));
        if (lp_append_new(result, PyUnicode_DecodeASCII(buf, key_n + 7 + (Py_ssize_t)value_n, NULL)) < 0)
            goto error;
    }
    goto done;
error:
    Py_CLEAR(result);
done:
    for (Py_ssize_t at = 0; at < ngroups; at++)
        Py_XDECREF(groups[at].floats);
    PyMem_Free(groups);
    Py_XDECREF(index);
    Py_XDECREF(keys);
    Py_XDECREF(sum);
    Py_XDECREF(builtins);
    return result;
}

static PyMethodDef influxdb_methods[] = {
    {"splice", splice, METH_VARARGS,
     "splice(items: list[str | Line], tag: str, types: dict[str, type], aggregate: bool, out: list[str], "
     "other: Callable[[str | Line], object], processes: list | None = None) -> None: each canonical text the "
     "InfluxDB sink forwards as it came, with `tag` spliced in after its measurement, appended to `out`; each "
     "process line to fold appended to `processes` as (text, tag) when given; every other item handed to "
     "`other`, in order."},
    {"fold", fold, METH_VARARGS,
     "fold(processes: list[tuple[str, str] | Line], types: dict[str, type], aggs: dict[str, str]) -> "
     "list[str] | None: the process lines `splice` kept, folded per job and written as the pure path writes "
     "them; None when the pure path decides."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef influxdb_module = {
    PyModuleDef_HEAD_INIT, "_influxdb", "The InfluxDB sink's compiled splice and fold (see schemas/influxbody.py).",
    -1, influxdb_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__influxdb(void) { return PyModule_Create(&influxdb_module); }
