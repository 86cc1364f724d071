/* schemas/_lineshape.h: the canonical line-protocol shape, written once for the C extensions that read it.
 *
 * Why one header: the line scan of the InfluxDB sink (`lineprotocol/_scan.c`), the LP -> Sonar read
 * (`translate/_place.c`) and the sink's cluster splice (`_influxdb.c`) all take a line only when it has the
 * shape the pure path is sure to keep as it came, and hand everything else to the pure path. Were the rules
 * copied into each, a fix to one copy would leave the others taking a line the pure path decides otherwise.
 * Everything here is `static inline` (each extension is one translation unit on the stable ABI: no symbol
 * is shared at link time) and pure C over bytes, but for the module / list helpers at the end.
 *
 * The shape (a line the extensions take; each adds its own checks on top, see their heads):
 *     measurement(,key=value)+ value=NUMBER SECONDS
 * every byte printable ASCII, no escape, quote, '=' or '#' anywhere but the separators (so `parse_line`
 * reads every name exactly as it stands), NUMBER `-?D{1,18}i` (an int) or `-?D+(.D+)?` (a float, at most
 * 64 bytes), SECONDS only digits.
 *
 * Include after <Python.h> (Py_LIMITED_API and PY_SSIZE_T_CLEAN defined before it).
 */
#ifndef HPCBUS_LINESHAPE_H
#define HPCBUS_LINESHAPE_H

#include <string.h>

#include "_names.h"

#define LP_LINE_MAX_BYTES 1024 /* the pure path's `TAG_VALUE_MAX` check of every tag and the measurement */
#define LP_HOST_MAX 253
#define LP_CLUSTER_MAX 253
#define LP_FLOAT_MAX_BYTES 64
#define LP_INT_MAX_DIGITS 18 /* fits a long long, whatever the digits */
#define LP_SECONDS_MAX_DIGITS 10
#define LP_MAX_TAGS 32

/* --- bytes and names ------------------------------------------------------------------------------------ */

/* a byte a measurement, tag key or tag value may hold here: printable ASCII without separators, escapes,
 * quotes, '=' and '#' (a line starting with '#' is a comment; elsewhere it is left to the pure path too) */
static const unsigned char LP_NAME_BYTES[256] = {
    /* a table: one load a byte, where the comparisons cost half a line's scan (perf) */
    [0x21] = 1,          /* ! (then '"' and '#' are not) */
    [0x24 ... 0x2b] = 1, /* $ to + (then ',') */
    [0x2d ... 0x3c] = 1, /* - to < (then '=') */
    [0x3e ... 0x5b] = 1, /* > to [ (then '\\') */
    [0x5d ... 0x7e] = 1, /* ] to ~ */
};

static inline int lp_name_byte(unsigned char c) { return LP_NAME_BYTES[c]; }

static inline int lp_is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* always inlined: `word` is a literal, so its length is a constant and the comparison a few instructions */
#define LP_INLINE static inline __attribute__((always_inline))

LP_INLINE int lp_equals(const char *s, Py_ssize_t n, const char *word) {
    size_t w = strlen(word);
    return (size_t)n == w && memcmp(s, word, w) == 0;
}

typedef struct {
    const char *p;
    Py_ssize_t n;
} lp_span;

static inline int lp_same_span(const lp_span *a, const lp_span *b) {
    return a->n == b->n && memcmp(a->p, b->p, (size_t)a->n) == 0;
}

/* `names._HOST`: dot-separated labels of [A-Za-z0-9_-], none empty, none starting with '-' */
static inline int lp_host_like(const char *s, Py_ssize_t n, Py_ssize_t limit) {
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
        int alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || lp_is_digit(c) || c == '_';
        if (!alnum && !(c == '-' && !start))
            return 0;
        start = 0;
    }
    return !start;
}

/* one of the ClusterCockpit levels (`model.LEVELS`) */
static inline int lp_level_known(const char *s, Py_ssize_t n) {
    static const char *levels[] = {"node", "socket", "die", "memoryDomain", "llc", "core", "hwthread",
                                   "accelerator"};
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (lp_equals(s, n, levels[i]))
            return 1;
    return 0;
}

/* --- the pieces of a line, left to right ---------------------------------------------------------------- */

/* The measurement's length when the line [s, s+n) starts with a measurement followed by ',' (a metric line
 * here has tags), else 0. */
static inline Py_ssize_t lp_measurement(const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && lp_name_byte((unsigned char)s[i]))
        i++;
    return i == 0 || i >= n || s[i] != ',' ? 0 : i;
}

/* The tag `,key=value` at s[*at] (which is ','): 1 with its key and value, *at on the ',' or ' ' after it;
 * 0 when it is not of the shape. */
