/* hpcbus.schemas.ocs._read: the compiled OCS accounting ingest (issue 24), each function the twin of a Python
 * one that stays the reference (tests/test_compiled_ocs.py holds them equal):
 *   - `read_usual`, `read_records`: `accounting.parse_usual` of a line, of a chunk's lines (below);
 *   - `merge_add`: `updates.JobMerger.add` (the job of one new record here, any other by `_update`);
 *   - `map_jobs`: `mapping.map_jobs_pure` (Sonar records and cc-backend event lines of the updates);
 *   - `split_lines`: `follow.split_lines_pure` (a chunk's bytes into `RawLine`s);
 *   - `escape_field`: `mapping.escape_field_pure` (the jobs envelope's JSON as a line protocol string field).
 * What C is unsure of (another shape, odd types or sizes, text to escape) it hands to the Python code.
 * Module constants (interned names, key tables) are made once at import; nothing else is kept between calls.
 *
 * Why C: reading the usual OCS JSONL record cost a typed msgspec decode into nested structs and then a
 * Python function that copied their ~55 values into the `AccountingRecord` (`_from_usual`): about as much
 * as the decode again. Here one pass over the line's bytes finds every value and the record is built from
 * them at once, with no struct or dict in between.
 *
 * Contract (the pure twin is `accounting.parse_usual_pure`): `read_usual(record_type, fallback, line)`
 * returns `record_type(...)` built positionally in `accounting._FIELD_ORDER` when the line has exactly the
 * usual shape, else `fallback(line)` (the pure path decides: it may read the record another way, answer
 * None, or raise). The usual shape, all of it or the line goes to the pure path:
 *   - a JSON object starting at the first byte, JSON whitespace only around tokens and after it;
 *   - top-level keys among the job keys of `typed.UsualRecord` (integers, times, strings) and `usage`,
 *     no key twice (`time`, `type`, anything else: the pure path);
 *   - `usage` an object of `rusage` and `eusage` (or `usage`, OCS 9.0.0-9.0.5, but not both), each an
 *     object of their known keys only;
 *   - strings without a backslash or a control byte, valid UTF-8 (Python's strict decoder);
 *   - integers `-?(0|[1-9][0-9]*)` of at most 18 digits where an integer must be; where a float may be,
 *     such an integer or a JSON number of at most 64 bytes that is finite as a double; the eusage counts
 *     (`ioops`, `maxvmem`, `maxrss`, `maxpss`) may be floats only when whole (the pure path rounds others);
 *   - `job_number` at least 1 and no time negative (the pure path names those problems).
 * This file decides nothing the pure path would decide otherwise: a test holds the two equal.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "_buffer.h"

#define FLOAT_MAX_BYTES 64
#define INT_MAX_DIGITS 18

/* The record's leading fields, in `accounting._FIELD_ORDER` (a Python test holds this order). */
enum {
    F_JOB_NUMBER, F_TASK_NUMBER, F_PE_TASKID, F_OWNER, F_GROUP, F_ACCOUNT, F_PROJECT, F_DEPARTMENT,
    F_QNAME, F_HOSTNAME, F_HOSTS, F_JOB_NAME, F_GRANTED_PE, F_SLOTS, F_PRIORITY, F_CATEGORY,
    F_SUBMIT_CMD_LINE, F_ARID, F_SUBMISSION_TIME, F_START_TIME, F_END_TIME, F_AR_SUBMISSION_TIME,
    F_FAILED, F_EXIT_STATUS, F_DELETED_BY,
    F_RU_WALLCLOCK, F_RU_UTIME, F_RU_STIME, F_RU_MAXRSS, F_RU_IXRSS, F_RU_ISMRSS, F_RU_IDRSS, F_RU_ISRSS,
    F_RU_MINFLT, F_RU_MAJFLT, F_RU_NSWAP, F_RU_INBLOCK, F_RU_OUBLOCK, F_RU_MSGSND, F_RU_MSGRCV,
    F_RU_NSIGNALS, F_RU_NVCSW, F_RU_NIVCSW,
    F_WALLCLOCK, F_CPU, F_MEM, F_IO, F_IOOPS, F_IOW, F_MAXVMEM, F_MAXRSS, F_MAXPSS,
    F_CUSTOM_USAGE, F_EXTRA,
    N_FIELDS,
    F_PE_TASK_ID = N_FIELDS /* read, then given as pe_taskid */
};

/* What a key holds and how its value becomes the record's. */
typedef enum {
    K_INT,      /* an integer */
    K_TIME,     /* an integer of microseconds, given as whole seconds */
    K_STR,      /* a string, "" when absent */
    K_OPT_STR,  /* a string, None when absent, "", NONE or none */
    K_FLOAT,    /* a float (an integer literal becomes a float), 0.0 when absent */
    K_OPT_FLOAT,/* a float, None when absent */
    K_COUNT,    /* an rusage count: an integer only, 0 when absent */
    K_WHOLE,    /* an eusage count: an integer or a whole float, 0 when absent */
    K_OPT_WHOLE /* an eusage count, None when absent */
} kind;

typedef struct {
    const char *name;
    int field;
    kind k;
    size_t len; /* strlen(name), set by init_keys */
} key;

/* in the order OCS writes them (sge_rusage.cc), so that the first look finds each (`lookup`) */
static key JOB_KEYS[] = {
    {"job_number", F_JOB_NUMBER, K_INT, 0},
    {"task_number", F_TASK_NUMBER, K_INT, 0},
    {"start_time", F_START_TIME, K_TIME, 0},
    {"end_time", F_END_TIME, K_TIME, 0},
    {"owner", F_OWNER, K_STR, 0},
    {"group", F_GROUP, K_STR, 0},
    {"account", F_ACCOUNT, K_STR, 0},
    {"qname", F_QNAME, K_STR, 0},
    {"hostname", F_HOSTNAME, K_STR, 0},
    {"department", F_DEPARTMENT, K_OPT_STR, 0},
    {"slots", F_SLOTS, K_INT, 0},
    {"job_name", F_JOB_NAME, K_STR, 0},
    {"priority", F_PRIORITY, K_INT, 0},
    {"submission_time", F_SUBMISSION_TIME, K_TIME, 0},
    {"submit_cmd_line", F_SUBMIT_CMD_LINE, K_OPT_STR, 0},
    {"category", F_CATEGORY, K_OPT_STR, 0},
    {"failed", F_FAILED, K_INT, 0},
    {"exit_status", F_EXIT_STATUS, K_INT, 0},
    {"deleted_by", F_DELETED_BY, K_OPT_STR, 0},
    {"arid", F_ARID, K_INT, 0},
    {"ar_submission_time", F_AR_SUBMISSION_TIME, K_TIME, 0},
    {"project", F_PROJECT, K_OPT_STR, 0},
    {"granted_pe", F_GRANTED_PE, K_OPT_STR, 0},
    {"pe_taskid", F_PE_TASKID, K_OPT_STR, 0},
    {"pe_task_id", F_PE_TASK_ID, K_OPT_STR, 0},
    {NULL, 0, K_INT, 0},
};

static key RUSAGE_KEYS[] = {
    {"ru_wallclock", F_RU_WALLCLOCK, K_FLOAT, 0},
    {"ru_utime", F_RU_UTIME, K_FLOAT, 0},
    {"ru_stime", F_RU_STIME, K_FLOAT, 0},
    {"ru_maxrss", F_RU_MAXRSS, K_COUNT, 0},
    {"ru_ixrss", F_RU_IXRSS, K_COUNT, 0},
    {"ru_ismrss", F_RU_ISMRSS, K_COUNT, 0},
    {"ru_idrss", F_RU_IDRSS, K_COUNT, 0},
    {"ru_isrss", F_RU_ISRSS, K_COUNT, 0},
    {"ru_minflt", F_RU_MINFLT, K_COUNT, 0},
    {"ru_majflt", F_RU_MAJFLT, K_COUNT, 0},
    {"ru_nswap", F_RU_NSWAP, K_COUNT, 0},
    {"ru_inblock", F_RU_INBLOCK, K_COUNT, 0},
    {"ru_oublock", F_RU_OUBLOCK, K_COUNT, 0},
    {"ru_msgsnd", F_RU_MSGSND, K_COUNT, 0},
    {"ru_msgrcv", F_RU_MSGRCV, K_COUNT, 0},
    {"ru_nsignals", F_RU_NSIGNALS, K_COUNT, 0},
    {"ru_nvcsw", F_RU_NVCSW, K_COUNT, 0},
    {"ru_nivcsw", F_RU_NIVCSW, K_COUNT, 0},
    {NULL, 0, K_INT, 0},
};

static key EUSAGE_KEYS[] = {
    {"wallclock", F_WALLCLOCK, K_OPT_FLOAT, 0},
    {"cpu", F_CPU, K_FLOAT, 0},
    {"mem", F_MEM, K_FLOAT, 0},
    {"io", F_IO, K_FLOAT, 0},
    {"ioops", F_IOOPS, K_OPT_WHOLE, 0},
    {"iow", F_IOW, K_FLOAT, 0},
    {"maxvmem", F_MAXVMEM, K_WHOLE, 0},
    {"maxrss", F_MAXRSS, K_OPT_WHOLE, 0},
    {"maxpss", F_MAXPSS, K_OPT_WHOLE, 0},
    {NULL, 0, K_INT, 0},
};

