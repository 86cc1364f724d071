/* hpcbus.schemas.slurm.sacct._sacct: the compiled fast path of the sacct reader (`schemas.slurm.sacct`).
 *
 * Why C: the pure path spends its time in per-field interpreter work (a regex and a few int() calls per
 * column, a dict of keyword arguments, then the same again per record in `to_slurm_job`); none of it is
 * left to remove in Python (issue 24). Here one call splits a line and parses every column, and one call
 * renders a row.
 *
 * Contract (the pure twins are `parse._parse_line` and `render.to_slurm_job`):
 *   - `plan(columns, delimiter, trailing, joinable, row_type, jobid_type, time_parse, defaults, datetime,
 *     tzinfo)` -> a capsule holding what `row`/`rows` need for one `parse_sacct` call (`columns`: per column
 *     (kind, position of its SacctRow attribute, of the second one or -1, name), kind one of the names in
 *     `KINDS` below, at most `MAX_COLUMNS`; `defaults`: SacctRow's defaults up to `extra`, its last field:
 *     rows are built positionally);
 *   - `row(plan, line, lineno)` -> the `SacctRow` the pure path gives for this line, or None: the pure path
 *     decides the line (it may still accept it, or name its problem); `rows` does the same for the lines of
 *     a whole text (split as `str.splitlines` splits it: `lines_plain` says when it can), a chunk a call;
 *   - `renderer(...)` -> a capsule, `render(renderer, row)` -> the `SlurmJob` that `to_slurm_job(row)` gives
 *     (default mode, no zone, no requested resources), or None: the pure path renders it (or raises). A
 *     record is a copy of a template record with its other fields set (fresh lists in each).
 * Every value is parsed exactly as the pure parser of its column parses it; whatever this file is not sure
 * of (non-ASCII in a parsed column, more than 18 digits, a value the pure parser refuses, an odd type in a
 * row) makes it answer None, so problems are named by the pure path alone: this file decides nothing the
 * pure path would decide otherwise. Timestamps (and plain strings) are memoized per parse as the pure path
 * memoizes them (`cache_entry`); a new one is built as `datetime(..., tzinfo)` (`tzinfo`: the zone the pure
 * parser attaches), or by the pure parser (`time_parse`) when its text is not plain digits.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_COLUMNS 256
#define MAX_FIELDS 64 /* SacctRow's fields before `extra`, at most */
#define MAX_DIGITS 18     /* fits a long long: more is left to the pure path (a big int there) */
#define DURATION_DIGITS 9 /* per duration field: sums stay far below 2**53 */
#define FRACTION_DIGITS 15
#define FLOAT_TEXT_MAX 40
#define CAPSULE_PLAN "hpcbus.sacct.plan"
#define CAPSULE_RENDER "hpcbus.sacct.renderer"

/* a value this file is not sure of: the caller answers None (Python errors are returned as NULL instead) */
#define DOUBT ((PyObject *)&doubt_marker)
static int doubt_marker;

enum kind {
    K_STR,
    K_EXTRA,
    K_UINT,
    K_DURATION,
    K_SIZE,
    K_TIME,
    K_JOBID,
    K_JOBIDRAW,
    K_STATE,
    K_EXITCODE,
    K_REQMEM,
    K_TIMELIMITRAW,
    K_TIMELIMIT,
    K_NODELIST,
    K_COUNT
};

static const char *KINDS[K_COUNT] = {"str",   "extra",    "uint",   "duration",     "size",
                                     "time",  "jobid",    "jobidraw", "state",      "exitcode",
                                     "reqmem", "timelimitraw", "timelimit", "nodelist"};

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int equals(const char *s, Py_ssize_t n, const char *word) {
    size_t w = strlen(word);
    return (size_t)n == w && memcmp(s, word, w) == 0;
}

static int ascii(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    return 1;
}

/* digits at s[*i..]: how many (0: none), their value in *out when at most `limit` of them */
static Py_ssize_t digits(const char *s, Py_ssize_t n, Py_ssize_t *i, long long *out, Py_ssize_t limit) {
    Py_ssize_t start = *i;
    long long v = 0;
    while (*i < n && is_digit((unsigned char)s[*i])) {
        if (*i - start < limit)
            v = v * 10 + (s[*i] - '0');
        (*i)++;
    }
    *out = v;
    return *i - start;
}

/* the whole of [s, s+n) is 1..18 digits: its value */
static int whole_uint(const char *s, Py_ssize_t n, long long *out) {
    Py_ssize_t i = 0;
    Py_ssize_t d = digits(s, n, &i, out, MAX_DIGITS);
    return d > 0 && d <= MAX_DIGITS && i == n;
}

static PyObject *text(const char *s, Py_ssize_t n) { return PyUnicode_DecodeUTF8(s, n, NULL); }

