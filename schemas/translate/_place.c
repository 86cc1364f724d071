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
 * A line is taken only when it has exactly this shape, every byte of it printable ASCII, at most 1024 bytes
 * (the pure path's `TAG_VALUE_MAX` check of every tag and the measurement):
 *     measurement(,key=value)+ value=NUMBER SECONDS
 * with no escape, quote, '=' or '#' anywhere but the separators; a `hostname` that `names.is_host` accepts;
 * `type` one of the levels, with a `type-id`, or `type=node` in its bus form (no `type-id`, or its `stype`
 * as `type-id`); `cluster` a host-like name, `job` a job id (`names`); no other host tag (`host`, `node`,
 * `nodename`), no tag key given twice, no tag key `value`; NUMBER `-?D+(.D+)?` (a float, at most 64 bytes)
 * or `-?D{1,18}i` (an int); SECONDS at most 10 digits with earliest <= SECONDS < end. These are the rules
 * of `schemas/lineprotocol/_scan.c` (the InfluxDB sink's scan, which returns the text instead of a `Line`;
 * kept apart so that each extension can change without the other). Anything else is handed to the pure
 * path: this file decides nothing the pure path would decide otherwise.
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
#include <string.h>

#define LINE_MAX_BYTES 1024
#define HOST_MAX 253
#define CLUSTER_MAX 253
#define JOB_ID_MAX 64
#define FLOAT_MAX_BYTES 64
#define MAX_TAGS 32
#define CACHE_SLOTS 4096 /* at most; a power of two, at most 3/4 of it filled, then names are made afresh */

/* a byte a measurement, tag key or tag value may hold here: printable ASCII without separators, escapes,
 * quotes, '=' and '#' (a line starting with '#' is a comment; elsewhere it is left to the pure path too) */
static int name_byte(unsigned char c) {
    return c > 0x20 && c < 0x7f && c != ',' && c != '=' && c != ' ' && c != '\\' && c != '"' && c != '#';
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* `names._HOST`: dot-separated labels of [A-Za-z0-9_-], none empty, none starting with '-' */
static int host_like(const char *s, Py_ssize_t n, Py_ssize_t limit) {
    if (n == 0 || n > limit)
        return 0;
    int start = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '.') {
            if (start)
                return 0;
            start = 1;
            continue;
        }
        int alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_';
        if (!alnum && !(c == '-' && !start))
            return 0;
        start = 0;
    }
    return !start;
}

/* `names.job_id_problem(...) is None`: [A-Za-z0-9_.+:@[]-]{1,64}, not '.', no '..' */
static int job_id(const char *s, Py_ssize_t n) {
    if (n == 0 || n > JOB_ID_MAX)
        return 0;
    if (n == 1 && s[0] == '.')
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_' || c == '.' ||
                 c == '+' || c == ':' || c == '@' || c == '[' || c == ']' || c == '-';
        if (!ok)
            return 0;
        if (c == '.' && i > 0 && s[i - 1] == '.')
            return 0;
    }
    return 1;
}

static int equals(const char *s, Py_ssize_t n, const char *word) {
    size_t w = strlen(word);
    return (size_t)n == w && memcmp(s, word, w) == 0;
}

static int level_known(const char *s, Py_ssize_t n) {
    static const char *levels[] = {"node", "socket", "die", "memoryDomain", "llc", "core", "hwthread",
                                   "accelerator"};
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (equals(s, n, levels[i]))
            return 1;
    return 0;
}

typedef struct {
    const char *p;
    Py_ssize_t n;
} span;

/* what `canonical` found in a line it takes */
typedef struct {
    span measurement;
    span keys[MAX_TAGS];
    span values[MAX_TAGS];
    int ntags;
    span number; /* without the `i` of an int */
    int is_int;
    long long ts;
} parts;