/* One value as read: which of these holds it depends on the key's kind. */
typedef struct {
    int seen;
    long long i;   /* K_INT, K_TIME, K_COUNT; K_WHOLE kinds when !is_float */
    double d;      /* K_FLOAT kinds; K_WHOLE kinds when is_float */
    int is_float;
    const char *s; /* K_STR kinds: the bytes between the quotes */
    Py_ssize_t n;
} value;

typedef struct {
    const char *p;
    const char *end;
    value v[N_FIELDS + 1];
} reader;

static void skip_ws(reader *r) {
    const char *p = r->p, *end = r->end;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    r->p = p;
}

/* 1 and the next byte consumed when it is `c` (after whitespace) */
static int expect(reader *r, char c) {
    skip_ws(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return 1;
    }
    return 0;
}

/* A string without escapes or control bytes: its bytes between the quotes. 0 when not one. */
static int string(reader *r, const char **s, Py_ssize_t *n) {
    if (!expect(r, '"'))
        return 0;
    const char *start = r->p, *p = start, *end = r->end; /* locals: the loop keeps them in registers */
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            *s = start;
            *n = p - start;
            r->p = p + 1;
            return 1;
        }
        if (c == '\\' || c < 0x20)
            return 0;
        p++;
    }
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#ifdef __SIZEOF_INT128__
__extension__ typedef unsigned __int128 uint128; /* GCC and Clang on 64-bit targets */
#endif

static const unsigned long long POW10_INT[] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
    10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
    10000000000000000000ULL};

/* The double of the JSON number [s, end) (grammar already checked), correctly rounded (as strtod and
 * msgspec give it), when it is cheap to get; 0 for any other (the caller asks Python's strtod).
 *   - at most 15 significant digits and a power of ten up to 22 either way: both are exact as doubles, so
 *     one multiplication or division rounds correctly (Clinger's fast path);
 *   - at most 19 digits (what `repr` writes: 17) and a power of ten up to 19 either way, where the compiler
 *     has 128-bit integers: the value m * 10^k is an exact integer, and m / 10^k is computed as an integer
 *     quotient of at least 55 bits with a sticky bit for the remainder; converting an integer to a double
 *     rounds to nearest even, and the scaling by a power of two after it is exact. */
static int fast_double(const char *s, const char *end, double *out) {
    int negative = *s == '-';
    const char *p = s + negative;
    unsigned long long m = 0;
    int digits = 0, scale = 0, frac = 0;
    for (; p < end && (is_digit(*p) || *p == '.'); p++) {
        if (*p == '.') {
            frac = 1;
            continue;
        }
        if (m == 0 && *p == '0') { /* a leading zero: no significant digit */
            if (frac)
                scale--;
            continue;
        }
        if (++digits > 19)
            return 0;
        m = m * 10 + (unsigned long long)(*p - '0');
        if (frac)
            scale--;
    }
    if (p < end) { /* the exponent */
        p++;
        int eneg = 0, e = 0;
        if (*p == '+' || *p == '-')
            eneg = *p++ == '-';
        for (; p < end; p++) {
            if (e > 1000)
                return 0;
            e = e * 10 + (*p - '0');
        }
        scale += eneg ? -e : e;
    }
    double x = (double)m;
    if (m == 0) {
        /* zero, whatever the exponent */
    } else if (digits <= 15 && scale >= -22 && scale <= 22) {
        x = scale < 0 ? x / POW10[-scale] : x * POW10[scale];
#ifdef __SIZEOF_INT128__
    } else if (scale >= 0 && scale <= 19) {
        x = (double)((uint128)m * POW10_INT[scale]); /* < 2^128: exact, then rounded once */
    } else if (scale < 0 && scale >= -19) {
        int bits = 64 - __builtin_clzll(m);
        int shift = 127 - bits; /* m << shift < 2^127; the quotient keeps >= 127 - 64 - 1 bits */
        uint128 n = (uint128)m << shift, d = POW10_INT[-scale];
        uint128 q = n / d;
        if (n % d != 0)
            q |= 1; /* sticky: the value is above q, below q + 1 */
        x = ldexp((double)q, -shift);
#endif
    } else {
        return 0;
    }
    *out = negative ? -x : x;
    return 1;
}

/* A JSON number: 1 for an integer literal of at most INT_MAX_DIGITS digits (in *i), 2 for any other number
 * of at most FLOAT_MAX_BYTES bytes that is a finite double (in *d), 0 for anything else. */
static int number(reader *r, long long *i, double *d) {
    skip_ws(r);
    const char *start = r->p, *p = r->p, *end = r->end;
    int negative = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    const char *digits = p;
    if (p < end && *p == '0')
        p++;
    else if (p < end && *p >= '1' && *p <= '9')
        while (p < end && is_digit(*p))
            p++;
    else
        return 0;
    Py_ssize_t ndigits = p - digits;
    int integer = 1;
    if (p < end && *p == '.') {
        integer = 0;
        p++;
        if (p >= end || !is_digit(*p))
            return 0;
        while (p < end && is_digit(*p))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !is_digit(*p))
            return 0;
        while (p < end && is_digit(*p))
            p++;
    }
    r->p = p;
    if (!integer && fast_double(start, p, d))
        return 2;
    if (integer) {
        if (ndigits > INT_MAX_DIGITS)
            goto as_float;
        long long v = 0;
        for (const char *q = digits; q < p; q++)
            v = v * 10 + (*q - '0');
        *i = negative ? -v : v;
        return 1;
    }
as_float:
    if (p - start > FLOAT_MAX_BYTES)
        return 0;
    char buf[FLOAT_MAX_BYTES + 1];
    memcpy(buf, start, (size_t)(p - start));
    buf[p - start] = '\0';
    char *stop = NULL;
    double x = PyOS_string_to_double(buf, &stop, NULL);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (stop != buf + (p - start) || !isfinite(x))
        return 0;
    *d = x;
    return integer ? 3 : 2; /* 3: an integer literal too long for *i */
}

/* The value of key `k` into r->v; 0 when it does not have the kind's shape. */
static int read_value(reader *r, const key *k) {
    value *v = &r->v[k->field];
    if (v->seen)
        return 0; /* a key given twice */
    v->seen = 1;
    long long i = 0;
    double d = 0.0;
    int got;
    switch (k->k) {
    case K_STR:
    case K_OPT_STR:
        return string(r, &v->s, &v->n);
    case K_INT:
    case K_COUNT:
        if (number(r, &i, &d) != 1)
            return 0;
        v->i = i;
        return 1;
    case K_TIME:
        if (number(r, &i, &d) != 1 || i < 0)
            return 0; /* a negative time: the pure path names it */
        v->i = i / 1000000;
        return 1;
    case K_FLOAT:
    case K_OPT_FLOAT:
        got = number(r, &i, &d);
        if (got == 1)
            v->d = (double)i; /* what msgspec makes of an integer where a float is expected */
        else if (got == 2)
            v->d = d;
        else
            return 0; /* a long integer literal: msgspec's conversion is left to it */
        return 1;
    case K_WHOLE:
    case K_OPT_WHOLE:
        got = number(r, &i, &d);
        if (got == 1) {
            v->i = i;
            return 1;
        }
        if (got == 2 && d == floor(d)) {
            v->d = d;
            v->is_float = 1;
            return 1;
        }
        return 0; /* a fraction: the pure path rounds it */
    }
    return 0;
}

/* The key `s` among `keys`, NULL when it is none of them. `*hint` is where to look first, the key after the
 * one found last: writers put the keys in one order, so the first look finds it. */
static const key *lookup(const char *s, Py_ssize_t n, const key *keys, const key **hint) {
    const key *h = *hint;
    if (h != NULL && h->name != NULL && (size_t)n == h->len && memcmp(s, h->name, (size_t)n) == 0) {
        *hint = h + 1;
        return h;
    }
    for (const key *k = keys; k->name != NULL; k++)
        if ((size_t)n == k->len && memcmp(s, k->name, (size_t)n) == 0) {
            *hint = k + 1;
            return k;
        }
    return NULL;
}

/* The key at r->p among `keys`, with its ':' read; NULL when it is none of them. */
static const key *find_key(reader *r, const key *keys, const key **hint) {
    const char *s;
    Py_ssize_t n;
    if (!string(r, &s, &n) || !expect(r, ':'))
        return NULL;
    return lookup(s, n, keys, hint);
}

/* An object of `keys` (the '{' not yet read); 0 when it is not one. */
static int object(reader *r, const key *keys) {
    if (!expect(r, '{'))
        return 0;
    if (expect(r, '}'))
        return 1;
    const key *hint = keys;
    do {
        const key *k = find_key(r, keys, &hint);
        if (k == NULL || !read_value(r, k))
            return 0;
    } while (expect(r, ','));
    return expect(r, '}');
}