/* *slot = v, releasing what was there (Py_XSETREF, which the limited API lacks) */
static void replace(PyObject **slot, PyObject *v) {
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

/* a tuple of the `n` new references in `items` (stolen; NULL when one is NULL: then all are released) */
static PyObject *pack(PyObject **items, Py_ssize_t n) {
    PyObject *t = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i] == NULL)
            goto fail;
    if ((t = PyTuple_New(n)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SetItem(t, i, items[i]);
    return t;
fail:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(items[i]);
    return NULL;
}

static PyObject *pair(PyObject *a, PyObject *b) {
    PyObject *items[2] = {a, b};
    return pack(items, 2);
}

/* a column's two values (new references, stolen): `a` returned, `b` in *second; NULL when one is NULL */
static PyObject *two_of(PyObject *a, PyObject *b, PyObject **second) {
    if (a == NULL || b == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    *second = b;
    return a;
}

/* --- value parsers: a new reference, DOUBT, or NULL with a Python error ----------------------------------- */

/* `columns._uint` */
static PyObject *parse_uint(const char *s, Py_ssize_t n) {
    long long v;
    if (equals(s, n, "Unknown"))
        return PyLong_FromLong(0);
    if (!whole_uint(s, n, &v))
        return DOUBT;
    return PyLong_FromLongLong(v);
}

/* `values.parse_duration`: 1 with *total (and *fraction, *has_fraction) set, 0 when in doubt */
static int duration(const char *s, Py_ssize_t n, long long *total, double *fraction, int *has_fraction) {
    Py_ssize_t i = 0;
    long long days = 0, group[3];
    int has_days = 0, groups = 0;
    const char *dash = memchr(s, '-', (size_t)n);
    if (dash != NULL) {
        Py_ssize_t d = digits(s, n, &i, &days, DURATION_DIGITS);
        if (d == 0 || d > DURATION_DIGITS || s + i != dash)
            return 0;
        i++;
        has_days = 1;
    }
    for (;;) {
        if (groups == 3)
            return 0;
        Py_ssize_t d = digits(s, n, &i, &group[groups], DURATION_DIGITS);
        if (d == 0 || d > DURATION_DIGITS)
            return 0;
        groups++;
        if (i < n && s[i] == ':') {
            i++;
            continue;
        }
        break;
    }
    if (groups < 2)
        return 0;
    *has_fraction = 0;
    if (i < n && s[i] == '.') {
        i++;
        long long f;
        Py_ssize_t d = digits(s, n, &i, &f, FRACTION_DIGITS);
        if (d == 0 || d > FRACTION_DIGITS)
            return 0;
        double scale = 1.0;
        for (Py_ssize_t k = 0; k < d; k++)
            scale *= 10.0; /* exact up to 1e22 */
        *fraction = (double)f / scale;
        *has_fraction = 1;
    }
    if (i != n)
        return 0;
    long long h = groups == 3 ? group[0] : 0, mi = group[groups - 2], sec = group[groups - 1];
    if (has_days && groups == 2)
        return 0;
    if (sec >= 60 || (groups == 3 && mi >= 60) || (has_days && h >= 24))
        return 0;
    *total = (days * 24 + h) * 3600 + mi * 60 + sec;
    return 1;
}

/* `_unknown_is_zero(parse_duration)` */
static PyObject *parse_duration(const char *s, Py_ssize_t n) {
    long long total;
    double fraction;
    int has_fraction;
    if (equals(s, n, "Unknown"))
        return PyLong_FromLong(0);
    if (!duration(s, n, &total, &fraction, &has_fraction))
        return DOUBT;
    if (has_fraction)
        return PyFloat_FromDouble((double)total + fraction);
    return PyLong_FromLongLong(total);
}

/* `values._kib` of `\d+(\.\d+)?[KMGTP]?` at the start of [s, s+n); *used: how many bytes it took */
static PyObject *kib(const char *s, Py_ssize_t n, Py_ssize_t *used) {
    Py_ssize_t i = 0;
    long long whole, part;
    Py_ssize_t d = digits(s, n, &i, &whole, MAX_DIGITS);
    if (d == 0)
        return DOUBT;
    int dotted = 0;
    Py_ssize_t fd = 0;
    if (i < n && s[i] == '.') {
        i++;
        if ((fd = digits(s, n, &i, &part, MAX_DIGITS)) == 0)
            return DOUBT;
        dotted = 1;
    }
    Py_ssize_t number = i;
    int shift = 0; /* scale = 2**shift */
    if (i < n) {
        const char *suffixes = "KMGTP";
        const char *at = memchr(suffixes, s[i], 5);
        if (at != NULL && s[i] != '\0') {
            shift = 10 * (int)(at - suffixes + 1);
            i++;
        }
    }
    *used = i;
    if (dotted && d + fd <= 15) {
        /* float(number) without strtod: the digits as an integer below 2**53 over an exact power of ten,
         * one correctly rounded division (so the very double strtod gives) */
        static const double pow10[16] = {1e0, 1e1, 1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                         1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
        long long mantissa = whole;
        for (Py_ssize_t k = 0; k < fd; k++)
            mantissa *= 10;
        double v = (double)(mantissa + part) / pow10[fd];
        return PyLong_FromDouble(ceil(v * ldexp(1.0, shift) / 1024.0));
    }
    if (dotted) {
        char buf[FLOAT_TEXT_MAX + 1];
        if (number > FLOAT_TEXT_MAX)
            return DOUBT;
        memcpy(buf, s, (size_t)number);
        buf[number] = '\0';
        char *end;
        double v = PyOS_string_to_double(buf, &end, NULL);
        if (v == -1.0 && PyErr_Occurred())
            return NULL;
        if (end != buf + number)
            return DOUBT;
        double k = ceil(v * ldexp(1.0, shift) / 1024.0);
        if (!isfinite(k))
            return DOUBT;
        return PyLong_FromDouble(k);
    }
    if (d > MAX_DIGITS)
        return DOUBT;
    if (shift == 0)
        return PyLong_FromLongLong((whole + 1023) / 1024);
    shift -= 10;
    if (whole > (LLONG_MAX >> shift))
        return DOUBT;
    return PyLong_FromLongLong(whole << shift);
}

/* `_unknown_is_zero(parse_size_kib)` */
static PyObject *parse_size(const char *s, Py_ssize_t n) {
    if (equals(s, n, "Unknown"))
        return PyLong_FromLong(0);
    Py_ssize_t used;
    PyObject *v = kib(s, n, &used);
    if (v == NULL || v == DOUBT)
        return v;
    if (used != n) {
        Py_DECREF(v);
        return DOUBT;
    }
    return v;
}

/* `values.parse_reqmem`: KiB, and per_cpu in *second */
static PyObject *parse_reqmem(const char *s, Py_ssize_t n, PyObject **second) {
    Py_ssize_t used;
    PyObject *v = kib(s, n, &used);
    if (v == NULL || v == DOUBT)
        return v;
    int per_cpu = 0;
    if (used < n && (s[used] == 'n' || s[used] == 'c')) {
        per_cpu = s[used] == 'c';
        used++;
    }
    if (used != n) {
        Py_DECREF(v);
        return DOUBT;
    }
    return two_of(v, PyBool_FromLong(per_cpu), second);
}

/* `[0-9A-Za-z_+]+` */
static int step_chars(const char *s, Py_ssize_t n) {
    if (n == 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(is_digit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '+'))
            return 0;
    }
    return 1;
}

/* `(?:\.step)?` and the end at s[i..n): the step text (maybe empty) */
static PyObject *step_at(const char *s, Py_ssize_t n, Py_ssize_t i, PyObject *empty) {
    if (i == n) {
        Py_INCREF(empty);
        return empty;
    }
    if (s[i] != '.' || !step_chars(s + i + 1, n - i - 1))
        return DOUBT;
    return text(s + i + 1, n - i - 1);
}

static PyObject *optional_int(int present, long long v) {
    if (!present)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

/* `values.parse_job_id` */
static PyObject *parse_jobid(const char *s, Py_ssize_t n, PyObject *jobid_type, PyObject *empty) {
    Py_ssize_t i = 0;
    long long base, task = 0, offset = 0;
    int has_task = 0, has_offset = 0;
    Py_ssize_t tasks_at = 0, tasks_len = 0;
    Py_ssize_t d = digits(s, n, &i, &base, MAX_DIGITS);
    if (d == 0 || d > MAX_DIGITS)
        return DOUBT;
    if (i < n && s[i] == '_') {
        i++;
        if (i < n && s[i] == '[') {
            i++;
            tasks_at = i;
            while (i < n && s[i] != ']' && s[i] != '[')
                i++;
            if (i >= n || s[i] != ']' || i == tasks_at)
                return DOUBT;
            tasks_len = i - tasks_at;
            i++;
        } else {
            d = digits(s, n, &i, &task, MAX_DIGITS);
            if (d == 0 || d > MAX_DIGITS)
                return DOUBT;
            has_task = 1;
        }
    } else if (i < n && s[i] == '+') {
        i++;
        d = digits(s, n, &i, &offset, MAX_DIGITS);
        if (d == 0 || d > MAX_DIGITS)
            return DOUBT;
        has_offset = 1;
    }
    PyObject *step = step_at(s, n, i, empty);
    if (step == NULL || step == DOUBT)
        return step;
    PyObject *tasks;
    if (tasks_len > 0) {
        tasks = text(s + tasks_at, tasks_len);
    } else {
        Py_INCREF(empty);
        tasks = empty;
    }
    if (tasks == NULL) {
        Py_DECREF(step);
        return NULL;
    }
    PyObject *items[5] = {PyLong_FromLongLong(base), step, optional_int(has_task, task), tasks,
                          optional_int(has_offset, offset)};
    PyObject *args = pack(items, 5);
    if (args == NULL)
        return NULL;
    PyObject *job = PyObject_Call(jobid_type, args, NULL);
    Py_DECREF(args);
    return job;
}

/* `values.parse_job_id_raw`: id, and step in *second */
static PyObject *parse_jobidraw(const char *s, Py_ssize_t n, PyObject *empty, PyObject **second) {
    Py_ssize_t i = 0;
    long long id;
    Py_ssize_t d = digits(s, n, &i, &id, MAX_DIGITS);
    if (d == 0 || d > MAX_DIGITS)
        return DOUBT;
    PyObject *step = step_at(s, n, i, empty);
    if (step == NULL || step == DOUBT)
        return step;
    return two_of(PyLong_FromLongLong(id), step, second);
}

/* `values.parse_state`: STATE, and uid or None in *second */
static PyObject *parse_state(const char *s, Py_ssize_t n, PyObject **second) {
    Py_ssize_t i = 0;
    if (n == 0 || !(s[0] >= 'A' && s[0] <= 'Z'))
        return DOUBT;
    while (i < n && ((s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_'))
        i++;
    Py_ssize_t word = i;
    long long uid = 0;
    int has_uid = 0;
    if (i < n) {
        if (n - i < 5 || memcmp(s + i, " by ", 4) != 0 || !whole_uint(s + i + 4, n - i - 4, &uid))
            return DOUBT;
        has_uid = 1;
    }
    return two_of(text(s, word), optional_int(has_uid, uid), second);
}

/* `values.parse_exit_code`: status, and signal in *second */
static PyObject *parse_exitcode(const char *s, Py_ssize_t n, PyObject **second) {
    const char *colon = memchr(s, ':', (size_t)n);
    long long status, signal;
    if (colon == NULL || !whole_uint(s, colon - s, &status) ||
        !whole_uint(colon + 1, n - (colon - s) - 1, &signal))
        return DOUBT;
    return two_of(PyLong_FromLongLong(status), PyLong_FromLongLong(signal), second);
}

/* `values.parse_timelimit_raw` */
static PyObject *parse_timelimitraw(const char *s, Py_ssize_t n, PyObject *unlimited) {
    long long v;
    if (whole_uint(s, n, &v))
        return PyLong_FromLongLong(v);
    if (equals(s, n, "UNLIMITED")) {
        Py_INCREF(unlimited);
        return unlimited;
    }
    if (equals(s, n, "Partition_Limit"))
        Py_RETURN_NONE;
    return DOUBT;
}

/* `values.parse_timelimit` */
static PyObject *parse_timelimit(const char *s, Py_ssize_t n, PyObject *unlimited) {
    long long total;
    double fraction;
    int has_fraction;
    if (equals(s, n, "UNLIMITED")) {
        Py_INCREF(unlimited);
        return unlimited;
    }
    if (equals(s, n, "Partition_Limit"))
        Py_RETURN_NONE;
    if (!duration(s, n, &total, &fraction, &has_fraction))
        return DOUBT;
    if (has_fraction)
        total = (long long)((double)total + fraction); /* int(seconds): toward zero */
    return PyLong_FromLongLong(total / 60);
}

/* `values.split_nodelist` of [s, s+n) (ASCII): 1 when it is a valid hostlist, its elements appended to
 * `out` unless that is NULL; 0 when refused; -1 with a Python error. Per element
 * `(?:[^\[\],]+|\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\])+`, a ',' between elements. */
static int nodelist(const char *s, Py_ssize_t n, PyObject *out) {
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t start = i;
        for (;;) {
            if (i < n && s[i] != '[' && s[i] != ']' && s[i] != ',') {
                while (i < n && s[i] != '[' && s[i] != ']' && s[i] != ',')
                    i++;
                continue;
            }
            if (i < n && s[i] == '[') {
                Py_ssize_t j = i + 1;
                int ok = 0;
                for (;;) {
                    Py_ssize_t d0 = j;
                    while (j < n && is_digit((unsigned char)s[j]))
                        j++;
                    if (j == d0)
                        break;
                    if (j < n && s[j] == '-') {
                        Py_ssize_t d1 = ++j;
                        while (j < n && is_digit((unsigned char)s[j]))
                            j++;
                        if (j == d1)
                            break;
                    }
                    if (j < n && s[j] == ',') {
                        j++;
                        continue;
                    }
                    ok = j < n && s[j] == ']';
                    break;
                }
                if (ok) {
                    i = j + 1;
                    continue;
                }
            }
            break;
        }
        if (i == start)
            return 0;
        if (out != NULL) {
            PyObject *element = text(s + start, i - start);
            if (element == NULL || PyList_Append(out, element) < 0) {
                Py_XDECREF(element);
                return -1;
            }
            Py_DECREF(element);
        }
        if (i == n)
            return 1;
        if (s[i] != ',')
            return 0;
        i++;
    }
}

/* `columns._node_list`: the text itself once it is a valid hostlist; "" for `None assigned` */
static PyObject *parse_nodelist(const char *s, Py_ssize_t n, PyObject *empty) {
    if (equals(s, n, "None assigned")) {
        Py_INCREF(empty);
        return empty;
    }
    if (!nodelist(s, n, NULL))
        return DOUBT;
    return text(s, n);
}

/* --- the plan of one parse --------------------------------------------------------------------------------- */

/* values by their text, for one parse: a column's values repeat (a job's times on each of its steps, the
 * same user, partition, TRES): each is made once, as the pure path memoizes per parse (`columns._memo`).
 * Direct-mapped: a colliding value replaces the older one. */
#define CACHE_SLOTS 1024
#define CACHE_KEY_MAX 40

typedef struct {
    int kind;
    Py_ssize_t len;
    char key[CACHE_KEY_MAX];
    PyObject *value;
} cache_entry;

static cache_entry *cache_slot(cache_entry *cache, int kind, const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)kind;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return &cache[(h ^ (h >> 29)) & (CACHE_SLOTS - 1)];
}

/* the cached value of `kind` for [s, s+n) (a new reference), or NULL; *slot: where to store it */
static PyObject *cache_get(cache_entry *cache, int kind, const char *s, Py_ssize_t n, cache_entry **slot) {
    *slot = NULL;
    if (n > CACHE_KEY_MAX)
        return NULL;
    cache_entry *e = cache_slot(cache, kind, s, n);
    *slot = e;
    if (e->value != NULL && e->kind == kind && e->len == n && memcmp(e->key, s, (size_t)n) == 0) {
        Py_INCREF(e->value);
        return e->value;
    }
    return NULL;
}

static void cache_put(cache_entry *e, int kind, const char *s, Py_ssize_t n, PyObject *value) {
    if (e == NULL)
        return;
    Py_INCREF(value);
    replace(&e->value, value);
    e->kind = kind;
    e->len = n;
    memcpy(e->key, s, (size_t)n);
}

typedef struct {
    int kind;
    Py_ssize_t at, at2; /* positions in SacctRow of the attribute(s) it fills; at2 -1 for one */
    PyObject *name;     /* an extra column's name as given (NULL for the others) */
} column;

typedef struct {
    Py_ssize_t width;
    column cols[MAX_COLUMNS];
    PyObject *delimiter; /* str, kept for its UTF-8 buffer */
    const char *delim;
    Py_ssize_t dlen;
    int trailing, joinable;
    PyObject *row_type, *jobid_type, *time_parse;
    PyObject *datetime_type, *tzinfo; /* the zone the pure parser gives its datetimes */
    PyObject *defaults; /* SacctRow's defaults of every field before `extra` (the last one) */
    Py_ssize_t nfields; /* how many those are: `extra`'s position */
    PyObject *empty, *unlimited;
    cache_entry cache[CACHE_SLOTS];
} plan_t;

static void plan_free(PyObject *capsule) {
    plan_t *p = PyCapsule_GetPointer(capsule, CAPSULE_PLAN);
    if (p == NULL)
        return;
    for (Py_ssize_t i = 0; i < p->width; i++)
        Py_XDECREF(p->cols[i].name);
    Py_XDECREF(p->delimiter);
    Py_XDECREF(p->row_type);
    Py_XDECREF(p->jobid_type);
    Py_XDECREF(p->time_parse);
    for (int i = 0; i < CACHE_SLOTS; i++)
        Py_XDECREF(p->cache[i].value);
    Py_XDECREF(p->defaults);
    Py_XDECREF(p->datetime_type);
    Py_XDECREF(p->tzinfo);
    Py_XDECREF(p->empty);
    Py_XDECREF(p->unlimited);
    PyMem_Free(p);
}

static PyObject *plan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *columns, *delimiter, *row_type, *jobid_type, *time_parse, *defaults, *datetime_type, *tzinfo;
    int trailing, joinable;
    if (!PyArg_ParseTuple(args, "O!UppOOOO!OO:plan", &PyTuple_Type, &columns, &delimiter, &trailing, &joinable,
                          &row_type, &jobid_type, &time_parse, &PyTuple_Type, &defaults, &datetime_type, &tzinfo))
        return NULL;
    Py_ssize_t width = PyTuple_Size(columns), nfields = PyTuple_Size(defaults);
    if (nfields < 1 || nfields > MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "the compiled sacct reader takes 1 to %d SacctRow fields", MAX_FIELDS);
        return NULL;
    }
    if (width < 1 || width > MAX_COLUMNS) {
        PyErr_Format(PyExc_ValueError, "the compiled sacct reader takes 1 to %d columns", MAX_COLUMNS);
        return NULL;
    }
    plan_t *p = PyMem_Calloc(1, sizeof(plan_t));
    if (p == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(p, CAPSULE_PLAN, plan_free);
    if (capsule == NULL) {
        PyMem_Free(p);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < width; i++) {
        PyObject *item = PyTuple_GetItem(columns, i);
        PyObject *kind, *name;
        Py_ssize_t at, at2;
        if (item == NULL || !PyArg_ParseTuple(item, "UnnO:column", &kind, &at, &at2, &name))
            goto fail;
        int k = 0;
        while (k < K_COUNT && PyUnicode_CompareWithASCIIString(kind, KINDS[k]) != 0)
            k++;
        if (k == K_COUNT) {
            PyErr_Format(PyExc_ValueError, "unknown sacct column kind %R", kind);
            goto fail;
        }
        if (k != K_EXTRA && (at < 1 || at >= nfields || at2 >= nfields || (at2 < 0 && at2 != -1))) {
            PyErr_SetString(PyExc_ValueError, "a sacct column's SacctRow position is out of range");
            goto fail;
        }
        p->cols[i].kind = k;
        p->cols[i].at = at;
        p->cols[i].at2 = at2;
        if (k == K_EXTRA) {
            Py_INCREF(name);
            p->cols[i].name = name;
        }
        p->width = i + 1;
    }
    p->delim = PyUnicode_AsUTF8AndSize(delimiter, &p->dlen);
    if (p->delim == NULL)
        goto fail;
    if (p->dlen == 0) {
        PyErr_SetString(PyExc_ValueError, "the sacct delimiter must not be empty");
        goto fail;
    }
    PyObject *objects[] = {delimiter, row_type, jobid_type, time_parse, defaults, datetime_type, tzinfo};
    PyObject **slots[] = {&p->delimiter, &p->row_type,      &p->jobid_type, &p->time_parse,
                          &p->defaults,  &p->datetime_type, &p->tzinfo};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(objects[i]);
        *slots[i] = objects[i];
    }
    p->nfields = nfields;
    p->trailing = trailing;
    p->joinable = joinable;
    p->empty = PyUnicode_FromStringAndSize("", 0);
    p->unlimited = PyUnicode_InternFromString("UNLIMITED");
    if (p->empty == NULL || p->unlimited == NULL)
        goto fail;
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* 2 digits at s */
static int two(const char *s) { return (s[0] - '0') * 10 + (s[1] - '0'); }

/* a new datetime for `YYYY-MM-DDTHH:MM:SS` at s (`key` its text): built here when every digit is in place
 * and the hour below 24 (`datetime(...)` then checks the ranges `fromisoformat` checks), else by the pure
 * parser; DOUBT for a text either refuses */
static PyObject *make_time(plan_t *p, const char *s, PyObject *key) {
    int shape = s[4] == '-' && s[7] == '-' && s[13] == ':' && s[16] == ':';
    static const int at[] = {0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18};
    for (size_t i = 0; shape && i < sizeof(at) / sizeof(at[0]); i++)
        shape = is_digit((unsigned char)s[at[i]]);
    PyObject *value;
    if (shape && two(s + 11) < 24) {
        int year = two(s) * 100 + two(s + 2);
        Py_INCREF(p->tzinfo);
        PyObject *items[8] = {PyLong_FromLong(year),        PyLong_FromLong(two(s + 5)),
                              PyLong_FromLong(two(s + 8)),  PyLong_FromLong(two(s + 11)),
                              PyLong_FromLong(two(s + 14)), PyLong_FromLong(two(s + 17)),
                              PyLong_FromLong(0),           p->tzinfo};
        PyObject *args = pack(items, 8);
        if (args == NULL)
            return NULL;
        value = PyObject_Call(p->datetime_type, args, NULL);
        Py_DECREF(args);
    } else {
        value = PyObject_CallFunctionObjArgs(p->time_parse, key, NULL);
    }
    if (value == NULL && PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        return DOUBT;
    }
    return value;
}

/* `timestamp_parser(tz)` memoized per parse, as `columns._memo` does */
static PyObject *parse_time(plan_t *p, const char *s, Py_ssize_t n) {
    if (equals(s, n, "Unknown") || equals(s, n, "None"))
        Py_RETURN_NONE;
    if (n != 19 || s[10] != 'T')
        return DOUBT;
    cache_entry *slot;
    PyObject *value = cache_get(p->cache, K_TIME, s, n, &slot);
    if (value != NULL)
        return value;
    PyObject *key = text(s, n);
    if (key == NULL)
        return NULL;
    value = make_time(p, s, key);
    Py_DECREF(key);
    if (value != NULL && value != DOUBT)
        cache_put(slot, K_TIME, s, n, value);
    return value;
}

/* a str column's value, shared with the rows before it that had the same text */
static PyObject *plain_text_value(plan_t *p, const char *s, Py_ssize_t n) {
    cache_entry *slot;
    PyObject *value = cache_get(p->cache, K_STR, s, n, &slot);
    if (value != NULL)
        return value;
    value = text(s, n);
    if (value != NULL)
        cache_put(slot, K_STR, s, n, value);
    return value;
}

/* a column's value (and its second one in *second, for the two-attribute kinds) */
static PyObject *parse_value(plan_t *p, int kind, const char *s, Py_ssize_t n, PyObject **second) {
    if (!ascii(s, n))
        return DOUBT;
    switch (kind) {
    case K_UINT:
        return parse_uint(s, n);
    case K_DURATION:
        return parse_duration(s, n);
    case K_SIZE:
        return parse_size(s, n);
    case K_TIME:
        return parse_time(p, s, n);
    case K_JOBID:
        return parse_jobid(s, n, p->jobid_type, p->empty);
    case K_JOBIDRAW:
        return parse_jobidraw(s, n, p->empty, second);
    case K_STATE:
        return parse_state(s, n, second);
    case K_EXITCODE:
        return parse_exitcode(s, n, second);
    case K_REQMEM:
        return parse_reqmem(s, n, second);
    case K_TIMELIMITRAW:
        return parse_timelimitraw(s, n, p->unlimited);
    case K_TIMELIMIT:
        return parse_timelimit(s, n, p->unlimited);
    case K_NODELIST:
        return parse_nodelist(s, n, p->empty);
    default:
        return DOUBT;
    }
}

/* the first `d` (dlen bytes) in [s, end), or NULL */
static const char *find(const char *s, const char *end, const char *d, Py_ssize_t dlen) {
    if (dlen == 1)
        return s < end ? memchr(s, d[0], (size_t)(end - s)) : NULL;
    while (end - s >= dlen) {
        const char *q = memchr(s, d[0], (size_t)(end - s - dlen + 1));
        if (q == NULL)
            return NULL;
        if (memcmp(q + 1, d + 1, (size_t)dlen - 1) == 0)
            return q;
        s = q + 1;
    }
    return NULL;
}

/* the SacctRow of the line [s, s+n) (UTF-8), DOUBT, or NULL */
static PyObject *row_of(plan_t *p, const char *s, Py_ssize_t n, Py_ssize_t lineno) {
    if (p->trailing) {
        if (n < p->dlen || memcmp(s + n - p->dlen, p->delim, (size_t)p->dlen) != 0)
            return DOUBT;
        n -= p->dlen;
    }
    /* `line.split(delimiter)` on the UTF-8 bytes: a valid UTF-8 delimiter only matches at character
     * boundaries, so the parts are the same */
    Py_ssize_t starts[MAX_COLUMNS], ends[MAX_COLUMNS];
    Py_ssize_t count = 0, at = 0;
    for (;;) {
        if (count == p->width) { /* more parts than columns: joined into the last, free-text one */
            if (!p->joinable)
                return DOUBT;
            ends[count - 1] = n;
            break;
        }
        const char *hit = find(s + at, s + n, p->delim, p->dlen);
        starts[count] = at;
        ends[count] = hit ? hit - s : n;
        count++;
        if (hit == NULL)
            break;
        at = hit - s + p->dlen;
    }
    if (count < p->width)
        return DOUBT;

    int identified = 0;
    for (Py_ssize_t i = 0; i < p->width; i++) { /* the cheap refusals first: nothing built yet */
        int kind = p->cols[i].kind;
        if ((kind == K_JOBID || kind == K_JOBIDRAW) && ends[i] > starts[i])
            identified = 1;
    }
    if (!identified) /* the pure path names the problem */
        return DOUBT;
    PyObject *vals[MAX_FIELDS] = {NULL}; /* new references; NULL: the field's default */
    PyObject *extra = NULL, *value = NULL, *args = NULL, *out = NULL;
    if ((vals[0] = PyLong_FromSsize_t(lineno)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < p->width; i++) {
        column *c = &p->cols[i];
        const char *v = s + starts[i];
        Py_ssize_t len = ends[i] - starts[i];
        if (len == 0)
            continue;
        if (c->kind == K_STR) {
            if ((value = plain_text_value(p, v, len)) == NULL)
                goto done;
            replace(&vals[c->at], value);
            continue;
        }
        if (c->kind == K_EXTRA) {
            if ((value = text(v, len)) == NULL)
                goto done;
            if (extra == NULL && (extra = PyDict_New()) == NULL) {
                Py_DECREF(value);
                goto done;
            }
            int bad = PyDict_SetItem(extra, c->name, value);
            Py_DECREF(value);
            if (bad < 0)
                goto done;
            continue;
        }
        PyObject *second = NULL;
        value = parse_value(p, c->kind, v, len, &second);
        if (value == NULL)
            goto done;
        if (value == DOUBT) {
            out = DOUBT;
            goto done;
        }
        replace(&vals[c->at], value);
        if (second != NULL) { /* (attr, attr2) */
            if (c->at2 >= 0)
                replace(&vals[c->at2], second);
            else
                Py_DECREF(second);
        }
    }
    /* positional: every field before `extra`, and `extra` (the last field) when there is one */
    Py_ssize_t size = p->nfields + (extra != NULL);
    if ((args = PyTuple_New(size)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < p->nfields; i++) {
        PyObject *item = vals[i];
        if (item == NULL) {
            item = PyTuple_GetItem(p->defaults, i);
            Py_INCREF(item);
        }
        vals[i] = NULL;
        PyTuple_SetItem(args, i, item);
    }
    if (extra != NULL) {
        PyTuple_SetItem(args, p->nfields, extra);
        extra = NULL;
    }
    out = PyObject_Call(p->row_type, args, NULL);
done:
    for (Py_ssize_t i = 0; i < p->nfields; i++)
        Py_XDECREF(vals[i]);
    Py_XDECREF(extra);
    Py_XDECREF(args);
    return out;
}

static PyObject *row(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "row(plan, line: str, lineno: int)");
        return NULL;
    }
    plan_t *p = PyCapsule_GetPointer(args[0], CAPSULE_PLAN);
    if (p == NULL)
        return NULL;
    Py_ssize_t lineno = PyLong_AsSsize_t(args[2]);
    if (lineno == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(args[1], &n);
    if (s == NULL) { /* lone surrogates: the pure path decides */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *out = row_of(p, s, n, lineno);
    if (out == DOUBT)
        Py_RETURN_NONE;
    return out;
}

/* `str.splitlines` splits at these too; a text with one of them is read line by line in Python */
static int plain_text(const char *s, Py_ssize_t n) {
    static const char controls[] = {0x0b, 0x0c, 0x1c, 0x1d, 0x1e};
    for (size_t k = 0; k < sizeof(controls); k++)
        if (memchr(s, controls[k], (size_t)n) != NULL)
            return 0;
    /* \x85 (C2 85), \u2028 and \u2029 (E2 80 A8/A9): their last byte never leads a UTF-8 character */
    for (const char *q = s; (q = memchr(q, 0x85, (size_t)(s + n - q))) != NULL; q++)
        if (q > s && (unsigned char)q[-1] == 0xc2)
            return 0;
    for (const char *q = s; (q = memchr(q, 0x80, (size_t)(s + n - q))) != NULL; q++)
        if (q > s && (unsigned char)q[-1] == 0xe2 && q + 1 < s + n &&
            ((unsigned char)q[1] == 0xa8 || (unsigned char)q[1] == 0xa9))
            return 0;
    return 1;
}

static PyObject *lines_plain(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(plain_text(s, n));
}

/* rows(plan, text, offset, lineno, limit) -> (items, offset, lineno, left): up to `limit` items for the lines of
 * `text` (a `lines_plain` one) from byte `offset` on, numbered after `lineno`: a SacctRow, or (number, line)
 * for a line the caller decides (it may be a header: it starts with a letter or a non-ASCII character, or
 * this file is not sure of it; `left` counts those). Empty lines give nothing. offset -1: the text is done. */
static PyObject *rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule, *textobj;
    Py_ssize_t offset, lineno, limit;
    if (!PyArg_ParseTuple(args, "OUnnn:rows", &capsule, &textobj, &offset, &lineno, &limit))
        return NULL;
    plan_t *p = PyCapsule_GetPointer(capsule, CAPSULE_PLAN);
    if (p == NULL)
        return NULL;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(textobj, &n);
    if (s == NULL)
        return NULL;
    if (offset < 0 || offset > n || limit < 1) {
        PyErr_SetString(PyExc_ValueError, "rows: offset out of range, or a limit below 1");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t i = offset, left = 0;
    while (i < n && PyList_Size(out) < limit) {
        Py_ssize_t start = i;
        while (i < n && s[i] != '\n' && s[i] != '\r')
            i++;
        Py_ssize_t stop = i;
        if (i < n) {
            if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n')
                i++;
            i++;
        }
        lineno++;
        if (stop == start)
            continue;
        unsigned char first = (unsigned char)s[start];
        PyObject *item = DOUBT;
        if (!(first >= 0x80 || (first >= 'A' && first <= 'Z') || (first >= 'a' && first <= 'z')))
            item = row_of(p, s + start, stop - start, lineno);
        if (item == DOUBT) {
            item = pair(PyLong_FromSsize_t(lineno), text(s + start, stop - start));
            left++;
        }
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *items[4] = {out, PyLong_FromSsize_t(i < n ? i : -1), PyLong_FromSsize_t(lineno),
                          PyLong_FromSsize_t(left)};
    return pack(items, 4);
}

/* --- rendering: `render.to_slurm_job(row)` ------------------------------------------------------------------ */

/* the SacctRow fields read here, in this order (`renderer` is given their positions in the struct) */
enum row_field {
    R_JOB, R_JOB_ID_RAW, R_STEP_RAW, R_JOB_NAME, R_USER, R_ACCOUNT, R_PARTITION, R_RESERVATION, R_LAYOUT,
    R_STATE, R_SUBMIT, R_START, R_END, R_ELAPSED_RAW, R_SUSPENDED, R_USER_CPU, R_SYSTEM_CPU, R_AVE_CPU,
    R_MIN_CPU, R_AVE_DISK_READ, R_AVE_DISK_WRITE, R_AVE_RSS, R_AVE_VMSIZE, R_MAX_RSS, R_MAX_VMSIZE,
    R_EXIT_STATUS, R_REQ_CPUS, R_REQ_NODES, R_PRIORITY, R_REQ_MEM_KIB, R_REQ_MEM_PER_CPU, R_TIME_LIMIT,
    R_NODE_LIST, R_ALLOC_TRES, R_COUNT
};

/* the keywords of SlurmJob and SacctData given here */
static const char *JOB_KEYS[] = {
    "job_id", "job_step", "job_name", "job_state", "array_job_id", "array_task_id", "het_job_id",
    "het_job_offset", "user_name", "account", "submit_time", "time_limit", "partition", "reservation",
    "nodes", "priority", "distribution", "allocated_resources", "requested_cpus",
    "requested_memory_per_node", "requested_node_count", "start_time", "suspend_time", "end_time",
    "exit_code", "sacct",
};
enum job_key {
    J_JOB_ID, J_JOB_STEP, J_JOB_NAME, J_JOB_STATE, J_ARRAY_JOB_ID, J_ARRAY_TASK_ID, J_HET_JOB_ID,
    J_HET_JOB_OFFSET, J_USER_NAME, J_ACCOUNT, J_SUBMIT_TIME, J_TIME_LIMIT, J_PARTITION, J_RESERVATION,
    J_NODES, J_PRIORITY, J_DISTRIBUTION, J_ALLOCATED_RESOURCES, J_REQUESTED_CPUS,
    J_REQUESTED_MEMORY_PER_NODE, J_REQUESTED_NODE_COUNT, J_START_TIME, J_SUSPEND_TIME, J_END_TIME,
    J_EXIT_CODE, J_SACCT, J_COUNT
};
static const char *SACCT_KEYS[] = {
    "min_cpu", "alloc_tres", "ave_cpu", "ave_disk_read", "ave_disk_write", "ave_rss", "ave_vm_size",
    "elapsed_raw", "system_cpu", "user_cpu", "max_rss", "max_vm_size",
};
enum sacct_key {
    S_MIN_CPU, S_ALLOC_TRES, S_AVE_CPU, S_AVE_DISK_READ, S_AVE_DISK_WRITE, S_AVE_RSS, S_AVE_VM_SIZE,
    S_ELAPSED_RAW, S_SYSTEM_CPU, S_USER_CPU, S_MAX_RSS, S_MAX_VM_SIZE, S_COUNT
};

#define STAMP_SLOTS 64

typedef struct {
    PyObject *job_type, *sacct_type, *astuple, *jobid_type, *datetime_type, *timezone_type, *no_args;
    /* `__copy__` of a SlurmJob and of a SacctData with every field at its default (but the two SlurmJob
     * requires, which every record sets): a record is a copy with its other fields set, cheaper than a call
     * with keywords */
    PyObject *new_job, *new_sacct, *k_gres_detail;
    /* the text of recent timestamps by their object (a row's times are shared by its steps: the parser
     * memoizes them), for fixed-offset zones only (`datetime.timezone`: immutable, so the text cannot
     * change); each slot holds both references, so an address is never reused while it is here */
    PyObject *stamp_when[STAMP_SLOTS], *stamp_text[STAMP_SLOTS];
    PyObject *job_keys[J_COUNT], *sacct_keys[S_COUNT];
    PyObject *k_microsecond, *k_tzinfo, *k_isoformat, *k_parts[6];
    PyObject *zone, *zone_text; /* the last fixed zone met and its `+hh:mm` as isoformat writes it */
    Py_ssize_t index[R_COUNT];
    Py_ssize_t row_width;
} renderer_t;

static void renderer_free(PyObject *capsule) {
    renderer_t *r = PyCapsule_GetPointer(capsule, CAPSULE_RENDER);
    if (r == NULL)
        return;
    Py_XDECREF(r->job_type);
    Py_XDECREF(r->sacct_type);
    Py_XDECREF(r->astuple);
    Py_XDECREF(r->jobid_type);
    Py_XDECREF(r->datetime_type);
    Py_XDECREF(r->timezone_type);
    Py_XDECREF(r->no_args);
    Py_XDECREF(r->new_job);
    Py_XDECREF(r->new_sacct);
    Py_XDECREF(r->k_gres_detail);
    for (int i = 0; i < STAMP_SLOTS; i++) {
        Py_XDECREF(r->stamp_when[i]);
        Py_XDECREF(r->stamp_text[i]);
    }
    for (int i = 0; i < J_COUNT; i++)
        Py_XDECREF(r->job_keys[i]);
    for (int i = 0; i < S_COUNT; i++)
        Py_XDECREF(r->sacct_keys[i]);
    Py_XDECREF(r->k_microsecond);
    Py_XDECREF(r->k_tzinfo);
    Py_XDECREF(r->k_isoformat);
    for (int i = 0; i < 6; i++)
        Py_XDECREF(r->k_parts[i]);
    Py_XDECREF(r->zone);
    Py_XDECREF(r->zone_text);
    PyMem_Free(r);
}

static PyObject *renderer(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *job_type, *sacct_type, *astuple, *jobid_type, *datetime_type, *timezone_type, *index;
    PyObject *job_template, *sacct_template;
    Py_ssize_t row_width;
    if (!PyArg_ParseTuple(args, "OOOOOOO!nOO:renderer", &job_type, &sacct_type, &astuple, &jobid_type,
                          &datetime_type, &timezone_type, &PyTuple_Type, &index, &row_width, &job_template,
                          &sacct_template))
        return NULL;
    if (PyTuple_Size(index) != R_COUNT) {
        PyErr_Format(PyExc_ValueError, "renderer takes the positions of %d SacctRow fields", R_COUNT);
        return NULL;
    }
    renderer_t *r = PyMem_Calloc(1, sizeof(renderer_t));
    if (r == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(r, CAPSULE_RENDER, renderer_free);
    if (capsule == NULL) {
        PyMem_Free(r);
        return NULL;
    }
    PyObject *objects[] = {job_type, sacct_type, astuple, jobid_type, datetime_type, timezone_type};
    PyObject **slots[] = {&r->job_type,   &r->sacct_type,    &r->astuple,
                          &r->jobid_type, &r->datetime_type, &r->timezone_type};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(objects[i]);
        *slots[i] = objects[i];
    }
    for (int i = 0; i < R_COUNT; i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GetItem(index, i));
        if (at == -1 && PyErr_Occurred())
            goto fail;
        if (at < 0 || at >= row_width) {
            PyErr_SetString(PyExc_ValueError, "a SacctRow field position is out of range");
            goto fail;
        }
        r->index[i] = at;
    }
    r->row_width = row_width;
    for (int i = 0; i < J_COUNT; i++)
        if ((r->job_keys[i] = PyUnicode_InternFromString(JOB_KEYS[i])) == NULL)
            goto fail;
    for (int i = 0; i < S_COUNT; i++)
        if ((r->sacct_keys[i] = PyUnicode_InternFromString(SACCT_KEYS[i])) == NULL)
            goto fail;
    r->k_microsecond = PyUnicode_InternFromString("microsecond");
    r->k_tzinfo = PyUnicode_InternFromString("tzinfo");
    r->k_isoformat = PyUnicode_InternFromString("isoformat");
    static const char *parts[6] = {"year", "month", "day", "hour", "minute", "second"};
    for (int i = 0; i < 6; i++)
        if ((r->k_parts[i] = PyUnicode_InternFromString(parts[i])) == NULL)
            goto fail;
    r->no_args = PyTuple_New(0);
    if ((PyObject *)Py_TYPE(job_template) != job_type || (PyObject *)Py_TYPE(sacct_template) != sacct_type) {
        PyErr_SetString(PyExc_TypeError, "the templates must be a SlurmJob and a SacctData");
        goto fail;
    }
    if ((r->new_job = PyObject_GetAttrString(job_template, "__copy__")) == NULL ||
        (r->new_sacct = PyObject_GetAttrString(sacct_template, "__copy__")) == NULL ||
        (r->k_gres_detail = PyUnicode_InternFromString("gres_detail")) == NULL)
        goto fail;
    if (r->k_microsecond == NULL || r->k_tzinfo == NULL || r->k_isoformat == NULL || r->no_args == NULL)
        goto fail;
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* a value equal to its field's default (0 or ""): not given, the default is equal */
static int is_default(PyObject *v) {
    if (PyLong_CheckExact(v)) {
        int overflow;
        return PyLong_AsLongLongAndOverflow(v, &overflow) == 0 && !overflow;
    }
    return PyUnicode_CheckExact(v) && PyUnicode_GetLength(v) == 0;
}

/* obj.key = v unless v is a default (the copy has it already); steals v (NULL: error) */
static int put(PyObject *obj, PyObject *key, PyObject *v) {
    if (v == NULL)
        return -1;
    int bad = is_default(v) ? 0 : PyObject_SetAttr(obj, key, v);
    Py_DECREF(v);
    return bad;
}

static PyObject *new_ref(PyObject *v) {
    Py_INCREF(v);
    return v;
}

/* `x or 0` of an int-or-None field (checked by the caller) */
static PyObject *or_zero(PyObject *v) { return v == Py_None ? PyLong_FromLong(0) : new_ref(v); }

/* `_exact`: None -> 0, int -> itself, float -> int(value + 0.5); DOUBT for a float that is not finite */
static PyObject *exact_seconds(PyObject *v) {
    if (v == Py_None)
        return PyLong_FromLong(0);
    if (PyLong_CheckExact(v))
        return new_ref(v);
    double d = PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred())
        return NULL;
    if (!isfinite(d + 0.5))
        return DOUBT;
    return PyLong_FromDouble(d + 0.5);
}

/* `_name`: "Unknown" -> "" */
static PyObject *name(PyObject *v) {
    if (PyUnicode_CompareWithASCIIString(v, "Unknown") == 0)
        return PyUnicode_FromStringAndSize("", 0);
    return new_ref(v);
}

/* `stamp(when)` (no zone): "" for None, `format_timestamp` of a datetime with no microseconds; DOUBT else */
/* `when.isoformat()` for a datetime without microseconds in the fixed zone `r->zone`: its fields and the
 * zone's offset text (always 4-digit years: datetime's are 1..9999); DOUBT when a field is odd */
static PyObject *fixed_stamp(renderer_t *r, PyObject *when) {
    long v[6];
    for (int i = 0; i < 6; i++) {
        PyObject *part = PyObject_GetAttr(when, r->k_parts[i]);
        if (part == NULL)
            return NULL;
        v[i] = PyLong_AsLong(part);
        Py_DECREF(part);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    if (v[0] < 1 || v[0] > 9999 || v[1] < 1 || v[1] > 12 || v[2] < 1 || v[2] > 31 || v[3] < 0 || v[3] > 23 ||
        v[4] < 0 || v[4] > 59 || v[5] < 0 || v[5] > 59)
        return DOUBT;
    char buf[20];
    buf[0] = (char)('0' + v[0] / 1000);
    buf[1] = (char)('0' + v[0] / 100 % 10);
    buf[2] = (char)('0' + v[0] / 10 % 10);
    buf[3] = (char)('0' + v[0] % 10);
    static const int at[5] = {5, 8, 11, 14, 17};
    static const char sep[5] = {'-', '-', 'T', ':', ':'};
    for (int i = 0; i < 5; i++) {
        buf[at[i] - 1] = sep[i];
        buf[at[i]] = (char)('0' + v[i + 1] / 10);
        buf[at[i] + 1] = (char)('0' + v[i + 1] % 10);
    }
    PyObject *head = PyUnicode_FromStringAndSize(buf, 19);
    if (head == NULL)
        return NULL;
    PyObject *out = PyUnicode_Concat(head, r->zone_text);
    Py_DECREF(head);
    return out;
}

static PyObject *stamp(renderer_t *r, PyObject *when) {
    if (when == Py_None)
        return PyUnicode_FromStringAndSize("", 0);
    size_t slot = ((size_t)when >> 4) % STAMP_SLOTS;
    if (r->stamp_when[slot] == when)
        return new_ref(r->stamp_text[slot]);
    PyObject *micro = PyObject_GetAttr(when, r->k_microsecond);
    if (micro == NULL)
        return NULL;
    int zero = is_default(micro) && PyLong_CheckExact(micro);
    Py_DECREF(micro);
    PyObject *tz = PyObject_GetAttr(when, r->k_tzinfo);
    if (tz == NULL)
        return NULL;
    int naive = tz == Py_None, fixed = (PyObject *)Py_TYPE(tz) == r->timezone_type;
    Py_DECREF(tz); /* still held by `when`: compared by address below */
    if (!zero || naive)
        return DOUBT;
    PyObject *out = fixed && tz == r->zone ? fixed_stamp(r, when) : DOUBT;
    if (out == DOUBT)
        out = PyObject_CallMethodObjArgs(when, r->k_isoformat, NULL);
    if (out != NULL && fixed && PyUnicode_CheckExact(out)) {
        if (tz != r->zone && PyUnicode_GetLength(out) > 19) { /* its offset, for the next ones */
            PyObject *zone_text = PyUnicode_Substring(out, 19, PyUnicode_GetLength(out));
            if (zone_text == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            Py_INCREF(tz);
            replace(&r->zone, tz);
            replace(&r->zone_text, zone_text);
        }
        replace(&r->stamp_when[slot], new_ref(when));
        replace(&r->stamp_text[slot], new_ref(out));
    }
    return out;
}

/* the row's fields have the types the parser gives them (anything else: the pure path renders it) */
static int typed(renderer_t *r, PyObject **f) {
    static const int strings[] = {R_STEP_RAW, R_JOB_NAME, R_USER,  R_ACCOUNT,   R_PARTITION,
                                  R_RESERVATION, R_LAYOUT, R_STATE, R_NODE_LIST, R_ALLOC_TRES};
    static const int ints[] = {R_JOB_ID_RAW, R_ELAPSED_RAW, R_AVE_DISK_READ, R_AVE_DISK_WRITE, R_AVE_RSS,
                               R_AVE_VMSIZE, R_MAX_RSS,     R_MAX_VMSIZE,    R_EXIT_STATUS,    R_REQ_CPUS,
                               R_REQ_NODES,  R_PRIORITY,    R_REQ_MEM_KIB};
    static const int seconds[] = {R_SUSPENDED, R_USER_CPU, R_SYSTEM_CPU, R_AVE_CPU, R_MIN_CPU};
    static const int times[] = {R_SUBMIT, R_START, R_END};
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++)
        if (!PyUnicode_CheckExact(f[strings[i]]))
            return 0;
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        if (f[ints[i]] != Py_None && !PyLong_CheckExact(f[ints[i]]))
            return 0;
    for (size_t i = 0; i < sizeof(seconds) / sizeof(seconds[0]); i++) {
        PyObject *v = f[seconds[i]];
        if (v != Py_None && !PyLong_CheckExact(v) && !PyFloat_CheckExact(v))
            return 0;
    }
    for (size_t i = 0; i < sizeof(times) / sizeof(times[0]); i++)
        if (f[times[i]] != Py_None && (PyObject *)Py_TYPE(f[times[i]]) != r->datetime_type)
            return 0;
    if (f[R_JOB] != Py_None && (PyObject *)Py_TYPE(f[R_JOB]) != r->jobid_type)
        return 0;
    if (f[R_REQ_MEM_PER_CPU] != Py_True && f[R_REQ_MEM_PER_CPU] != Py_False)
        return 0;
    PyObject *limit = f[R_TIME_LIMIT];
    if (limit != Py_None && !PyLong_CheckExact(limit) &&
        !(PyUnicode_CheckExact(limit) && PyUnicode_CompareWithASCIIString(limit, "UNLIMITED") == 0))
        return 0;
    return 1;
}

/* a non-negative int field as a long long; 0 when it is negative or too big (DOUBT for the caller) */
static int small_uint(PyObject *v, long long limit, long long *out) {
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || x < 0 || x > limit)
        return 0;
    *out = x;
    return 1;
}

/* the record, DOUBT, or NULL; the JobId's fields are (base, step, array_task_id, array_tasks, het_offset) */
static PyObject *render_fields(renderer_t *r, PyObject **f) {
    PyObject *job_fields = NULL, *v;
    PyObject *base = NULL, *jstep = NULL, *task = Py_None, *tasks = NULL, *offset = Py_None;
    PyObject *out = DOUBT;
    if (f[R_JOB] != Py_None) {
        job_fields = PyObject_CallFunctionObjArgs(r->astuple, f[R_JOB], NULL);
        if (job_fields == NULL)
            return NULL;
        if (!PyTuple_Check(job_fields) || PyTuple_Size(job_fields) != 5)
            goto done;
        base = PyTuple_GetItem(job_fields, 0);
        jstep = PyTuple_GetItem(job_fields, 1);
        task = PyTuple_GetItem(job_fields, 2);
        tasks = PyTuple_GetItem(job_fields, 3);
        offset = PyTuple_GetItem(job_fields, 4);
        if (!PyLong_CheckExact(base) || !PyUnicode_CheckExact(jstep) || !PyUnicode_CheckExact(tasks) ||
            (task != Py_None && !PyLong_CheckExact(task)) || (offset != Py_None && !PyLong_CheckExact(offset)))
            goto done;
    }
    /* `row.job_id`, and the checks `to_slurm_job` raises on (the pure path raises them) */
    PyObject *job_id = f[R_JOB_ID_RAW] != Py_None ? f[R_JOB_ID_RAW] : base;
    long long id;
    if (job_id == NULL || !small_uint(job_id, LLONG_MAX, &id) || id == 0)
        goto done;
    if (PyUnicode_GetLength(f[R_STATE]) == 0 || f[R_SUBMIT] == Py_None)
        goto done;
    PyObject *step = f[R_JOB_ID_RAW] != Py_None ? f[R_STEP_RAW] : (jstep != NULL ? jstep : NULL);
    int is_array = base != NULL && (task != Py_None || PyUnicode_GetLength(tasks) > 0);
    int is_het = base != NULL && offset != Py_None;

    /* time_limit and priority as ExtendedUint (to_extended_uint raises for negative values) */
    PyObject *limit = f[R_TIME_LIMIT];
    long long time_limit = 0, priority = 0, x;
    if (PyLong_CheckExact(limit)) {
        if (!small_uint(limit, (LLONG_MAX - 2) / 60, &x))
            goto done;
        time_limit = x * 60 + 2;
    } else if (limit != Py_None) {
        time_limit = 1; /* UNLIMITED */
    }
    if (f[R_PRIORITY] != Py_None) {
        if (!small_uint(f[R_PRIORITY], LLONG_MAX - 2, &x))
            goto done;
        priority = x + 2;
    }
    PyObject *nodes = NULL;
    if (PyUnicode_GetLength(f[R_NODE_LIST]) > 0) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(f[R_NODE_LIST], &n);
        if (s == NULL) {
            out = NULL;
            goto done;
        }
        if (!ascii(s, n))
            goto done;
        if ((nodes = PyList_New(0)) == NULL) {
            out = NULL;
            goto done;
        }
        int ok = nodelist(s, n, nodes);
        if (ok <= 0) {
            Py_DECREF(nodes);
            out = ok < 0 ? NULL : DOUBT;
            goto done;
        }
    }

    PyObject **k = r->job_keys;
    PyObject *stamps[3] = {NULL, NULL, NULL};
    static const int when[3] = {R_SUBMIT, R_START, R_END};
    for (int i = 0; i < 3; i++) {
        stamps[i] = stamp(r, f[when[i]]);
        if (stamps[i] == NULL || stamps[i] == DOUBT) {
            out = stamps[i];
            for (int j = 0; j < i; j++)
                Py_DECREF(stamps[j]);
            Py_XDECREF(nodes);
            goto done;
        }
    }
    PyObject *suspended = exact_seconds(f[R_SUSPENDED]);
    if (suspended == NULL || suspended == DOUBT) {
        out = suspended;
        for (int j = 0; j < 3; j++)
            Py_DECREF(stamps[j]);
        Py_XDECREF(nodes);
        goto done;
    }
    out = NULL;
    PyObject *vals[J_COUNT] = {NULL};
    vals[J_JOB_ID] = new_ref(job_id);
    vals[J_JOB_STEP] = step != NULL ? new_ref(step) : PyUnicode_FromStringAndSize("", 0);
    vals[J_JOB_NAME] = name(f[R_JOB_NAME]);
    vals[J_JOB_STATE] = new_ref(f[R_STATE]);
    vals[J_ARRAY_JOB_ID] = is_array ? new_ref(base) : PyLong_FromLong(0);
    vals[J_ARRAY_TASK_ID] = task != Py_None ? new_ref(task) : PyLong_FromLong(0);
    vals[J_HET_JOB_ID] = is_het ? new_ref(base) : PyLong_FromLong(0);
    vals[J_HET_JOB_OFFSET] = offset != Py_None ? new_ref(offset) : PyLong_FromLong(0);
    vals[J_USER_NAME] = name(f[R_USER]);
    vals[J_ACCOUNT] = name(f[R_ACCOUNT]);
    vals[J_SUBMIT_TIME] = stamps[0];
    vals[J_TIME_LIMIT] = PyLong_FromLongLong(time_limit);
    vals[J_PARTITION] = new_ref(f[R_PARTITION]);
    vals[J_RESERVATION] = name(f[R_RESERVATION]);
    vals[J_NODES] = nodes != NULL ? nodes : PyLong_FromLong(0); /* 0: not given, the default is [] */
    vals[J_PRIORITY] = PyLong_FromLongLong(priority);
    vals[J_DISTRIBUTION] = new_ref(f[R_LAYOUT]);
    vals[J_ALLOCATED_RESOURCES] = new_ref(f[R_ALLOC_TRES]);
    vals[J_REQUESTED_CPUS] = or_zero(f[R_REQ_CPUS]);
    vals[J_REQUESTED_MEMORY_PER_NODE] =
        f[R_REQ_MEM_PER_CPU] == Py_True ? PyLong_FromLong(0) : or_zero(f[R_REQ_MEM_KIB]);
    vals[J_REQUESTED_NODE_COUNT] = or_zero(f[R_REQ_NODES]);
    vals[J_START_TIME] = stamps[1];
    vals[J_SUSPEND_TIME] = suspended;
    vals[J_END_TIME] = stamps[2];
    vals[J_EXIT_CODE] = or_zero(f[R_EXIT_STATUS]);
    /* SacctData, None when every field is its default (`sacct == _EMPTY_SACCT`) */
    PyObject *svals[S_COUNT] = {NULL};
    static const int sacct_seconds[][2] = {
        {S_MIN_CPU, R_MIN_CPU}, {S_AVE_CPU, R_AVE_CPU}, {S_SYSTEM_CPU, R_SYSTEM_CPU}, {S_USER_CPU, R_USER_CPU}};
    static const int sacct_ints[][2] = {
        {S_AVE_DISK_READ, R_AVE_DISK_READ}, {S_AVE_DISK_WRITE, R_AVE_DISK_WRITE}, {S_AVE_RSS, R_AVE_RSS},
        {S_AVE_VM_SIZE, R_AVE_VMSIZE},      {S_ELAPSED_RAW, R_ELAPSED_RAW},       {S_MAX_RSS, R_MAX_RSS},
        {S_MAX_VM_SIZE, R_MAX_VMSIZE}};
    int doubt = 0;
    for (size_t i = 0; i < sizeof(sacct_seconds) / sizeof(sacct_seconds[0]); i++) {
        v = exact_seconds(f[sacct_seconds[i][1]]);
        if (v == DOUBT) {
            doubt = 1;
            v = NULL;
        }
        svals[sacct_seconds[i][0]] = v;
    }
    for (size_t i = 0; i < sizeof(sacct_ints) / sizeof(sacct_ints[0]); i++)
        svals[sacct_ints[i][0]] = or_zero(f[sacct_ints[i][1]]);
    svals[S_ALLOC_TRES] = new_ref(f[R_ALLOC_TRES]);
    int given = 0, failed = 0;
    for (int i = 0; i < S_COUNT; i++) {
        if (svals[i] == NULL)
            failed = 1;
        else if (!is_default(svals[i]))
            given++;
    }
    PyObject *record = NULL, *sacct = NULL;
    if (!failed && (record = PyObject_CallObject(r->new_job, NULL)) == NULL)
        failed = 1;
    if (!failed && given > 0 && (sacct = PyObject_CallObject(r->new_sacct, NULL)) == NULL)
        failed = 1;
    if (failed && doubt && !PyErr_Occurred())
        out = DOUBT;
    /* every reference is taken: given to `put` or released */
    for (int i = 0; i < S_COUNT; i++) {
        if (failed || sacct == NULL)
            Py_XDECREF(svals[i]);
        else if (put(sacct, r->sacct_keys[i], svals[i]) < 0)
            failed = 1;
    }
    for (int i = 0; i < J_COUNT; i++) {
        if (i == J_SACCT)
            continue;
        if (failed)
            Py_XDECREF(vals[i]);
        else if (put(record, k[i], vals[i]) < 0)
            failed = 1;
    }
    if (!failed && nodes == NULL) { /* the copy's lists are the template's: each record gets its own */
        PyObject *empty = PyList_New(0);
        failed = empty == NULL || PyObject_SetAttr(record, k[J_NODES], empty) < 0;
        Py_XDECREF(empty);
    }
    if (!failed) {
        PyObject *empty = PyList_New(0);
        failed = empty == NULL || PyObject_SetAttr(record, r->k_gres_detail, empty) < 0;
        Py_XDECREF(empty);
    }
    if (!failed && sacct != NULL && PyObject_SetAttr(record, k[J_SACCT], sacct) < 0)
        failed = 1;
    Py_XDECREF(sacct);
    if (failed) {
        Py_XDECREF(record);
        goto done;
    }
    out = record;
done:
    Py_XDECREF(job_fields);
    return out;
}

static PyObject *render(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "render(renderer, row)");
        return NULL;
    }
    PyObject *row_obj = args[1];
    renderer_t *r = PyCapsule_GetPointer(args[0], CAPSULE_RENDER);
    if (r == NULL)
        return NULL;
    PyObject *fields = PyObject_CallFunctionObjArgs(r->astuple, row_obj, NULL);
    if (fields == NULL)
        return NULL;
    if (!PyTuple_Check(fields) || PyTuple_Size(fields) != r->row_width) {
        Py_DECREF(fields);
        Py_RETURN_NONE;
    }
    PyObject *f[R_COUNT];
    for (int i = 0; i < R_COUNT; i++)
        f[i] = PyTuple_GetItem(fields, r->index[i]);
    PyObject *out = DOUBT;
    if (typed(r, f))
        out = render_fields(r, f);
    Py_DECREF(fields);
    if (out == DOUBT)
        Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"plan", plan, METH_VARARGS,
     "plan(columns, delimiter, trailing, joinable, row_type, jobid_type, time_parse, defaults, datetime, "
     "tzinfo) -> "
     "capsule: what `row` and `rows` need for one parse (columns: per column (kind, position, position2 or "
     "-1, name))."},
    {"lines_plain", lines_plain, METH_O,
     "lines_plain(text: str) -> bool: `rows` may read it (no line break but \\n and \\r, no lone surrogate)."},
    {"rows", rows, METH_VARARGS,
     "rows(plan, text, offset, lineno, limit) -> (items, offset, lineno, left): SacctRows, and (number, "
     "line) for each line the caller decides (left: how many); offset -1 when the text is done."},
    {"row", (PyCFunction)(void (*)(void))row, METH_FASTCALL,
     "row(plan, line: str, lineno: int) -> SacctRow | None: the row the pure path gives for this line, or "
     "None when the pure path must decide it."},
    {"renderer", renderer, METH_VARARGS,
     "renderer(SlurmJob, SacctData, astuple, JobId, datetime, timezone, positions, width) -> capsule for "
     "`render`."},
    {"render", (PyCFunction)(void (*)(void))render, METH_FASTCALL,
     "render(renderer, row) -> SlurmJob | None: `to_slurm_job(row)`, or None when the pure path must render "
     "it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sacct", "The compiled sacct reader (see schemas/slurm/sacct/compiled.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sacct(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_COLUMNS", MAX_COLUMNS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