/* 1 when the line [s, s+n) is taken (see the contract above), its pieces in `out` */
static int canonical(const char *s, Py_ssize_t n, long long earliest, long long end, parts *out) {
    if (n > LINE_MAX_BYTES)
        return 0;
    Py_ssize_t i = 0;
    while (i < n && name_byte((unsigned char)s[i]))
        i++;
    if (i == 0 || i >= n || s[i] != ',')
        return 0; /* a metric line here has tags (hostname and type at least) */
    out->measurement.p = s;
    out->measurement.n = i;
    span *keys = out->keys;
    int ntags = 0;
    span host = {NULL, 0}, level = {NULL, 0}, type_id = {NULL, 0}, stype = {NULL, 0};
    int has_type_id = 0, has_stype = 0;
    while (i < n && s[i] == ',') {
        i++;
        Py_ssize_t k = i;
        while (i < n && name_byte((unsigned char)s[i]))
            i++;
        Py_ssize_t klen = i - k;
        if (klen == 0 || i >= n || s[i] != '=')
            return 0;
        i++;
        Py_ssize_t v = i;
        while (i < n && name_byte((unsigned char)s[i]))
            i++;
        Py_ssize_t vlen = i - v;
        if (vlen == 0 || i >= n || (s[i] != ',' && s[i] != ' '))
            return 0;
        if (ntags == MAX_TAGS)
            return 0;
        for (int t = 0; t < ntags; t++)
            if (keys[t].n == klen && memcmp(keys[t].p, s + k, (size_t)klen) == 0)
                return 0;
        keys[ntags].p = s + k;
        keys[ntags].n = klen;
        out->values[ntags].p = s + v;
        out->values[ntags].n = vlen;
        ntags++;
        const char *key = s + k, *val = s + v;
        if (equals(key, klen, "hostname")) {
            if (!host_like(val, vlen, HOST_MAX))
                return 0;
            host.p = val;
            host.n = vlen;
        } else if (equals(key, klen, "type")) {
            level.p = val;
            level.n = vlen;
        } else if (equals(key, klen, "type-id")) {
            type_id.p = val;
            type_id.n = vlen;
            has_type_id = 1;
        } else if (equals(key, klen, "stype")) {
            stype.p = val;
            stype.n = vlen;
            has_stype = 1;
        } else if (equals(key, klen, "cluster")) {
            if (!host_like(val, vlen, CLUSTER_MAX))
                return 0;
        } else if (equals(key, klen, "job")) {
            if (!job_id(val, vlen))
                return 0;
        } else if (equals(key, klen, "host") || equals(key, klen, "node") || equals(key, klen, "nodename") ||
                   equals(key, klen, "value")) {
            return 0;
        }
    }
    out->ntags = ntags;
    if (host.p == NULL || level.p == NULL || !level_known(level.p, level.n))
        return 0;
    if (equals(level.p, level.n, "node")) {
        /* the bus form (`model.node_level_tags` changes nothing) */
        if (has_stype && stype.n > 0) {
            if (!has_type_id || type_id.n != stype.n || memcmp(type_id.p, stype.p, (size_t)stype.n) != 0)
                return 0;
        } else if (has_type_id) {
            return 0;
        }
    } else if (!has_type_id) {
        return 0;
    }
    /* the field: ` value=NUMBER` */
    if (i >= n || s[i] != ' ' || n - i < 8 || memcmp(s + i, " value=", 7) != 0)
        return 0;
    i += 7;
    Py_ssize_t v = i;
    if (i < n && s[i] == '-')
        i++;
    Py_ssize_t d = i;
    while (i < n && is_digit((unsigned char)s[i]))
        i++;
    if (i == d || i >= n)
        return 0;
    out->number.p = s + v;
    if (s[i] == 'i') {
        if (i - d > 18)
            return 0;
        out->number.n = i - v;
        out->is_int = 1;
        i++;
    } else {
        if (s[i] == '.') {
            i++;
            Py_ssize_t f = i;
            while (i < n && is_digit((unsigned char)s[i]))
                i++;
            if (i == f)
                return 0;
        }
        if (i - v > FLOAT_MAX_BYTES)
            return 0;
        out->number.n = i - v;
        out->is_int = 0;
    }
    /* ` SECONDS` and the end of the line */
    if (i >= n || s[i] != ' ')
        return 0;
    i++;
    if (n - i < 1 || n - i > 10)
        return 0;
    long long ts = 0;
    for (; i < n; i++) {
        if (!is_digit((unsigned char)s[i]))
            return 0;
        ts = ts * 10 + (s[i] - '0');
    }
    out->ts = ts;
    return earliest <= ts && ts < end;
}