static inline int lp_tag(const char *s, Py_ssize_t n, Py_ssize_t *at, lp_span *key, lp_span *value) {
    Py_ssize_t i = *at + 1, k = i;
    while (i < n && lp_name_byte((unsigned char)s[i]))
        i++;
    if (i == k || i >= n || s[i] != '=')
        return 0;
    Py_ssize_t v = ++i;
    while (i < n && lp_name_byte((unsigned char)s[i]))
        i++;
    if (i == v || i >= n || (s[i] != ',' && s[i] != ' '))
        return 0;
    key->p = s + k;
    key->n = v - 1 - k;
    value->p = s + v;
    value->n = i - v;
    *at = i;
    return 1;
}

enum lp_number { LP_NOT_A_NUMBER = 0, LP_FLOAT, LP_INT };

/* The field ` value=NUMBER` at s[*at]: its kind (LP_INT for `-?D{1,18}i`, LP_FLOAT for `-?D+(.D+)?` of at
 * most 64 bytes), `number` its text without the `i`, *at just after it; LP_NOT_A_NUMBER when it is not of
 * the shape. */
static inline enum lp_number lp_value_field(const char *s, Py_ssize_t n, Py_ssize_t *at, lp_span *number) {
    Py_ssize_t i = *at;
    if (i >= n || n - i < 8 || memcmp(s + i, " value=", 7) != 0)
        return LP_NOT_A_NUMBER;
    i += 7;
    Py_ssize_t v = i;
    if (s[i] == '-')
        i++;
    Py_ssize_t d = i;
    while (i < n && lp_is_digit((unsigned char)s[i]))
        i++;
    if (i == d || i >= n)
        return LP_NOT_A_NUMBER;
    number->p = s + v;
    if (s[i] == 'i') {
        if (i - d > LP_INT_MAX_DIGITS)
            return LP_NOT_A_NUMBER;
        number->n = i - v;
        *at = i + 1;
        return LP_INT;
    }
    if (s[i] == '.') {
        i++;
        Py_ssize_t f = i;
        while (i < n && lp_is_digit((unsigned char)s[i]))
            i++;
        if (i == f)
            return LP_NOT_A_NUMBER;
    }
    if (i - v > LP_FLOAT_MAX_BYTES)
        return LP_NOT_A_NUMBER;
    number->n = i - v;
    *at = i;
    return LP_FLOAT;
}

/* The value of the int text `number` of `lp_value_field` (at most 18 digits: no overflow), sign and all. */
static inline long long lp_int_of(lp_span number) {
    long long v = 0;
    Py_ssize_t i = number.p[0] == '-';
    for (; i < number.n; i++)
        v = v * 10 + (number.p[i] - '0');
    return number.p[0] == '-' ? -v : v;
}

/* 1 with the double `float(text)` (`parse_line`'s too: correctly rounded) of the float text `number` of
 * `lp_value_field` in *x; 0 with an exception set. */
static inline int lp_float_of(lp_span number, double *x) {
    char text[LP_FLOAT_MAX_BYTES + 1], *stop = NULL;
    memcpy(text, number.p, (size_t)number.n);
    text[number.n] = '\0';
    *x = PyOS_string_to_double(text, &stop, NULL);
    if (*x == -1.0 && PyErr_Occurred())
        return 0;
    if (stop != text + number.n) { /* not reached: the grammar is strict */
        PyErr_SetString(PyExc_ValueError, "float text not read whole");
        return 0;
    }
    return 1;
}

/* ` SECONDS` at s[i] up to the end of the line: 1 with its value in *ts when SECONDS is 1 to `max_digits`
 * digits (at most 19: an unsigned long long holds them), else 0. */
static inline int lp_seconds(const char *s, Py_ssize_t n, Py_ssize_t i, Py_ssize_t max_digits,
                             unsigned long long *ts) {
    if (i >= n || s[i] != ' ')
        return 0;
    i++;
    if (n - i < 1 || n - i > max_digits)
        return 0;
    unsigned long long t = 0;
    for (; i < n; i++) {
        if (!lp_is_digit((unsigned char)s[i]))
            return 0;
        t = t * 10 + (unsigned long long)(s[i] - '0');
    }
    *ts = t;
    return 1;
}

/* 1 when key `a` sorts before key `b` as Python sorts str (bytes, for the ASCII of a name): how `format_line`
 * orders tags. Keys are short: a loop, not a call. */
static inline int lp_key_before(const lp_span *a, const lp_span *b) {
    Py_ssize_t c = 0, common = a->n < b->n ? a->n : b->n;
    while (c < common && a->p[c] == b->p[c])
        c++;
    return c < common ? (unsigned char)a->p[c] < (unsigned char)b->p[c] : a->n < b->n;
}

/* --- a line of the shape, read whole --------------------------------------------------------------------- */