/* `usage`: {rusage: {...}, eusage|usage: {...}} */
static int usage(reader *r) {
    int rusage = 0, eusage = 0;
    if (!expect(r, '{'))
        return 0;
    if (expect(r, '}'))
        return 1;
    do {
        const char *s;
        Py_ssize_t n;
        if (!string(r, &s, &n) || !expect(r, ':'))
            return 0;
        if (n == 6 && memcmp(s, "rusage", 6) == 0 && !rusage) {
            rusage = 1;
            if (!object(r, RUSAGE_KEYS))
                return 0;
        } else if (((n == 6 && memcmp(s, "eusage", 6) == 0) || (n == 5 && memcmp(s, "usage", 5) == 0)) &&
                   !eusage) {
            eusage = 1; /* both names at once: one is a custom container, for the pure path */
            if (!object(r, EUSAGE_KEYS))
                return 0;
        } else {
            return 0;
        }
    } while (expect(r, ','));
    return expect(r, '}');
}

/* The whole line; 0 when it is not the usual shape. */
static int record(reader *r) {
    int seen_usage = 0;
    if (r->p >= r->end || *r->p != '{')
        return 0;
    r->p++;
    if (expect(r, '}'))
        return 0; /* no job_number */
    const key *hint = JOB_KEYS;
    do {
        const char *s;
        Py_ssize_t n;
        if (!string(r, &s, &n) || !expect(r, ':'))
            return 0;
        if (n == 5 && memcmp(s, "usage", 5) == 0) {
            if (seen_usage || !usage(r))
                return 0;
            seen_usage = 1;
            continue;
        }
        const key *k = lookup(s, n, JOB_KEYS, &hint);
        if (k == NULL || !read_value(r, k))
            return 0;
    } while (expect(r, ','));
    if (!expect(r, '}'))
        return 0;
    skip_ws(r);
    return r->p == r->end && r->v[F_JOB_NUMBER].seen && r->v[F_JOB_NUMBER].i > 0;
}

/* `typed.optional_text`: None for "", NONE and none */
static int not_set(const value *v) {
    return !v->seen || v->n == 0 || (v->n == 4 && (memcmp(v->s, "NONE", 4) == 0 || memcmp(v->s, "none", 4) == 0));
}

/* A field's string as the line before gave it (consecutive records repeat group, account, queue, ...):
 * then the same str object serves both. Only within one call of `read_records`. */
typedef struct {
    const char *s;
    Py_ssize_t n;
    PyObject *text; /* a strong reference, or NULL */
} cached;

/* The Python value of field `f` as read (a new reference), or NULL with an exception set; *bad set (and
 * no exception) when a string is not UTF-8. `c`: the field's cached string, or NULL. */
static PyObject *field_value(const value *v, kind k, int *bad, cached *c) {
    switch (k) {
    case K_INT:
    case K_TIME:
    case K_COUNT:
        return PyLong_FromLongLong(v->seen ? v->i : 0);
    case K_STR:
    case K_OPT_STR:
        if (k == K_OPT_STR && not_set(v))
            Py_RETURN_NONE;
        if (!v->seen)
            return PyUnicode_FromStringAndSize("", 0);
        if (c != NULL && c->text != NULL && c->n == v->n && memcmp(c->s, v->s, (size_t)v->n) == 0) {
            Py_INCREF(c->text);
            return c->text;
        }
        PyObject *text = PyUnicode_DecodeUTF8(v->s, v->n, NULL);
        if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            *bad = 1;
        }
        if (text != NULL && c != NULL) {
            Py_XDECREF(c->text);
            Py_INCREF(text);
            c->text = text;
            c->s = v->s;
            c->n = v->n;
        }
        return text;
    case K_FLOAT:
        return PyFloat_FromDouble(v->seen ? v->d : 0.0);
    case K_OPT_FLOAT:
        if (!v->seen)
            Py_RETURN_NONE;
        return PyFloat_FromDouble(v->d);
    case K_WHOLE:
    case K_OPT_WHOLE:
        if (!v->seen) {
            if (k == K_OPT_WHOLE)
                Py_RETURN_NONE;
            return PyLong_FromLong(0);
        }
        return v->is_float ? PyLong_FromDouble(v->d) : PyLong_FromLongLong(v->i);
    }
    PyErr_SetString(PyExc_SystemError, "_read: unknown kind");
    return NULL;
}

/* Every field's kind, by field. */
static kind KINDS[N_FIELDS + 1];

static void init_keys(void) {
    key *tables[] = {JOB_KEYS, RUSAGE_KEYS, EUSAGE_KEYS};
    for (size_t t = 0; t < 3; t++)
        for (key *k = tables[t]; k->name != NULL; k++) {
            KINDS[k->field] = k->k;
            k->len = strlen(k->name);
        }
}

/* The record's arguments as a tuple (a new reference); NULL with an exception set, or NULL with *bad set
 * when the pure path must read the line. `cache`: N_FIELDS + 1 strings of the line before, or NULL. */
static PyObject *arguments(reader *r, int *bad, cached *cache) {
    PyObject *args = PyTuple_New(N_FIELDS);
    if (args == NULL)
        return NULL;
    for (int f = 0; f < N_FIELDS; f++) {
        PyObject *item;
        if (f == F_HOSTS) {
            continue; /* from the hostname, below */
        } else if (f == F_CUSTOM_USAGE || f == F_EXTRA) {
            item = PyDict_New();
        } else if (f == F_PE_TASKID && r->v[F_PE_TASK_ID].seen) {
            item = field_value(&r->v[F_PE_TASK_ID], K_OPT_STR, bad, cache ? &cache[F_PE_TASK_ID] : NULL);
        } else {
            item = field_value(&r->v[f], KINDS[f], bad, cache ? &cache[f] : NULL);
        }
        if (item == NULL) {
            Py_DECREF(args);
            return NULL;
        }
        if (PyTuple_SetItem(args, f, item) < 0) { /* steals `item` */
            Py_DECREF(args);
            return NULL;
        }
    }
    PyObject *hostname = PyTuple_GetItem(args, F_HOSTNAME); /* borrowed */
    PyObject *hosts = PyUnicode_GetLength(hostname) > 0 ? PyTuple_Pack(1, hostname) : PyTuple_New(0);
    if (hosts == NULL || PyTuple_SetItem(args, F_HOSTS, hosts) < 0) {
        Py_DECREF(args);
        return NULL;
    }
    PyObject_GC_UnTrack(hosts); /* a tuple of a str: in no cycle (the collector would untrack it later) */
    return args;
}

/* what the pure path makes of the line */
static PyObject *pure(PyObject *fallback, PyObject *line) { return PyObject_CallFunctionObjArgs(fallback, line, NULL); }

static PyObject *read_usual(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "read_usual(record_type, fallback, line) takes 3 arguments");
        return NULL;
    }
    PyObject *record_type = args[0], *fallback = args[1], *line = args[2];
    char *buf;
    Py_ssize_t size;
    if (!PyBytes_Check(line) || PyBytes_AsStringAndSize(line, &buf, &size) < 0)
        return pure(fallback, line);
    reader r;
    memset(&r, 0, sizeof r);
    r.p = buf;
    r.end = buf + size;
    if (!record(&r))
        return pure(fallback, line);
    int bad = 0;
    PyObject *values = arguments(&r, &bad, NULL);
    if (values == NULL)
        return bad ? pure(fallback, line) : NULL;
    PyObject *out = PyObject_Call(record_type, values, NULL);
    Py_DECREF(values);
    return out;
}

static PyObject *NAME_TEXT, *NAME_NUMBER; /* "text", "number": interned at module init */

/* read_records(record_type, lines) -> (records, numbers) | None: each line (a `RawLine`) read as
 * `read_usual` reads it, when every one has the usual shape; None at the first that has not (the caller
 * then reads the chunk line by line, the pure path deciding those lines). */
static PyObject *read_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "read_records(record_type, lines: list)");
        return NULL;
    }
    PyObject *record_type = args[0], *lines = args[1], *out = NULL;
    Py_ssize_t n = PyList_Size(lines);
    PyObject *records = PyList_New(n), *numbers = PyList_New(n);
    cached cache[N_FIELDS + 1];
    memset(cache, 0, sizeof cache);
    reader r;
    int unusual = 0;
    if (records == NULL || numbers == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GetItem(lines, i);
        if (raw == NULL)
            goto done;
        PyObject *line = PyObject_GetAttr(raw, NAME_TEXT);
        if (line == NULL)
            goto done;
        char *buf;
        Py_ssize_t size;
        if (!PyBytes_Check(line) || PyBytes_AsStringAndSize(line, &buf, &size) < 0) {
            Py_DECREF(line);
            unusual = 1;
            break;
        }
        memset(&r, 0, sizeof r);
        r.p = buf;
        r.end = buf + size;
        int usual = record(&r), bad = 0;
        PyObject *values = usual ? arguments(&r, &bad, cache) : NULL;
        Py_DECREF(line); /* `lines` holds it: the cached spans stay valid */
        if (values == NULL) {
            if (usual && !bad)
                goto done;
            unusual = 1;
            break;
        }
        PyObject *record = PyObject_Call(record_type, values, NULL);
        Py_DECREF(values);
        if (record == NULL)
            goto done;
        PyList_SetItem(records, i, record); /* steals */
        PyObject *number = PyObject_GetAttr(raw, NAME_NUMBER);
        if (number == NULL)
            goto done;
        PyList_SetItem(numbers, i, number);
    }
    if (unusual) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        out = PyTuple_Pack(2, records, numbers);
    }
done:
    for (int f = 0; f <= N_FIELDS; f++)
        Py_XDECREF(cache[f].text);
    Py_XDECREF(records);
    Py_XDECREF(numbers);
    return out;
}


