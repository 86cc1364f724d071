/* hpcbus.schemas.lineprotocol._scan: the compiled fast path of `schemas.lineprotocol.scan`.
 *
 * Why C: per-line str/dict work and building Python objects are what the pure path spends its time on, and
 * mypyc does not remove them (measured: issue 24). This scan builds no Python object for a line it takes:
 * the line's text is its output.
 *
 * Contract (the pure twin is `scan.scan_pure`, built on `parse.parse_payload`): returns (items, rest, plain):
 * rest the number of int items, plain whether the payload is printable ASCII but for its line ends (as
 * `parse._plain_ascii` says: the pure path then keeps a CRLF line's text without its '\r'); for each line
 * of `payload` (split at '\n'), in order, one item:
 *   - str: the line's text, when it is a canonical metric line the pure path keeps as it came (its
 *     `Parsed.texts` entry is this text, no problem, no warning);
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
 * or `-?D{1,18}i` (an int); SECONDS at most 10 digits with earliest <= SECONDS < end. Anything else is
 * handed to the pure path: this file decides nothing the pure path would decide otherwise.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define LINE_MAX_BYTES 1024
#define HOST_MAX 253
#define CLUSTER_MAX 253
#define JOB_ID_MAX 64
#define FLOAT_MAX_BYTES 64
#define MAX_TAGS 32

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

/* 1 when the line [s, s+n) is taken (see the contract above) */
static int canonical(const char *s, Py_ssize_t n, long long earliest, long long end) {
    if (n > LINE_MAX_BYTES)
        return 0;
    Py_ssize_t i = 0;
    while (i < n && name_byte((unsigned char)s[i]))
        i++;
    if (i == 0 || i >= n || s[i] != ',')
        return 0; /* a metric line here has tags (hostname and type at least) */
    span keys[MAX_TAGS];
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
    if (s[i] == 'i') {
        if (i - d > 18)
            return 0;
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

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *payload;
    long long earliest, end;
    if (!PyArg_ParseTuple(args, "OLL:scan", &payload, &earliest, &end))
        return NULL;
    char *buf;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(payload, &buf, &size) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    int plain = plain_ascii(buf, size);
    Py_ssize_t start = 0, number = 0, rest = 0;
    while (start <= size) {
        const char *nl = memchr(buf + start, '\n', (size_t)(size - start));
        Py_ssize_t stop = nl ? nl - buf : size;
        number++;
        Py_ssize_t len = stop - start;
        /* a CRLF line end: the pure path keeps the text without it in a plain payload only */
        Py_ssize_t text = plain && len > 0 && buf[stop - 1] == '\r' ? len - 1 : len;
        if (len > 0) {
            PyObject *item;
            if (canonical(buf + start, text, earliest, end)) {
                item = PyUnicode_DecodeASCII(buf + start, text, NULL);
            } else {
                item = PyLong_FromSsize_t(number);
                rest++;
            }
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
        if (nl == NULL)
            break;
        start = stop + 1;
    }
    return Py_BuildValue("(Nni)", out, rest, plain); /* N: the tuple takes `out` over */
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(payload: bytes, earliest: int, end: int) -> (list[str | int], int, bool): per non-empty line, "
     "its text when it is a canonical metric line taken as it came, else its line number (for the pure "
     "path); how many line numbers; whether the payload is plain ASCII."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan", "The compiled line-protocol scan (see scan.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