/* what `lp_read` found in a line */
typedef struct {
    lp_span measurement;
    lp_span keys[LP_MAX_TAGS];
    lp_span values[LP_MAX_TAGS];
    int ntags;
    lp_span number; /* without the `i` of an int */
    int is_int;
    lp_span seconds;
    long long ts; /* SECONDS' value, when it has at most 18 digits */
} lp_parts;

/* 1 when [s, s+n) is a line of the shape (at most 1024 bytes) with at most 32 tags, no tag key given twice (so
 * `parse_line`'s dict holds every tag as it stands) and SECONDS of 1 to `max_digits` digits (at most 19); its
 * pieces in `out`. */
static inline int lp_read(const char *s, Py_ssize_t n, Py_ssize_t max_digits, lp_parts *out) {
    if (n > LP_LINE_MAX_BYTES)
        return 0;
    Py_ssize_t i = lp_measurement(s, n);
    if (i == 0)
        return 0;
    out->measurement.p = s;
    out->measurement.n = i;
    int ntags = 0, sorted = 1;
    while (i < n && s[i] == ',') {
        lp_span *key = &out->keys[ntags];
        if (ntags == LP_MAX_TAGS || !lp_tag(s, n, &i, key, &out->values[ntags]))
            return 0;
        /* keys in ascending order (how `format_line` writes them) are unique: one comparison a tag; any
         * other order, each key against all before it */
        if (sorted && ntags > 0)
            sorted = lp_key_before(key - 1, key);
        if (!sorted)
            for (int t = 0; t < ntags; t++)
                if (lp_same_span(&out->keys[t], key))
                    return 0;
        ntags++;
    }
    out->ntags = ntags;
    enum lp_number kind = lp_value_field(s, n, &i, &out->number);
    unsigned long long ts;
    if (kind == LP_NOT_A_NUMBER || !lp_seconds(s, n, i, max_digits, &ts))
        return 0;
    out->is_int = kind == LP_INT;
    out->seconds.p = s + i + 1;
    out->seconds.n = n - i - 1;
    out->ts = (long long)ts; /* exact up to 18 digits */
    return 1;
}

/* the value of tag `key` of `p` in *value: 1, 0 when `p` has no such tag */
LP_INLINE int lp_tag_of(const lp_parts *p, const char *key, lp_span *value) {
    for (int t = 0; t < p->ntags; t++) {
        if (lp_equals(p->keys[t].p, p->keys[t].n, key)) {
            *value = p->values[t];
            return 1;
        }
    }
    return 0;
}

/* --- the canonical metric line (`_scan.c`, `_place.c`) -------------------------------------------------- */

/* 1 when the line [s, s+n) is a canonical metric line the pure path keeps as it came, its pieces in `out`:
 * the shape above (`lp_read`), a measurement `names.measurement_problem` accepts, a `hostname` that
 * `names.is_host` accepts, `type-id` and `stype` device ids (`names.device_id_problem`); `type` one of the levels,
 * with a `type-id`, or `type=node` in its bus form (no `type-id`, or its `stype` as `type-id`); `cluster` a
 * host-like name, `job` a job id (`names`); no other host tag (`host`, `node`, `nodename`), no tag key
 * `value`; SECONDS at most 10 digits with earliest <= SECONDS < end. */
static inline int lp_canonical(const char *s, Py_ssize_t n, long long earliest, long long end, lp_parts *out) {
    if (!lp_read(s, n, LP_SECONDS_MAX_DIGITS, out) || !lp_measurement_name(out->measurement.p, out->measurement.n))
        return 0;
    lp_span host = {NULL, 0}, level = {NULL, 0}, type_id = {NULL, 0}, stype = {NULL, 0};
    int has_type_id = 0, has_stype = 0;
    for (int t = 0; t < out->ntags; t++) {
        lp_span key = out->keys[t], val = out->values[t];
        if (lp_equals(key.p, key.n, "hostname")) {
            if (!lp_host_like(val.p, val.n, LP_HOST_MAX))
                return 0;
            host = val;
        } else if (lp_equals(key.p, key.n, "type")) {
            level = val;
        } else if (lp_equals(key.p, key.n, "type-id")) {
            if (!lp_device_id(val.p, val.n))
                return 0;
            type_id = val;
            has_type_id = 1;
        } else if (lp_equals(key.p, key.n, "stype")) {
            if (!lp_device_id(val.p, val.n))
                return 0;
            stype = val;
            has_stype = 1;
        } else if (lp_equals(key.p, key.n, "cluster")) {
            if (!lp_host_like(val.p, val.n, LP_CLUSTER_MAX))
                return 0;
        } else if (lp_equals(key.p, key.n, "job")) {
            if (!lp_job_id(val.p, val.n))
                return 0;
        } else if (lp_equals(key.p, key.n, "host") || lp_equals(key.p, key.n, "node") ||
                   lp_equals(key.p, key.n, "nodename") || lp_equals(key.p, key.n, "value")) {
            return 0;
        }
    }
    if (host.p == NULL || level.p == NULL || !lp_level_known(level.p, level.n))
        return 0;
    if (lp_equals(level.p, level.n, "node")) {
        /* the bus form (`model.node_level_tags` changes nothing) */
        if (has_stype && stype.n > 0) {
            if (!has_type_id || !lp_same_span(&type_id, &stype))
                return 0;
        } else if (has_type_id) {
            return 0;
        }
    } else if (!has_type_id) {
        return 0;
    }
    return earliest <= out->ts && out->ts < end;
}