/* --- mapping: a job update -> its Sonar record and its cc-backend event lines ---------------------------- */

/* Attribute names, interned once (constants: module init makes them, nothing changes them). */
enum {
    A_RECORD, A_ENDED, A_FINAL_NOW, A_JOB_NUMBER, A_TASK_NUMBER, A_OWNER, A_ACCOUNT, A_QNAME, A_HOSTNAME,
    A_HOSTS, A_JOB_NAME, A_SLOTS, A_CATEGORY, A_ARID, A_SUBMISSION_TIME, A_START_TIME, A_END_TIME,
    A_EXIT_STATUS, A_RU_WALLCLOCK, A_RU_UTIME, A_RU_STIME, A_CPU, A_MAXRSS, A_RU_MAXRSS, A_MAXVMEM,
    A_FAILED, A_DELETED_BY,
    N_ATTRS
};
static const char *ATTR_NAMES[N_ATTRS] = {
    "record", "ended", "final_now", "job_number", "task_number", "owner", "account", "qname", "hostname",
    "hosts", "job_name", "slots", "category", "arid", "submission_time", "start_time", "end_time",
    "exit_status", "ru_wallclock", "ru_utime", "ru_stime", "cpu", "maxrss", "ru_maxrss", "maxvmem",
    "failed", "deleted_by",
};

/* Slurm state words `state.job_state` gives without a look at the runtime limit, and their cc-backend
 * names (`ccbackend.cc_job_state`; REQUEUED has none: not an end of the job). */