/* `parse._plain_ascii`: ASCII without control characters other than '\n' and the '\r' of a CRLF */
static int plain_ascii(const char *buf, Py_ssize_t size) {
    for (Py_ssize_t i = 0; i < size; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c >= 0x20 && c < 0x7f)
            continue;
        if (c == '\n' || (c == '\r' && i + 1 < size && buf[i + 1] == '\n'))
            continue;
        return 0;
    }
    return 1;
}

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
static PyObject *number_of(const span *number, int is_int) {
    const char *s = number->p;
    Py_ssize_t n = number->n, i = 0;
    if (is_int) {
        int negative = s[0] == '-';
        long long v = 0;
        for (i = negative; i < n; i++)
            v = v * 10 + (s[i] - '0'); /* at most 18 digits: no overflow */
        return PyLong_FromLongLong(negative ? -v : v);
    }
    char text[FLOAT_MAX_BYTES + 1];
    memcpy(text, s, (size_t)n);
    text[n] = '\0';
    char *stop = NULL;
    double v = PyOS_string_to_double(text, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred())
        return NULL;
    if (stop != text + n) {
        PyErr_SetString(PyExc_ValueError, "float text not read whole"); /* not reached: the grammar is strict */
        return NULL;
    }
    return PyFloat_FromDouble(v);
}

static int same_span(const span *a, const span *b) {
    return a->n == b->n && memcmp(a->p, b->p, (size_t)a->n) == 0;
}

/* the tags dict of a taken line, a new reference or NULL with an exception. `prev` is the previous taken
 * line of the payload and `prev_tags` its dict (or NULL): a node's lines come in runs with the same tag keys
 * (the ~10 lines of a process, the lines of a GPU), and such a line starts from a copy of the previous
 * line's dict (its keys in the same order), setting only the values that differ. */
static PyObject *tags_of(const parts *pt, const parts *prev, PyObject *prev_tags, cache *c) {
    int same_keys = prev_tags != NULL && prev->ntags == pt->ntags;
    for (int t = 0; same_keys && t < pt->ntags; t++)
        same_keys = same_span(&pt->keys[t], &prev->keys[t]);
    PyObject *tags = same_keys ? PyDict_Copy(prev_tags) : PyDict_New();
    if (tags == NULL)
        return NULL;
    for (int t = pt->ntags - 1; t >= 0; t--) { /* the parser's order: last tag first */
        if (same_keys && same_span(&pt->values[t], &prev->values[t]))
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
static PyObject *line_of(const parts *pt, PyObject *tags, cache *c, PyObject *line_type, PyObject *value_key) {
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
    int plain = plain_ascii(buf, size);
    Py_ssize_t start = 0, number = 0, rest = 0;
    parts both[2], *pt = &both[0], *prev = &both[1];
    PyObject *prev_tags = NULL; /* the tags dict of the previous taken line */
    while (start <= size) {
        const char *nl = memchr(buf + start, '\n', (size_t)(size - start));
        Py_ssize_t stop = nl ? nl - buf : size;
        number++;
        Py_ssize_t len = stop - start;
        /* a CRLF line end: the pure path reads the line without it in a plain payload */
        Py_ssize_t text = plain && len > 0 && buf[stop - 1] == '\r' ? len - 1 : len;
        if (len > 0) {
            PyObject *item;
            if (canonical(buf + start, text, earliest, end, pt)) {
                PyObject *tags = tags_of(pt, prev, prev_tags, &names);
                item = tags == NULL ? NULL : line_of(pt, tags, &names, line_type, value_key);
                Py_XDECREF(prev_tags);
                prev_tags = tags; /* NULL after an error: the loop ends below */
                parts *swap = prev;
                prev = pt;
                pt = swap;
            } else {
                item = PyLong_FromSsize_t(number);
                rest++;
            }
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                Py_DECREF(value_key);
                Py_XDECREF(prev_tags);
                cache_clear(&names);
                return NULL;
            }
            Py_DECREF(item);
        }
        if (nl == NULL)
            break;
        start = stop + 1;
    }
    Py_DECREF(value_key);
    Py_XDECREF(prev_tags);
    cache_clear(&names);
    return Py_BuildValue("(Nni)", out, rest, plain); /* N: the tuple takes `out` over */
}

static PyMethodDef methods[] = {
    {"read", read_payload, METH_VARARGS,
     "read(payload: bytes, earliest: int, end: int, line_type: type) -> (list[Line | int], int, bool): "
     "per non-empty line, its Line when it is a canonical metric line, else its line number (for the pure "
     "path); how many line numbers; whether the payload is plain ASCII."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_place", "The compiled reading of the LP -> Sonar translator (see lp_read.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__place(void) { return PyModule_Create(&module); }