/* --- a payload, line by line (`_scan.c`, `_place.c`) ---------------------------------------------------- */

/* `parse._plain_ascii`: ASCII without control characters other than '\n' and the '\r' of a CRLF */
static inline int lp_plain_ascii(const char *buf, Py_ssize_t size) {
    const unsigned long long ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    for (Py_ssize_t i = 0; i < size; i++) {
        /* eight bytes at a time while none is below 0x20, 0x7f or above (exact for "any": bit tricks
         * `hasless` and `haszero`); a word with one (a line's '\n') is read byte by byte below */
        while (i + 8 <= size) {
            unsigned long long w, del;
            memcpy(&w, buf + i, 8);
            del = w ^ (0x7f * ones);
            if (((w - 0x20 * ones) & ~w & highs) | (w & highs) | ((del - ones) & ~del & highs))
                break;
            i += 8;
        }
        if (i >= size)
            break;
        unsigned char c = (unsigned char)buf[i];
        if (c >= 0x20 && c < 0x7f)
            continue;
        if (c == '\n' || (c == '\r' && i + 1 < size && buf[i + 1] == '\n'))
            continue;
        return 0;
    }
    return 1;
}

/* The lines of a payload (split at '\n'), as the pure path numbers them. */
typedef struct {
    const char *buf;
    Py_ssize_t size;
    Py_ssize_t start;  /* where the next line starts */
    Py_ssize_t number; /* the number (1-based) of the line `lp_next_line` gave last */
    int plain;         /* `parse._plain_ascii` of the payload */
    int done;
} lp_lines;

static inline void lp_lines_of(lp_lines *it, const char *buf, Py_ssize_t size) {
    it->buf = buf;
    it->size = size;
    it->start = 0;
    it->number = 0;
    it->plain = lp_plain_ascii(buf, size);
    it->done = 0;
}

/* The next line that is not empty (the pure path skips empty lines without a word): 1 with its text in
 * [*line, *line + *len), without the '\r' of a CRLF line end in a plain payload (where the pure path reads
 * the line without it); 0 after the last. */
static inline int lp_next_line(lp_lines *it, const char **line, Py_ssize_t *len) {
    while (!it->done) {
        Py_ssize_t start = it->start;
        const char *nl = memchr(it->buf + start, '\n', (size_t)(it->size - start));
        Py_ssize_t stop = nl ? nl - it->buf : it->size;
        it->number++;
        if (nl == NULL)
            it->done = 1;
        else
            it->start = stop + 1;
        Py_ssize_t n = stop - start;
        if (n > 0) {
            *line = it->buf + start;
            /* the pure path measures the line with its '\r' (`len(raw)`): one over the limit only by it keeps
             * it, so that lp_canonical refuses it too */
            *len = it->plain && it->buf[stop - 1] == '\r' && n <= LP_LINE_MAX_BYTES ? n - 1 : n;
            return 1;
        }
    }
    return 0;
}

/* --- Python objects ------------------------------------------------------------------------------------- */

/* Appends `item` (a new reference, or NULL after an error) to `list` and drops the reference: 0, or -1 with
 * an exception set. */
static inline int lp_append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* The module `NAME` (an identifier: `_scan`) with its one function `FUNC` (a METH_VARARGS C function) under
 * the Python name `FUNC_NAME`, and its init function `PyInit_NAME`: what each extension here exports. */
#define LP_EXTENSION(NAME, DOC, FUNC_NAME, FUNC, FUNC_DOC)                                                   \
    static PyMethodDef NAME##_methods[] = {                                                                \
        {FUNC_NAME, FUNC, METH_VARARGS, FUNC_DOC},                                                         \
        {NULL, NULL, 0, NULL},                                                                             \
    };                                                                                                     \
    static struct PyModuleDef NAME##_module = {                                                            \
        PyModuleDef_HEAD_INIT, #NAME, DOC, -1, NAME##_methods, NULL, NULL, NULL, NULL,                     \
    };                                                                                                     \
    PyMODINIT_FUNC PyInit_##NAME(void) { return PyModule_Create(&NAME##_module); }

#endif /* HPCBUS_LINESHAPE_H */