enum { S_REQUEUED, S_TIMEOUT, S_CANCELLED, S_NODE_FAIL, S_FAILED, S_COMPLETED, N_STATES };
static const char *STATE_NAMES[N_STATES] = {"REQUEUED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "FAILED", "COMPLETED"};
static const char *CC_NAMES[N_STATES] = {NULL, "timeout", "cancelled", "node_fail", "failed", "completed"};
static PyObject *STATE_WORDS[N_STATES];
static PyObject *ATTRS[N_ATTRS];
/* where each record value is in the record's fields (the update's own: -1) */
static const int ATTR_FIELD[N_ATTRS] = {
    -1, -1, -1, F_JOB_NUMBER, F_TASK_NUMBER, F_OWNER, F_ACCOUNT, F_QNAME, F_HOSTNAME, F_HOSTS, F_JOB_NAME,
    F_SLOTS, F_CATEGORY, F_ARID, F_SUBMISSION_TIME, F_START_TIME, F_END_TIME, F_EXIT_STATUS, F_RU_WALLCLOCK,
    F_RU_UTIME, F_RU_STIME, F_CPU, F_MAXRSS, F_RU_MAXRSS, F_MAXVMEM, F_FAILED, F_DELETED_BY,
};

/* Keyword argument names of the Sonar structs, interned once (msgspec matches interned names fastest). */
enum {
    KW_ACCOUNT, KW_ALLOC_TRES, KW_ALLOCATED_RESOURCES, KW_ARRAY_JOB_ID, KW_ARRAY_TASK_ID, KW_AVE_CPU,
    KW_ELAPSED_RAW, KW_END_TIME, KW_EXIT_CODE, KW_JOB_ID, KW_JOB_NAME, KW_JOB_STATE, KW_MAX_RSS, KW_MAX_VM_SIZE,
    KW_NODES, KW_PARTITION, KW_REQ_CPUS, KW_REQUESTED_CPUS, KW_RESERVATION, KW_SACCT, KW_START_TIME,
    KW_SUBMIT_TIME, KW_SYSTEM_CPU, KW_TIME_LIMIT, KW_USER_CPU, KW_USER_NAME,
    N_KW
};
static const char *KW_NAMES[N_KW] = {
    "account", "alloc_tres", "allocated_resources", "array_job_id", "array_task_id", "ave_cpu", "elapsed_raw",
    "end_time", "exit_code", "job_id", "job_name", "job_state", "max_rss", "max_vm_size", "nodes", "partition",
    "req_cpus", "requested_cpus", "reservation", "sacct", "start_time", "submit_time", "system_cpu",
    "time_limit", "user_cpu", "user_name",
};
static PyObject *KWS[N_KW];

#define UINT_MAX_SONAR 9223372036854775807LL /* mapping._UINT_MAX */
#define LAST_TIMESTAMP 253402300799LL         /* mapping._LAST_TIMESTAMP */

/* the event lines are written into a `buffer` (`_buffer.h`) */
static int put(buffer *b, const char *s, Py_ssize_t n) {
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

static int puts_(buffer *b, const char *s) { return put(b, s, (Py_ssize_t)strlen(s)); }

static int put_int(buffer *b, long long v) {
    char num[24];
    char *p = decimal(v, num + sizeof num);
    return put(b, p, num + sizeof num - p);
}

/* A string written in JSON inside a line-protocol string field: its quotes escaped (`\"`). The text must be
 * `plain` (checked before anything is written). */
static int put_json_string(buffer *b, const char *s, Py_ssize_t n) {
    if (put(b, "\\\"", 2) < 0 || put(b, s, n) < 0)
        return -1;
    return put(b, "\\\"", 2);
}

/* printable ASCII without `"` and `\`: msgspec writes it as it is, and line protocol escapes nothing in it */
static int plain(PyObject *text, const char **s, Py_ssize_t *n) {
    if (!PyUnicode_Check(text))
        return 0;
    *s = PyUnicode_AsUTF8AndSize(text, n);
    if (*s == NULL) {
        PyErr_Clear();
        return 0;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        unsigned char c = (unsigned char)(*s)[i];
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
            return 0;
    }
    return 1;
}

/* `mapping._seconds`: whole seconds, rounded, capped */
static long long seconds_of(double x) {
    if (x > 0) {
        double v = x + 0.5;
        return v >= 9223372036854775807.0 ? UINT_MAX_SONAR : (long long)v;
    }
    return 0;
}

/* `mapping._kib`: bytes -> KiB rounded up (v >= 0 here) */
static long long kib_of(long long v) { return v > 0 ? v / 1024 + (v % 1024 != 0) : 0; }

/* `mapping.timestamp` for 0 <= t <= LAST_TIMESTAMP: days to the civil date (Howard Hinnant's algorithm) */
static PyObject *timestamp(long long t) {
    long long days = t / 86400, rest = t % 86400;
    long long z = days + 719468, era = z / 146097, doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long y = yoe + era * 400, doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    long long d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    if (m <= 2)
        y++;
    char text[] = "YYYY-MM-DDTHH:MM:SS+00:00"; /* y is 1970 .. 9999 here */
    long long parts[] = {y / 100, y % 100, m, d, rest / 3600, rest / 60 % 60, rest % 60};
    static const int at[] = {0, 2, 5, 8, 11, 14, 17};
    for (int i = 0; i < 7; i++) {
        text[at[i]] = (char)('0' + parts[i] / 10);
        text[at[i] + 1] = (char)('0' + parts[i] % 10);
    }
    return PyUnicode_FromStringAndSize(text, (Py_ssize_t)sizeof text - 1);
}

/* The values read from one update (borrowed from `attrs`, or C numbers). */
typedef struct {
    PyObject *attrs[N_ATTRS];
    long long job_number, task_number, slots, arid, submission_time, start_time, end_time, exit_status;
    long long maxrss, ru_maxrss, maxvmem, failed;
    int has_maxrss, ended, final_now, deleted;
    double ru_wallclock, ru_utime, ru_stime, cpu;
} job;

static void job_clear(job *j) {
    for (int i = 0; i < N_ATTRS; i++)
        Py_CLEAR(j->attrs[i]);
}

static int as_ll(PyObject *o, long long *v) {
    if (!PyLong_Check(o))
        return 0;
    int overflow = 0;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (*v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow;
}

/* a float that is not infinite (`int(inf)` raises in the pure path: it is left to raise there) */
static int as_double(PyObject *o, double *v) {
    if (!PyFloat_Check(o))
        return 0;
    *v = PyFloat_AsDouble(o);
    return !isinf(*v);
}

/* Read the update's values: 1 when every one is of the usual type and size, 0 when the pure path must map
 * it, -1 with an exception. */
static int read_job(PyObject *update, job *j, PyObject *astuple) {
    memset(j, 0, sizeof *j);
    PyObject *record = j->attrs[A_RECORD] = PyObject_GetAttr(update, ATTRS[A_RECORD]);
    if (record == NULL || (j->attrs[A_ENDED] = PyObject_GetAttr(update, ATTRS[A_ENDED])) == NULL ||
        (j->attrs[A_FINAL_NOW] = PyObject_GetAttr(update, ATTRS[A_FINAL_NOW])) == NULL)
        return -1;
    /* the record's values in one call (`msgspec.structs.astuple`), in its field order (`F_*`) */
    PyObject *values = PyObject_CallFunctionObjArgs(astuple, record, NULL);
    if (values == NULL)
        return -1;
    if (!PyTuple_Check(values) || PyTuple_Size(values) < N_FIELDS) {
        Py_DECREF(values);
        return 0;
    }
    for (int i = A_JOB_NUMBER; i < N_ATTRS; i++) {
        j->attrs[i] = PyTuple_GetItem(values, ATTR_FIELD[i]);
        Py_INCREF(j->attrs[i]);
    }
    Py_DECREF(values);
    PyObject **a = j->attrs;
    j->ended = a[A_ENDED] == Py_True;
    j->final_now = a[A_FINAL_NOW] == Py_True;
    j->has_maxrss = a[A_MAXRSS] != Py_None;
    int ok = as_ll(a[A_JOB_NUMBER], &j->job_number) && as_ll(a[A_TASK_NUMBER], &j->task_number) &&
             as_ll(a[A_SLOTS], &j->slots) && as_ll(a[A_ARID], &j->arid) &&
             as_ll(a[A_SUBMISSION_TIME], &j->submission_time) && as_ll(a[A_START_TIME], &j->start_time) &&
             as_ll(a[A_END_TIME], &j->end_time) && as_ll(a[A_EXIT_STATUS], &j->exit_status) &&
             as_ll(a[A_RU_MAXRSS], &j->ru_maxrss) && as_ll(a[A_MAXVMEM], &j->maxvmem) &&
             as_ll(a[A_FAILED], &j->failed) && (a[A_DELETED_BY] == Py_None || PyUnicode_Check(a[A_DELETED_BY])) &&
             (!j->has_maxrss || as_ll(a[A_MAXRSS], &j->maxrss)) && as_double(a[A_RU_WALLCLOCK], &j->ru_wallclock) &&
             as_double(a[A_RU_UTIME], &j->ru_utime) && as_double(a[A_RU_STIME], &j->ru_stime) &&
             as_double(a[A_CPU], &j->cpu) && PyTuple_Check(a[A_HOSTS]) && PyUnicode_Check(a[A_HOSTNAME]) &&
             PyUnicode_Check(a[A_OWNER]) && PyUnicode_Check(a[A_QNAME]) && PyUnicode_Check(a[A_ACCOUNT]) &&
             PyUnicode_Check(a[A_JOB_NAME]) && (j->ended == (a[A_ENDED] != Py_False)) &&
             (j->final_now == (a[A_FINAL_NOW] != Py_False));
    if (!ok)
        return 0;
    j->deleted = a[A_DELETED_BY] != Py_None && PyUnicode_GetLength(a[A_DELETED_BY]) > 0;
    /* every time a timestamp is made of must be one (else the pure path raises what it raises) */
    long long times[] = {j->submission_time, j->start_time, j->end_time};
    for (size_t i = 0; i < 3; i++)
        if (times[i] < 0 || times[i] > LAST_TIMESTAMP)
            return 0;
    return 1;
}

/* `state.job_state` (its rows in order) as one of STATE_WORDS; -1 for the row it leaves to Python (killed by
 * a signal: the runtime limit decides) */
static int state_of(const job *j) {
    if (j->failed == 24 || j->failed == 25)
        return S_REQUEUED;
    if (j->failed == 37)
        return S_TIMEOUT;
    if (j->deleted)
        return S_CANCELLED;
    if (j->failed == 22)
        return S_NODE_FAIL;
    if (j->exit_status > 128 || j->failed == 17)
        return -1;
    if (j->failed != 0 || j->exit_status != 0)
        return S_FAILED;
    return S_COMPLETED;
}

/* `mapping._nodes` of one host that needs no compressing (its own node range), else NULL and no exception */
static PyObject *plain_nodes(PyObject *hosts) {
    if (PyTuple_Size(hosts) != 1)
        return NULL;
    PyObject *host = PyTuple_GetItem(hosts, 0);
    Py_ssize_t n;
    const char *s = PyUnicode_Check(host) ? PyUnicode_AsUTF8AndSize(host, &n) : NULL;
    if (s == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (n == 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '.' || c == '_' || c == '-'))
            return NULL;
    }
    PyObject *nodes = PyList_New(1);
    if (nodes != NULL) {
        Py_INCREF(host);
        PyList_SetItem(nodes, 0, host);
    }
    return nodes;
}

/* The helpers the mapping leaves to Python (`mapping._Helpers`), as a tuple in this order. */
enum {
    H_SLURM_JOB, H_SACCT_DATA, H_RUNTIME, H_JOB_STATE, H_NODES, H_ARRAY_TASK, H_CC_JOB_STATE, H_TERMINAL, H_ASTUPLE,
    H_HOSTS, /* None for the as-is host-name form, else job_hosts in the site's form */
    N_HELPERS
};

static PyObject *call1(PyObject *fn, PyObject *arg) { return PyObject_CallFunctionObjArgs(fn, arg, NULL); }

/* `mapping._nodes(hosts)`: the usual one plain host here, any other by the helper */
static PyObject *nodes_of(PyObject *const *helpers, PyObject *hosts) {
    PyObject *nodes = plain_nodes(hosts);
    return nodes != NULL ? nodes : call1(helpers[H_NODES], hosts);
}

/* kwargs[KWS[name]] = value (borrowed); -1 on error */
static int set_item(PyObject *kwargs, int name, PyObject *value) { return PyDict_SetItem(kwargs, KWS[name], value); }

/* kwargs[KWS[name]] = value (a new reference, stolen); -1 on error */
static int set_new(PyObject *kwargs, int name, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItem(kwargs, KWS[name], value);
    Py_DECREF(value);
    return rc;
}

static int set_int(PyObject *kwargs, int name, long long v) {
    return set_new(kwargs, name, PyLong_FromLongLong(v));
}

/* `mapping.slurm_job` of the update read into `j`, given its hosts, state (None unless ended), limit
 * (None or an int), array task; a new reference or NULL. */
static PyObject *slurm_job(const job *j, PyObject *const *helpers, PyObject *hosts, PyObject *state,
                           PyObject *limit, long long task, long long now, PyObject *sacct_kwargs,
                           PyObject *kwargs) {
    PyObject *const *a = j->attrs;
    long long slots = j->slots > 0 ? j->slots : 0;
    Py_ssize_t nhosts = PyTuple_Size(hosts);
    char tres[64] = ""; /* cpu=<slots>,node=<hosts> */
    if (slots && nhosts) {
        char num[24], *end = num + sizeof num, *p = decimal(slots, end);
        size_t n = 0;
        memcpy(tres, "cpu=", 4);
        n = 4;
        memcpy(tres + n, p, (size_t)(end - p));
        n += (size_t)(end - p);
        memcpy(tres + n, ",node=", 6);
        n += 6;
        p = decimal((long long)nhosts, end);
        memcpy(tres + n, p, (size_t)(end - p));
        n += (size_t)(end - p);
        tres[n] = '\0';
    }
    long long elapsed = seconds_of(j->ru_wallclock), user = seconds_of(j->ru_utime),
              sys = seconds_of(j->ru_stime), ave = seconds_of(j->cpu);
    long long max_rss = j->has_maxrss ? kib_of(j->maxrss) : (j->ru_maxrss > 0 ? j->ru_maxrss : 0);
    long long max_vm = kib_of(j->maxvmem);
    PyObject *sacct = NULL, *empty = NULL, *out = NULL, *tres_text = NULL;
    if ((empty = PyTuple_New(0)) == NULL || (tres_text = PyUnicode_FromString(tres)) == NULL)
        goto done;
    /* the same keys every time: the dicts are reused, their values replaced */
    if (elapsed || user || sys || ave || max_rss || max_vm || slots || tres[0]) {
        PyObject *kw = sacct_kwargs;
        if (set_int(kw, KW_ELAPSED_RAW, elapsed) < 0 || set_int(kw, KW_USER_CPU, user) < 0 ||
            set_int(kw, KW_SYSTEM_CPU, sys) < 0 || set_int(kw, KW_AVE_CPU, ave) < 0 ||
            set_int(kw, KW_MAX_RSS, max_rss) < 0 || set_int(kw, KW_MAX_VM_SIZE, max_vm) < 0 ||
            set_int(kw, KW_REQ_CPUS, slots) < 0 || set_item(kw, KW_ALLOC_TRES, tres_text) < 0)
            goto done;
        if ((sacct = PyObject_Call(helpers[H_SACCT_DATA], empty, kw)) == NULL)
            goto done;
    } else {
        sacct = Py_None;
        Py_INCREF(sacct);
    }
    long long submit = j->submission_time ? j->submission_time
                       : j->start_time    ? j->start_time
                       : j->end_time      ? j->end_time
                                          : now;
    if (submit < 0 || submit > LAST_TIMESTAMP) {
        PyErr_SetString(PyExc_ValueError, "_read: submit time out of range"); /* not reached: checked */
        goto done;
    }
    long long limit_v = 0;
    if (limit != Py_None && !as_ll(limit, &limit_v)) {
        PyErr_SetString(PyExc_TypeError, "_read: runtime limit is not an int");
        goto done;
    }
    if (set_item(kwargs, KW_JOB_ID, a[A_JOB_NUMBER]) < 0 ||
        set_item(kwargs, KW_JOB_NAME, a[A_JOB_NAME]) < 0 ||
        (j->ended ? set_item(kwargs, KW_JOB_STATE, state)
                  : set_new(kwargs, KW_JOB_STATE, PyUnicode_FromString("RUNNING"))) < 0 ||
        set_int(kwargs, KW_ARRAY_JOB_ID, task ? j->job_number : 0) < 0 ||
        set_int(kwargs, KW_ARRAY_TASK_ID, task) < 0 || set_item(kwargs, KW_USER_NAME, a[A_OWNER]) < 0 ||
        set_item(kwargs, KW_ACCOUNT, a[A_ACCOUNT]) < 0 ||
        set_new(kwargs, KW_SUBMIT_TIME, timestamp(submit)) < 0 ||
        set_int(kwargs, KW_TIME_LIMIT, limit != Py_None ? limit_v + 2 : 0) < 0 ||
        set_item(kwargs, KW_PARTITION, a[A_QNAME]) < 0 ||
        set_new(kwargs, KW_RESERVATION,
                j->arid ? PyUnicode_FromFormat("%lld", j->arid) : PyUnicode_FromStringAndSize("", 0)) < 0 ||
        set_new(kwargs, KW_NODES, nodes_of(helpers, hosts)) < 0 ||
        set_item(kwargs, KW_ALLOCATED_RESOURCES, tres_text) < 0 ||
        set_int(kwargs, KW_REQUESTED_CPUS, slots) < 0 ||
        set_new(kwargs, KW_START_TIME,
                j->start_time ? timestamp(j->start_time) : PyUnicode_FromStringAndSize("", 0)) < 0 ||
        set_new(kwargs, KW_END_TIME,
                j->ended && j->end_time ? timestamp(j->end_time) : PyUnicode_FromStringAndSize("", 0)) < 0 ||
        set_int(kwargs, KW_EXIT_CODE,
                j->ended && j->exit_status > 0 && j->exit_status < 4294967295LL ? j->exit_status : 0) < 0 ||
        set_item(kwargs, KW_SACCT, sacct) < 0)
        goto done;
    out = PyObject_Call(helpers[H_SLURM_JOB], empty, kwargs);
done:
    Py_XDECREF(empty);
    Py_XDECREF(tres_text);
    Py_XDECREF(sacct);
    return out;
}

/* The event lines of the update (`mapping.job_events` + `job_event_text`) into `b`; the number of events,
 * 0 for none, -1 on error, -2 when a string is not plain (the pure path writes the job). */
static int events(buffer *b, const job *j, PyObject *const *helpers, PyObject *cluster, PyObject *heads,
                  PyObject *hosts, PyObject *state, PyObject *limit, long long task, int start_jobs) {
    PyObject *const *a = j->attrs;
    if (!j->final_now || !j->ended || j->start_time <= 0)
        return 0;
    int terminal = PySet_Contains(helpers[H_TERMINAL], state);
    if (terminal <= 0)
        return terminal;
    const char *cl, *cc, *start_head, *stop_head;
    Py_ssize_t ncl, ncc, nstart_head, nstop_head;
    if (!plain(cluster, &cl, &ncl))
        return -2;
    if (!PyUnicode_Check(PyTuple_GetItem(heads, 0)) || !PyUnicode_Check(PyTuple_GetItem(heads, 1)))
        return -2;
    if ((start_head = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(heads, 0), &nstart_head)) == NULL ||
        (stop_head = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(heads, 1), &nstop_head)) == NULL)
        return -1;
    PyObject *cc_state = NULL;
    for (int k = 0; k < N_STATES; k++)
        if (state == STATE_WORDS[k] && CC_NAMES[k] != NULL)
            cc_state = PyUnicode_FromString(CC_NAMES[k]);
    if (cc_state == NULL && !PyErr_Occurred())
        cc_state = call1(helpers[H_CC_JOB_STATE], state);
    if (cc_state == NULL)
        return -1;
    int ok = plain(cc_state, &cc, &ncc);
    int count = 0;
    long long stop = j->end_time > j->start_time ? j->end_time : j->start_time;
    Py_ssize_t nhosts = PyTuple_Size(hosts), mark = b->n;
    if (!ok)
        goto impure;
    if (start_jobs && PyUnicode_GetLength(a[A_OWNER]) > 0 && nhosts > 0) {
        const char *user, *part, *project, *name, *host;
        Py_ssize_t nuser, npart, nproject, nname, nhost;
        if (!plain(a[A_OWNER], &user, &nuser) || !plain(a[A_QNAME], &part, &npart) ||
            !plain(a[A_ACCOUNT], &project, &nproject) || !plain(a[A_JOB_NAME], &name, &nname))
            goto impure;
        long long limit_v = 0, slots = j->slots > 0 ? j->slots : 0;
        if (limit != Py_None && !as_ll(limit, &limit_v))
            goto impure;
        if (put(b, start_head, nstart_head) < 0 || puts_(b, "{\\\"jobId\\\":") < 0 || put_int(b, j->job_number) < 0 ||
            puts_(b, ",\\\"cluster\\\":") < 0 || put_json_string(b, cl, ncl) < 0 || puts_(b, ",\\\"user\\\":") < 0 ||
            put_json_string(b, user, nuser) < 0 || puts_(b, ",\\\"resources\\\":[") < 0)
            goto error;
        for (Py_ssize_t i = 0; i < nhosts; i++) {
            if (!plain(PyTuple_GetItem(hosts, i), &host, &nhost))
                goto impure;
            if (puts_(b, i ? ",{\\\"hostname\\\":" : "{\\\"hostname\\\":") < 0 || put_json_string(b, host, nhost) < 0 ||
                puts_(b, "}") < 0)
                goto error;
        }
        if (puts_(b, "],\\\"numNodes\\\":") < 0 || put_int(b, nhosts) < 0 || puts_(b, ",\\\"startTime\\\":") < 0 ||
            put_int(b, j->start_time) < 0)
            goto error;
        if (npart && (puts_(b, ",\\\"partition\\\":") < 0 || put_json_string(b, part, npart) < 0))
            goto error;
        if (nproject && (puts_(b, ",\\\"project\\\":") < 0 || put_json_string(b, project, nproject) < 0))
            goto error;
        if (slots && (puts_(b, ",\\\"numHwthreads\\\":") < 0 || put_int(b, slots) < 0))
            goto error;
        if (limit_v && (puts_(b, ",\\\"walltime\\\":") < 0 || put_int(b, limit_v) < 0))
            goto error;
        if (task && (puts_(b, ",\\\"arrayJobId\\\":") < 0 || put_int(b, j->job_number) < 0))
            goto error;
        if (j->submission_time && (puts_(b, ",\\\"submitTime\\\":") < 0 || put_int(b, j->submission_time) < 0))
            goto error;
        if (nname && (puts_(b, ",\\\"metaData\\\":{\\\"jobName\\\":") < 0 || put_json_string(b, name, nname) < 0 ||
                      puts_(b, "}") < 0))
            goto error;
        if (puts_(b, "}\" ") < 0 || put_int(b, j->start_time) < 0 || puts_(b, "\n") < 0)
            goto error;
        count++;
    }
    if (put(b, stop_head, nstop_head) < 0 || puts_(b, "{\\\"jobId\\\":") < 0 || put_int(b, j->job_number) < 0 ||
        puts_(b, ",\\\"stopTime\\\":") < 0 || put_int(b, stop) < 0)
        goto error;
    if (ncl && (puts_(b, ",\\\"cluster\\\":") < 0 || put_json_string(b, cl, ncl) < 0))
        goto error;
    if (puts_(b, ",\\\"startTime\\\":") < 0 || put_int(b, j->start_time) < 0)
        goto error;
    if (ncc && (puts_(b, ",\\\"jobState\\\":") < 0 || put_json_string(b, cc, ncc) < 0))
        goto error;
    if (puts_(b, "}\" ") < 0 || put_int(b, stop) < 0 || puts_(b, "\n") < 0)
        goto error;
    Py_DECREF(cc_state);
    return count + 1;
impure:
    b->n = mark;
    Py_DECREF(cc_state);
    return -2;
error:
    Py_DECREF(cc_state);
    return -1;
}

/* map_jobs(helpers, pure, updates, cluster, heads, now, start_jobs) -> (jobs, text, events, failures):
 * `mapping.map_jobs_pure` for the updates of one chunk. Each update whose values are all of the usual type,
 * size and text (printable ASCII without quotes or backslashes where the events carry them) is mapped
 * here; every other one by `pure(update)` -> (job, text, events), which may raise ValueError: then the
 * update's index and message are in `failures` (what the pure path raised for it) and it has no output. */
static PyObject *map_jobs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != N_HELPERS || !PyList_Check(args[2]) ||
        !PyTuple_Check(args[4]) || PyTuple_Size(args[4]) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "map_jobs(helpers: tuple, pure, updates: list, cluster: str, heads: (str, str), now: int, "
                        "start_jobs: bool)");
        return NULL;
    }
    PyObject *helpers_t = args[0], *pure_fn = args[1], *updates = args[2], *cluster = args[3], *heads = args[4];
    long long now = PyLong_AsLongLong(args[5]);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    int start_jobs = PyObject_IsTrue(args[6]);
    if (start_jobs < 0)
        return NULL;
    PyObject *helpers[N_HELPERS]; /* a tuple of N_HELPERS: checked above */
    for (int i = 0; i < N_HELPERS; i++)
        helpers[i] = PyTuple_GetItem(helpers_t, i);
    buffer b = {NULL, 0, 0};
    long long count = 0;
    PyObject *jobs = PyList_New(0), *failures = PyList_New(0), *out = NULL;
    PyObject *sacct_kwargs = PyDict_New(), *job_kwargs = PyDict_New();
    PyObject *last_category = NULL, *last_limit = NULL;
    if (jobs == NULL || failures == NULL || sacct_kwargs == NULL || job_kwargs == NULL)
        goto done;
    Py_ssize_t n = PyList_Size(updates);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *update = PyList_GetItem(updates, i);
        job j;
        PyObject *hosts = NULL, *state = NULL, *limit = NULL, *sj = NULL;
        int got = read_job(update, &j, helpers[H_ASTUPLE]);
        long long task = 0;
        if (got < 0)
            goto job_error;
        if (got == 0 || now < 0 || now > LAST_TIMESTAMP) /* a poll time no timestamp holds: as the pure path says */
            goto job_pure;
        PyObject **a = j.attrs;
        /* `mapping.job_hosts`: the as-is form here, any other by its helper */
        if (helpers[H_HOSTS] != Py_None) {
            if ((hosts = call1(helpers[H_HOSTS], a[A_RECORD])) == NULL)
                goto job_error;
            if (!PyTuple_Check(hosts)) {
                PyErr_SetString(PyExc_TypeError, "map_jobs: the hosts helper must give a tuple");
                goto job_error;
            }
        } else if (PyTuple_Size(a[A_HOSTS]) > 0) {
            hosts = a[A_HOSTS];
            Py_INCREF(hosts);
        } else {
            hosts = PyUnicode_GetLength(a[A_HOSTNAME]) > 0 ? PyTuple_Pack(1, a[A_HOSTNAME]) : PyTuple_New(0);
            if (hosts == NULL)
                goto job_error;
        }
        if (j.ended) {
            int k = state_of(&j);
            if (k >= 0) {
                state = STATE_WORDS[k];
                Py_INCREF(state);
            } else if ((state = call1(helpers[H_JOB_STATE], a[A_RECORD])) == NULL) {
                goto job_error;
            }
        } else {
            state = Py_None;
            Py_INCREF(state);
        }
        /* `_runtime(category)`: the same category object as the job before (the reader shares equal strings
         * of consecutive records) has the same limit */
        if (a[A_CATEGORY] == last_category && last_limit != NULL) {
            limit = last_limit;
            Py_INCREF(limit);
        } else {
            if ((limit = call1(helpers[H_RUNTIME], a[A_CATEGORY])) == NULL)
                goto job_error;
            Py_XDECREF(last_category);
            Py_XDECREF(last_limit);
            last_category = a[A_CATEGORY];
            last_limit = limit;
            Py_INCREF(last_category);
            Py_INCREF(last_limit);
        }
        {
            long long limit_v = 0; /* a limit past what C adds 2 to safely: the pure path */
            if (limit != Py_None && (!as_ll(limit, &limit_v) || limit_v > (1LL << 62)))
                goto job_pure;
        }
        /* `mapping.array_task`; its one question about the command line is left to it */
        if (j.task_number > 1) {
            task = j.task_number;
        } else if (j.task_number == 1) {
            PyObject *t = call1(helpers[H_ARRAY_TASK], a[A_RECORD]);
            if (t == NULL)
                goto job_error;
            int ok = as_ll(t, &task);
            Py_DECREF(t);
            if (!ok)
                goto job_pure;
        }
        if ((sj = slurm_job(&j, helpers, hosts, state, limit, task, now, sacct_kwargs, job_kwargs)) == NULL)
            goto job_error;
        int made = events(&b, &j, helpers, cluster, heads, hosts, state, limit, task, start_jobs);
        if (made == -1)
            goto job_error;
        if (made == -2)
            goto job_pure;
        if (PyList_Append(jobs, sj) < 0)
            goto job_error;
        count += made;
        goto job_done;
    job_pure:
        {
            PyObject *r = call1(pure_fn, update);
            if (r == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError))
                    goto job_error;
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                PyErr_NormalizeException(&type, &value, &tb);
                PyObject *entry = Py_BuildValue("(nO)", i, value ? value : Py_None);
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
                if (entry == NULL || PyList_Append(failures, entry) < 0) {
                    Py_XDECREF(entry);
                    goto job_error;
                }
                Py_DECREF(entry);
                goto job_done;
            }
            PyObject *rj = NULL, *rt = NULL, *rn = NULL;
            const char *text;
            Py_ssize_t ntext;
            long long rc = 0;
            int ok = PyTuple_Check(r) && PyTuple_Size(r) == 3 && (rj = PyTuple_GetItem(r, 0)) != NULL &&
                     (rt = PyTuple_GetItem(r, 1)) != NULL && (rn = PyTuple_GetItem(r, 2)) != NULL &&
                     PyUnicode_Check(rt) && as_ll(rn, &rc);
            if (!ok) {
                Py_DECREF(r);
                PyErr_SetString(PyExc_TypeError, "map_jobs: pure(update) must give (job, str, int)");
                goto job_error;
            }
            if ((text = PyUnicode_AsUTF8AndSize(rt, &ntext)) == NULL || put(&b, text, ntext) < 0 ||
                PyList_Append(jobs, rj) < 0) {
                Py_DECREF(r);
                goto job_error;
            }
            count += rc;
            Py_DECREF(r);
        }
    job_done:
        job_clear(&j);
        Py_XDECREF(hosts);
        Py_XDECREF(state);
        Py_XDECREF(limit);
        Py_XDECREF(sj);
        continue;
    job_error:
        job_clear(&j);
        Py_XDECREF(hosts);
        Py_XDECREF(state);
        Py_XDECREF(limit);
        Py_XDECREF(sj);
        goto done;
    }
    {
        PyObject *text = PyUnicode_DecodeUTF8(b.p ? b.p : "", b.n, NULL);
        if (text != NULL)
            out = Py_BuildValue("(ONLO)", jobs, text, count, failures);
    }
done:
    PyMem_Free(b.p);
    Py_XDECREF(jobs);
    Py_XDECREF(failures);
    Py_XDECREF(sacct_kwargs);
    Py_XDECREF(job_kwargs);
    Py_XDECREF(last_category);
    Py_XDECREF(last_limit);
    return out;
}


/* --- merging: the records of a chunk -> one update per job (`updates.JobMerger.add`) ---------------------- */

static PyObject *NAME_OPEN, *NAME_UPDATE, *NAME_POP, *NAME_POPITEM, *NAME_MAX_JOBS, *NAME_PE_TASKID,
    *NAME_GRANTED_PE;

/* `mapping._is_final(record)` and whether the job stays open (`_update`'s condition) for a record of the usual
 * types: 1 when read into *final / *keep, 0 when the Python `_update` must decide. */
static int final_and_keep(PyObject *record, int *final, int *keep) {
    PyObject *pe = PyObject_GetAttr(record, NAME_PE_TASKID), *exit_status = NULL, *granted = NULL,
             *failed = NULL;
    int ok = 0;
    long long e, f;
    if (pe == NULL || (exit_status = PyObject_GetAttr(record, ATTRS[A_EXIT_STATUS])) == NULL ||
        (granted = PyObject_GetAttr(record, NAME_GRANTED_PE)) == NULL ||
        (failed = PyObject_GetAttr(record, ATTRS[A_FAILED])) == NULL) {
        PyErr_Clear();
        goto done;
    }
    if (!as_ll(exit_status, &e) || !as_ll(failed, &f))
        goto done;
    *final = pe == Py_None && e != -1 && e != 4294967295LL;
    /* job_state(merged) == "REQUEUED" exactly when failed is 24 or 25 (its first row) */
    *keep = !*final || granted != Py_None || f == 24 || f == 25;
    ok = 1;
done:
    Py_XDECREF(pe);
    Py_XDECREF(exit_status);
    Py_XDECREF(granted);
    Py_XDECREF(failed);
    return ok;
}

/* merge_add(merger, records, lines, update_type) -> list of updates: `JobMerger.add_pure`. The records are
 * grouped by (job_number, task_number) here; a job with one new record and nothing earlier is updated here,
 * every other by `merger._update(key, first, new, parts)`. */
static PyObject *merge_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "merge_add(merger, records: list, lines: list, update_type)");
        return NULL;
    }
    PyObject *merger = args[0], *records = args[1], *lines = args[2], *update_type = args[3];
    PyObject *groups = PyDict_New(), *firsts = PyDict_New(), *out = PyList_New(0), *opened = NULL,
             *zero = PyLong_FromLong(0), *result = NULL, *pop = NULL, *popitem = NULL;
    Py_ssize_t n = PyList_Size(records), nlines = PyList_Size(lines);
    long long max_jobs = 0;
    if (groups == NULL || firsts == NULL || out == NULL || zero == NULL)
        goto done;
    if ((opened = PyObject_GetAttr(merger, NAME_OPEN)) == NULL || (pop = PyObject_GetAttr(opened, NAME_POP)) == NULL ||
        (popitem = PyObject_GetAttr(opened, NAME_POPITEM)) == NULL)
        goto done;
    {
        PyObject *m = PyObject_GetAttr(merger, NAME_MAX_JOBS);
        if (m == NULL)
            goto done;
        int ok = as_ll(m, &max_jobs);
        Py_DECREF(m);
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "merge_add: max_jobs is not an int");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = PyList_GetItem(records, i);
        PyObject *job = PyObject_GetAttr(record, ATTRS[A_JOB_NUMBER]), *task = NULL, *key = NULL;
        if (job == NULL || (task = PyObject_GetAttr(record, ATTRS[A_TASK_NUMBER])) == NULL ||
            (key = PyTuple_Pack(2, job, task)) == NULL) {
            Py_XDECREF(job);
            Py_XDECREF(task);
            goto done;
        }
        Py_DECREF(job);
        Py_DECREF(task);
        /* a group is its one record, or the list of its records from the second on (no list per job) */
        PyObject *group = PyDict_GetItemWithError(groups, key); /* borrowed */
        int rc;
        if (group != NULL && PyList_CheckExact(group)) {
            rc = PyList_Append(group, record);
        } else if (group != NULL) {
            PyObject *both = PyList_New(2);
            rc = -1;
            if (both != NULL) {
                Py_INCREF(group);
                Py_INCREF(record);
                PyList_SetItem(both, 0, group);
                PyList_SetItem(both, 1, record);
                rc = PyDict_SetItem(groups, key, both);
                Py_DECREF(both);
            }
        } else if (PyErr_Occurred()) {
            rc = -1;
        } else {
            rc = PyDict_SetItem(groups, key, record);
            if (rc == 0)
                rc = PyDict_SetItem(firsts, key, i < nlines ? PyList_GetItem(lines, i) : zero);
        }
        PyObject_GC_UnTrack(key); /* two ints: in no cycle, nothing for the collector to look at */
        Py_DECREF(key);
        if (rc < 0)
            goto done;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *group;
    while (PyDict_Next(groups, &pos, &key, &group)) { /* in insertion order: first appearance */
        PyObject *first = PyDict_GetItem(firsts, key); /* borrowed, there */
        PyObject *parts = PyObject_CallFunctionObjArgs(pop, key, Py_None, NULL);
        if (parts == NULL)
            goto done;
        PyObject *update = NULL, *new = NULL;
        int final = 0, keep = 0, single = !PyList_CheckExact(group);
        if (parts == Py_None && single && final_and_keep(group, &final, &keep)) {
            if (keep) { /* `opened` keeps the job's parts as a list */
                if ((new = PyList_New(1)) == NULL)
                    goto parts_done;
                Py_INCREF(group);
                PyList_SetItem(new, 0, group);
                if (PyObject_SetItem(opened, key, new) < 0)
                    goto parts_done;
                while (PyObject_Size(opened) > max_jobs) {
                    PyObject *item = PyObject_CallFunctionObjArgs(popitem, Py_False, NULL);
                    if (item == NULL)
                        goto parts_done;
                    Py_DECREF(item);
                }
            }
            PyObject *flag = final ? Py_True : Py_False;
            update = PyObject_CallFunctionObjArgs(update_type, group, flag, flag, first, NULL);
        } else {
            if (single) {
                if ((new = PyList_New(1)) == NULL)
                    goto parts_done;
                Py_INCREF(group);
                PyList_SetItem(new, 0, group);
            } else {
                new = group;
                Py_INCREF(new);
            }
            update = PyObject_CallMethodObjArgs(merger, NAME_UPDATE, key, first, new, parts, NULL);
        }
    parts_done:
        Py_XDECREF(new);
        Py_DECREF(parts);
        if (update == NULL || PyList_Append(out, update) < 0) {
            Py_XDECREF(update);
            goto done;
        }
        Py_DECREF(update);
    }
    result = out;
    out = NULL;
done:
    Py_XDECREF(groups);
    Py_XDECREF(firsts);
    Py_XDECREF(out);
    Py_XDECREF(opened);
    Py_XDECREF(pop);
    Py_XDECREF(popitem);
    Py_XDECREF(zero);
    return result;
}


/* --- following: a chunk's bytes -> its lines (`follow.split_lines`) ------------------------------------- */

/* split_lines(line_type, body, number, offset) -> (lines, number, offset): `follow.split_lines_pure`, each
 * line that ends in '\n' as line_type(number, start, end, text) numbered on from `number` (the line before)
 * and placed from byte `offset`; the last line's number and the offset after it. */
static PyObject *split_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "split_lines(line_type, body: bytes, number: int, offset: int)");
        return NULL;
    }
    PyObject *line_type = args[0], *body = args[1];
    long long number = PyLong_AsLongLong(args[2]), offset;
    if (number == -1 && PyErr_Occurred())
        return NULL;
    offset = PyLong_AsLongLong(args[3]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    char *buf;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(body, &buf, &size) < 0)
        return NULL;
    PyObject *lines = PyList_New(0);
    if (lines == NULL)
        return NULL;
    Py_ssize_t start = 0;
    while (start < size) {
        const char *nl = memchr(buf + start, '\n', (size_t)(size - start));
        if (nl == NULL)
            break; /* a last piece without its newline is not a line */
        Py_ssize_t stop = nl - buf;
        number++;
        long long after = offset + (stop - start) + 1;
        PyObject *values = Py_BuildValue("(LLLy#)", number, offset, after, buf + start, stop - start);
        PyObject *line = values == NULL ? NULL : PyObject_Call(line_type, values, NULL);
        Py_XDECREF(values);
        if (line == NULL || PyList_Append(lines, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(lines);
            return NULL;
        }
        Py_DECREF(line);
        offset = after;
        start = stop + 1;
    }
    return Py_BuildValue("(NLL)", lines, number, offset);
}

/* escape_field(payload: bytes) -> bytes: `mapping.escape_field_pure`, the bytes as line protocol writes a
 * string field's value (without its quotes): a backslash before each `\` and `"`, CR and LF as `\r` and `\n`.
 * Every other byte is copied as it is (the payload is UTF-8: no byte of a multi-byte character is ASCII).
 * Why C: the envelope's JSON is most of the OCS producer's output, and it has a quote every few bytes, where
 * each `bytes.replace` pass copies short runs between them; here one pass counts and one writes. */
static PyObject *escape_field(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "escape_field(payload: bytes)");
        return NULL;
    }
    char *buf;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(args[0], &buf, &size) < 0)
        return NULL;
    Py_ssize_t extra = lp_string_escapes(buf, size);
    if (extra == 0) {
        Py_INCREF(args[0]);
        return args[0];
    }
    if (extra > PY_SSIZE_T_MAX - size)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, size + extra);
    if (out == NULL)
        return NULL;
    char *w = PyBytes_AsString(out);
    if (w == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    lp_string_escape(w, buf, size, extra);
    return out;
}

static PyMethodDef methods[] = {
    {"read_usual", (PyCFunction)(void (*)(void))read_usual, METH_FASTCALL,
     "read_usual(record_type, fallback, line: bytes) -> record_type | ...: the record of a JSONL accounting "
     "line of the usual shape, else fallback(line) (the pure path)."},
    {"read_records", (PyCFunction)(void (*)(void))read_records, METH_FASTCALL,
     "read_records(record_type, lines: list[RawLine]) -> (records, line numbers) | None: every line read as "
     "read_usual reads it, or None when one of them is not of the usual shape."},
    {"split_lines", (PyCFunction)(void (*)(void))split_lines, METH_FASTCALL,
     "split_lines(line_type, body: bytes, number: int, offset: int) -> (lines, number, offset): the lines of a "
     "chunk (follow.py)."},
    {"merge_add", (PyCFunction)(void (*)(void))merge_add, METH_FASTCALL,
     "merge_add(merger, records: list, lines: list, update_type) -> list: JobMerger.add (mapping.py)."},
    {"escape_field", (PyCFunction)(void (*)(void))escape_field, METH_FASTCALL,
     "escape_field(payload: bytes) -> bytes: the payload escaped as a line protocol string field's value "
     "(mapping.escape_field_pure)."},
    {"map_jobs", (PyCFunction)(void (*)(void))map_jobs, METH_FASTCALL,
     "map_jobs(helpers, pure, updates, cluster, heads, now, start_jobs) -> (jobs, event text, events, "
     "failures): the Sonar records and cc-backend event lines of a chunk's job updates (mapping.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_read", "The compiled OCS accounting reader (see accounting.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__read(void) {
    init_keys();
    for (int i = 0; i < N_ATTRS; i++)
        if (ATTRS[i] == NULL && (ATTRS[i] = PyUnicode_InternFromString(ATTR_NAMES[i])) == NULL)
            return NULL;
    for (int i = 0; i < N_STATES; i++)
        if (STATE_WORDS[i] == NULL && (STATE_WORDS[i] = PyUnicode_InternFromString(STATE_NAMES[i])) == NULL)
            return NULL;
    if ((NAME_OPEN = PyUnicode_InternFromString("_open")) == NULL ||
        (NAME_UPDATE = PyUnicode_InternFromString("_update")) == NULL ||
        (NAME_POP = PyUnicode_InternFromString("pop")) == NULL ||
        (NAME_POPITEM = PyUnicode_InternFromString("popitem")) == NULL ||
        (NAME_MAX_JOBS = PyUnicode_InternFromString("max_jobs")) == NULL ||
        (NAME_PE_TASKID = PyUnicode_InternFromString("pe_taskid")) == NULL ||
        (NAME_GRANTED_PE = PyUnicode_InternFromString("granted_pe")) == NULL)
        return NULL;
    if ((NAME_TEXT = PyUnicode_InternFromString("text")) == NULL ||
        (NAME_NUMBER = PyUnicode_InternFromString("number")) == NULL)
        return NULL;
    for (int i = 0; i < N_KW; i++)
        if (KWS[i] == NULL && (KWS[i] = PyUnicode_InternFromString(KW_NAMES[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
