/* hpcbus.schemas.translate._write: the compiled writer of a Sonar sample's job and process lines
 * (`schemas.translate.payloads`, `_TextWriter.jobs`).
 *
 * Why C: a busy node's sample has ~20 jobs, ~300 processes and ~2,700 lines from them; the pure path's work
 * per job and process (reading the fields, choosing the lines, series keys, tag text, `%` templates, the
 * skeleton's copies) is interpreter work, most of the Sonar -> line protocol cost (issue 24).
 *
 * Contract (the pure twin is `sample_to_lp.each_job(jobs, step)`, `step` being `_JobWalk.step`):
 * `jobs(jobs, cluster, host, seen_jobs, seen_procs, proc_fields, gpu_fields, layout, chunks, stamp, replace,
 * step)` returns (new_jobs, count): count equal to `each_job`'s, new_jobs ENCODING (`msgspec.json.encode`)
 * as `each_job`'s do (the skeleton only travels as JSON: a job written here holds its skeleton processes as
 * their JSON, `msgspec.Raw`, see below); appends to the list `chunks` the UTF-8 text the pure path appends,
 * byte for byte (as bytes objects; where they are cut may differ), and adds the same series keys to
 * `seen_jobs` and `seen_procs`. For each job in order it either writes the whole job itself or, when it meets
 * anything it is not sure of, forgets what it wrote of that job and calls `step(job)` (which writes its own
 * lines to `chunks`); before calling `step` it appends what it wrote so far, so the order is kept.
 *
 * A job is written here only when all of this holds:
 *   - `cluster` and `host` are "plain": 1..1024 printable ASCII characters without ',', '=', ' ' and '\\'
 *     (then `tag_set` writes them as they are); `job` and `epoch` are ints in 0..2^63-1, `user` a str,
 *     empty or plain (then `tag_value(user)` is `user`); `processes` a list; its key (`job_key`) is not in
 *     `seen_jobs`, every `rolledup` an int;
 *   - each process: exactly `SampleProcess` (`layout`: (the class, its fields as (name, default, whether
 *     the default is an empty list) in order, `msgspec.structs.astuple`, `msgspec.Raw`, `msgspec.json.encode`);
 *     its fields are read in one `astuple` call), `pid`, `ppid` ints in 1..2^63-1, `cmd` plain, its key
 *     `<job key>/<pid>` is not in `seen_procs` nor used before in the job; every field of `proc_fields`
 *     ((attribute, measurement, float-typed, zero written, zero) in line order: `sample_fields.PROCESS_FIELDS`)
 *     holds exactly its declared type (int or float), and each value that becomes a line (non-zero, or its
 *     zero is written) is plain: an int in int64, a finite float of at least the smallest normal magnitude;
 *     each other field holds its default object, or an int (not equal to an int default), a bool, a float
 *     zero, a str of printable ASCII without '"' and '\\' (JSON text msgspec writes as it is);
 *   - `gpus` a list of at most MAX_GPUS, each with a plain `uuid` that `common.device_key` keeps as it is (a
 *     device id of at most 56 bytes: `_names.h`) and no earlier GPU of the process has, its
 *     fields (`gpu_fields`: (attribute, measurement, KiB -> MiB, zero written, zero),
 *     `sample_fields.PROCESS_GPU_FIELDS`) an int within +-2^53 (KiB -> MiB: value / 1024) or a float, plain
 *     where it becomes a line.
 * Then its lines are those of `_JobWalk.step`: `{measurement}{tags} value={v}[i]{stamp}`, tags in sorted key
 * order as `tag_set` writes them (the job's: cluster, epoch, hostname, job, stype=job, stype-id, type=node,
 * type-id=job, user; a process adds cmd, pid, ppid and has stype=process, type-id=process; a process' GPU
 * has no ppid, type=accelerator, type-id=<uuid>), an int as `str` writes it plus 'i', a float as `repr`
 * writes it (`short_float`, else `PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0)`: CPython's own
 * `float.__repr__`). The skeleton's process is `replace(p, **{attribute: zero for each field written})` (a
 * process with GPUs also gets `gpus`, each GPU replaced the same way); it is written here as the JSON
 * `msgspec.json.encode` writes for it (`omit_defaults`: a field holding its default object, or an empty list
 * for a list field, is left out; the GPUs by `encode` itself), and a job with a process that changed is
 * `replace(job, processes=Raw(<the JSON list of its skeleton processes>))`, the job itself otherwise. Why:
 * a `replace` per process (a struct built from keyword arguments) cost more than writing its lines.
 *
 * Also here: `lines`, `numbered` (the lines of one object, of the hwthreads), `values` (`sample_fields.field_values` of the node
 * and its GPUs), `string_field` (the skeleton event's quoted JSON), `join` (`b"".join` of a message's pieces,
 * its pages faulted in at once: `populate`).
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "_buffer.h"
#include "_names.h"

#define TAG_VALUE_MAX 1024
#define MAX_FIELDS 32
#define MAX_GPUS 16
#define F53 9007199254740992LL /* 2^53 */
#define TAGS_MAX (8 * TAG_VALUE_MAX + 256)
#define FLUSH_AT 32768
#define POPULATE_AT 65536 /* `populate` blocks of at least this size */

/* ---- text ---- */

typedef struct {
    const char *s;
    Py_ssize_t n;
} text;

/* the caller reserved the room */
static void put(buffer *b, const char *s, Py_ssize_t n) {
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
}

/* append what the buffer holds to `chunks` as one bytes object, and empty it */
static int flush(buffer *b, PyObject *chunks) {
    if (b->n == 0)
        return 0;
    PyObject *chunk = PyBytes_FromStringAndSize(b->p, b->n);
    if (chunk == NULL)
        return -1;
    int rc = PyList_Append(chunks, chunk);
    Py_DECREF(chunk);
    b->n = 0;
    return rc;
}

/* "plain": 1..1024 printable ASCII characters without ',', '=', ' ', '\\': `plain_tag_text` holds, and
 * `tag_value` leaves it as it is (no control character, no backslash, not too long) */
static int plain(const char *s, Py_ssize_t n) {
    if (n == 0 || n > TAG_VALUE_MAX)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || c == ',' || c == '=' || c == '\\')
            return 0;
    }
    return 1;
}

/* a str's UTF-8 text when it is an exact str and plain; 1, 0 (not plain), -1 (error) */
static int plain_str(PyObject *o, text *t) {
    if (!PyUnicode_CheckExact(o))
        return 0;
    t->s = PyUnicode_AsUTF8AndSize(o, &t->n);
    if (t->s == NULL) { /* no UTF-8 (lone surrogates): the pure path's */
        PyErr_Clear();
        return 0;
    }
    return plain(t->s, t->n);
}

/* `repr(d)` for a finite d with 1e-3 <= |d| < 1e15 that has at most 6 decimals: its length in out[32],
 * or 0 (then `PyOS_double_to_string`, CPython's own `float.__repr__`, writes it).
 * Why it equals repr: repr writes the shortest digit string that reads back as d, in fixed notation for
 * 1e-4 <= |d| < 1e16. With k the fewest decimals (0..6) for which m = round(|d| * 10^k) gives m / 10^k == |d|
 * (an IEEE division, correctly rounded: the double nearest m/10^k, which is what reading the text m/10^k
 * gives), the text of m with k decimals reads back as d; no text with fewer decimals does (k is the
 * fewest, and a text with no decimals is an integer, exact below 2^53), and no other text with k decimals
 * does: m < 2^52 makes 10^-k larger than the spacing of doubles at d. */
static Py_ssize_t short_float(double d, char *out) {
    static const double tens[] = {1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6};
    double a = fabs(d);
    if (!(a >= 1e-3 && a < 1e15))
        return 0;
    for (int k = 0; k <= 6; k++) {
        double scaled = a * tens[k];
        if (scaled >= 4503599627370496.0) /* 2^52 */
            return 0;
        double m = floor(scaled + 0.5);
        if (m / tens[k] != a)
            continue;
        unsigned long long u = (unsigned long long)m;
        char digits[24];
        char *end = digits + sizeof digits, *p = end;
        int written = 0;
        do {
            *--p = (char)('0' + u % 10);
            u /= 10;
            written++;
        } while (u || written <= k); /* at least one digit before the decimals */
        Py_ssize_t n = 0;
        if (d < 0)
            out[n++] = '-';
        Py_ssize_t whole = (end - p) - k;
        memcpy(out + n, p, (size_t)whole);
        n += whole;
        out[n++] = '.';
        if (k == 0) {
            out[n++] = '0';
        } else {
            memcpy(out + n, p + whole, (size_t)k);
            n += k;
        }
        return n;
    }
    return 0;
}

/* ---- values ---- */

typedef struct {
    PyObject *attr; /* borrowed from the fields tuple */
    const char *name;
    Py_ssize_t name_len;
    int flag; /* process fields: float-typed; GPU fields: KiB -> MiB */
    int keep_zero;
    PyObject *zero; /* borrowed */
} field;

typedef struct {
    int kind; /* 0: no line, 1: int, 2: float */
    long long i;
    double d;
} value;

/* a plain float line value: finite, at least the smallest normal magnitude */
static int plain_float(double d) { return isfinite(d) && fabs(d) >= DBL_MIN; }

/* the value text of a line (after `value=`) in num[32], or in *repr (to free) */
static Py_ssize_t value_text(const value *v, char *num, const char **s, char **repr) {
    *repr = NULL;
    if (v->kind == 1) {
        num[31] = 'i';
        *s = decimal(v->i, num + 31);
        return num + 32 - *s;
    }
    Py_ssize_t n = short_float(v->d, num);
    if (n > 0) {
        *s = num;
        return n;
    }
    *repr = PyOS_double_to_string(v->d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (*repr == NULL)
        return -1;
    *s = *repr;
    return (Py_ssize_t)strlen(*repr);
}

/* ---- one call: a sample's jobs ---- */

typedef struct {
    text name;
    PyObject *dflt; /* borrowed; NULL for a field of `default_factory=list` */
    int int_default; /* the default is an exact int (any int equal to it: `int_value`) */
    long long int_value;
} member;

typedef struct {
    PyObject *seen_jobs, *seen_procs, *replace, *chunks;
    PyObject *cls, *astuple, *raw, *encode; /* the process struct's class, ... (`read_layout`) */
    PyObject *s_job, *s_user, *s_epoch, *s_processes, *s_uuid;
    text cluster, host, stamp;
    field f[MAX_FIELDS], g[MAX_FIELDS];
    int nf, ng;
    member lay[MAX_FIELDS]; /* the process struct's fields in order */
    int np, i_pid, i_ppid, i_cmd, i_gpus, i_rolledup;
    int fi[MAX_FIELDS]; /* where each of `f` is in `lay` */
    buffer out, js;     /* the lines; the JSON of a job's skeleton processes */
    int foreign;        /* `seen_procs` may hold a key not written here (given, or `step`'s) */
} sample;

typedef struct {
    text job, epoch, user, key; /* epoch.n, user.n: 0 when the tag is not written */
    char job_s[24], epoch_s[24], key_s[64];
    PyObject *fresh; /* the process keys of this job so far (a list: `write_job` saw that its pids differ) */
} job;

enum { TAGS_JOB, TAGS_PROCESS, TAGS_GPU };

static void cat(char *o, Py_ssize_t *n, const char *s, Py_ssize_t len) {
    memcpy(o + *n, s, (size_t)len);
    *n += len;
}

#define CAT(lit) cat(o, &n, lit, (Py_ssize_t)(sizeof(lit) - 1))
#define CATT(t) cat(o, &n, (t).s, (t).n)

/* the tag set of a job, process or process GPU line, as `tag_set` writes it (see the contract); o[TAGS_MAX] */
static Py_ssize_t tag_text(const sample *s, const job *j, int kind, text cmd, text pid, text ppid, text key,
                           text gpu, char *o) {
    Py_ssize_t n = 0;
    CAT(",cluster=");
    CATT(s->cluster);
    if (kind != TAGS_JOB) {
        CAT(",cmd=");
        CATT(cmd);
    }
    if (j->epoch.n) {
        CAT(",epoch=");
        CATT(j->epoch);
    }
    CAT(",hostname=");
    CATT(s->host);
    CAT(",job=");
    CATT(j->job);
    if (kind != TAGS_JOB) {
        CAT(",pid=");
        CATT(pid);
    }
    if (kind == TAGS_PROCESS) {
        CAT(",ppid=");
        CATT(ppid);
    }
    if (kind == TAGS_JOB)
        CAT(",stype=job,stype-id=");
    else
        CAT(",stype=process,stype-id=");
    CATT(key);
    if (kind == TAGS_JOB) {
        CAT(",type=node,type-id=job");
    } else if (kind == TAGS_PROCESS) {
        CAT(",type=node,type-id=process");
    } else {
        CAT(",type=accelerator,type-id=");
        CATT(gpu);
    }
    if (j->user.n) {
        CAT(",user=");
        CATT(j->user);
    }
    return n;
}

/* one line: name, tags, ` value=`, the value, the stamp */
static int line(sample *s, const char *name, Py_ssize_t name_len, const char *tags, Py_ssize_t tags_len,
                const value *v) {
    char num[32];
    const char *num_s;
    char *repr;
    Py_ssize_t num_len = value_text(v, num, &num_s, &repr);
    if (num_len < 0)
        return -1;
    if (reserve(&s->out, name_len + tags_len + 7 + num_len + s->stamp.n) < 0) {
        PyMem_Free(repr);
        return -1;
    }
    put(&s->out, name, name_len);
    put(&s->out, tags, tags_len);
    put(&s->out, " value=", 7);
    put(&s->out, num_s, num_len);
    put(&s->out, s->stamp.s, s->stamp.n);
    PyMem_Free(repr);
    return 0;
}

/* an exact int in lo..2^63-1: 1 and *v when `o` is one, 0 when not, -1 on error */
static int int_value(PyObject *o, long long lo, long long *v) {
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *v = x;
    return !overflow && x >= lo;
}

/* an int attribute in lo..2^63-1: as `int_value` */
static int int_attr(PyObject *obj, PyObject *name, long long lo, long long *v) {
    PyObject *o = PyObject_GetAttr(obj, name);
    if (o == NULL)
        return -1;
    int ok = int_value(o, lo, v);
    Py_DECREF(o);
    return ok;
}

/* the values of `fields` of `obj` (see the contract): 1 (and the mask of the lines), 0, -1. With `items` (the
 * struct's `astuple`), field k is items[at[k]], else the attribute. */
static int read_values(PyObject *obj, PyObject *items, const int *at, const field *f, int nf, int gpu, value *v,
                       unsigned long *mask) {
    *mask = 0;
    for (int k = 0; k < nf; k++) {
        PyObject *o = items != NULL ? PyTuple_GetItem(items, at[k]) : PyObject_GetAttr(obj, f[k].attr);
        if (o == NULL)
            return -1;
        if (items != NULL)
            Py_INCREF(o);
        int ok = 1;
        v[k].kind = 0;
        int is_float = gpu ? !f[k].flag : f[k].flag;
        if (is_float) {
            if (!PyFloat_CheckExact(o)) {
                ok = 0;
            } else {
                double d = PyFloat_AsDouble(o);
                if (d != 0.0 || f[k].keep_zero) {
                    ok = plain_float(d);
                    v[k].kind = 2;
                    v[k].d = d;
                }
            }
        } else if (!PyLong_CheckExact(o)) {
            ok = 0;
        } else {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(o);
                return -1;
            }
            if (overflow || x != 0 || f[k].keep_zero) {
                if (gpu) { /* KiB -> MiB: x / 1024, exact within 2^53 */
                    ok = !overflow && x >= -F53 && x <= F53;
                    v[k].kind = 2;
                    v[k].d = (double)x / 1024.0;
                    ok = ok && plain_float(v[k].d);
                } else {
                    ok = !overflow;
                    v[k].kind = 1;
                    v[k].i = x;
                }
            }
        }
        Py_DECREF(o);
        if (!ok)
            return 0;
        if (v[k].kind)
            *mask |= 1UL << k;
    }
    return 1;
}

/* `replace(obj, **{attribute: zero for each field in mask})` as a new reference (a process' GPU) */
static PyObject *zeroed(sample *s, PyObject *obj, const field *f, int nf, unsigned long mask) {
    PyObject *zeros = PyDict_New();
    if (zeros == NULL)
        return NULL;
    for (int k = 0; k < nf; k++) {
        if ((mask & (1UL << k)) && PyDict_SetItem(zeros, f[k].attr, f[k].zero) < 0) {
            Py_DECREF(zeros);
            return NULL;
        }
    }
    PyObject *args = PyTuple_Pack(1, obj);
    PyObject *result = args == NULL ? NULL : PyObject_Call(s->replace, args, zeros);
    Py_XDECREF(args);
    Py_DECREF(zeros);
    return result;
}

/* JSON text msgspec writes as it is: printable ASCII without '"' and '\\' */
static int json_plain(const char *t, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
            return 0;
    }
    return 1;
}

/* append `"name":` and the JSON of `o` (field `at` of a process, neither written as a line nor its default
 * object, nor its `gpus`) as `msgspec.json.encode` writes it: 1, 0 when not sure (an int equal to its default
 * yet not it, a float other than a zero, a str to escape, any other type), -1 on error */
static int json_member(sample *s, int at, PyObject *o) {
    char num[32];
    const char *v;
    Py_ssize_t n;
    if (o == Py_True || o == Py_False) {
        v = o == Py_True ? "true" : "false";
        n = o == Py_True ? 4 : 5;
    } else if (PyLong_CheckExact(o)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (overflow)
            return 0;
        if (s->lay[at].int_default && x == s->lay[at].int_value)
            return 0; /* equal to the int default yet not it: msgspec may compare values */
        v = decimal(x, num + sizeof num);
        n = num + sizeof num - v;
    } else if (PyFloat_CheckExact(o)) {
        double d = PyFloat_AsDouble(o);
        if (d != 0.0)
            return 0;
        v = signbit(d) ? "-0.0" : "0.0";
        n = signbit(d) ? 4 : 3;
    } else if (PyUnicode_CheckExact(o)) {
        v = PyUnicode_AsUTF8AndSize(o, &n);
        if (v == NULL) {
            PyErr_Clear();
            return 0;
        }
        if (n == 0 || !json_plain(v, n))
            return 0;
    } else {
        return 0;
    }
    int quoted = PyUnicode_CheckExact(o);
    const text *name = &s->lay[at].name;
    if (reserve(&s->js, name->n + n + 6) < 0)
        return -1;
    put(&s->js, "\"", 1);
    put(&s->js, name->s, name->n);
    put(&s->js, quoted ? "\":\"" : "\":", quoted ? 3 : 2);
    put(&s->js, v, n);
    if (quoted)
        put(&s->js, "\"", 1);
    return 1;
}

typedef struct {
    PyObject *obj; /* borrowed from the gpus list */
    text uuid;
    value v[MAX_FIELDS];
    unsigned long mask;
} gpu;

/* write process `p` (`items`: its `astuple`) of job `j`: 1 (its lines in s->out, its skeleton's JSON appended
 * to s->js, *count its lines, *changed whether the skeleton's process differs from `p`), 0 when the pure path
 * must take its job, -1 on error */
static int write_process(sample *s, job *j, PyObject *items, long *count, int *changed) {
    int result = 0;
    PyObject *gpus, *key = NULL, *pgpus = NULL, *encoded = NULL;
    long long pid, ppid;
    int rc = int_value(PyTuple_GetItem(items, s->i_pid), 1, &pid);
    if (rc <= 0)
        return rc;
    rc = int_value(PyTuple_GetItem(items, s->i_ppid), 1, &ppid);
    if (rc <= 0)
        return rc;
    text cmd_t;
    rc = plain_str(PyTuple_GetItem(items, s->i_cmd), &cmd_t);
    if (rc <= 0)
        return rc;
    value v[MAX_FIELDS];
    unsigned long mask;
    rc = read_values(NULL, items, s->fi, s->f, s->nf, 0, v, &mask);
    if (rc <= 0)
        return rc;

    /* its GPUs */
    gpus = PyTuple_GetItem(items, s->i_gpus);
    if (!PyList_CheckExact(gpus))
        return 0;
    Py_ssize_t ngpus = PyList_Size(gpus);
    if (ngpus > MAX_GPUS)
        return 0;
    gpu g[MAX_GPUS];
    for (Py_ssize_t i = 0; i < ngpus; i++) {
        g[i].obj = PyList_GetItem(gpus, i);
        if (g[i].obj == NULL)
            return -1;
        PyObject *uuid = PyObject_GetAttr(g[i].obj, s->s_uuid);
        if (uuid == NULL)
            return -1;
        rc = plain_str(uuid, &g[i].uuid);
        Py_DECREF(uuid); /* the GPU struct keeps the str (and its UTF-8) alive */
        if (rc <= 0)
            return rc;
        if (!lp_device_key(g[i].uuid.s, g[i].uuid.n)) /* written as it is only when `device_key` keeps it */
            return 0;
        for (Py_ssize_t e = 0; e < i; e++) /* `unique_keys` would number a repeated one */
            if (g[e].uuid.n == g[i].uuid.n && memcmp(g[e].uuid.s, g[i].uuid.s, (size_t)g[i].uuid.n) == 0)
                return 0;
        rc = read_values(g[i].obj, NULL, NULL, s->g, s->ng, 1, g[i].v, &g[i].mask);
        if (rc <= 0)
            return rc;
    }

    /* its series key: the job's key, '/', the pid; new */
    char digits[24], ppid_digits[24];
    text pid_t, ppid_t;
    pid_t.s = decimal(pid, digits + sizeof digits);
    pid_t.n = digits + sizeof digits - pid_t.s;
    ppid_t.s = decimal(ppid, ppid_digits + sizeof ppid_digits);
    ppid_t.n = ppid_digits + sizeof ppid_digits - ppid_t.s;
    char key_s[TAG_VALUE_MAX + 1];
    text key_t = {key_s, j->key.n + 1 + pid_t.n};
    if (key_t.n > TAG_VALUE_MAX)
        return 0;
    memcpy(key_s, j->key.s, (size_t)j->key.n);
    key_s[j->key.n] = '/';
    memcpy(key_s + j->key.n + 1, pid_t.s, (size_t)pid_t.n);
    key = PyUnicode_DecodeASCII(key_s, key_t.n, NULL);
    if (key == NULL)
        return -1;
    /* (only a key `step` gave, or one given before, can be there: this job's own differ, `write_job` saw to
     * it, and a key written here is `<job key>/<pid>` with a job key of no '/' that no other job has) */
    rc = s->foreign ? PySet_Contains(s->seen_procs, key) : 0;
    if (rc != 0) {
        result = rc < 0 ? -1 : 0;
        goto done;
    }

    /* the skeleton's process, as `msgspec.json.encode(replace(p, **zeros))` writes it: each field in order but
     * those written as lines (zeroed: their default) and those holding their default object (what msgspec's
     * `omit_defaults` leaves out), `gpus` (each zeroed likewise) encoded by `encode` */
    if (reserve(&s->js, 2) < 0) {
        result = -1;
        goto done;
    }
    put(&s->js, s->js.n > 1 ? ",{" : "{", s->js.n > 1 ? 2 : 1);
    Py_ssize_t first = s->js.n;
    unsigned long lines_at = 0; /* the layout's fields written as lines */
    for (int k = 0; k < s->nf; k++)
        if (mask & (1UL << k))
            lines_at |= 1UL << s->fi[k];
    for (int at = 0; at < s->np; at++) {
        if (lines_at & (1UL << at))
            continue;
        PyObject *o = PyTuple_GetItem(items, at);
        if (at == s->i_gpus) {
            if (ngpus == 0) /* an empty list: the default */
                continue;
            pgpus = PyList_New(ngpus);
            if (pgpus == NULL) {
                result = -1;
                goto done;
            }
            for (Py_ssize_t i = 0; i < ngpus; i++) {
                PyObject *pg = g[i].obj;
                if (g[i].mask) {
                    pg = zeroed(s, pg, s->g, s->ng, g[i].mask);
                    if (pg == NULL) {
                        result = -1;
                        goto done;
                    }
                } else {
                    Py_INCREF(pg);
                }
                PyList_SetItem(pgpus, i, pg); /* steals the reference */
            }
            encoded = PyObject_CallFunctionObjArgs(s->encode, pgpus, NULL);
            if (encoded == NULL || !PyBytes_Check(encoded)) {
                if (encoded != NULL)
                    PyErr_SetString(PyExc_TypeError, "the skeleton's encoder returned no bytes");
                result = -1;
                goto done;
            }
            Py_ssize_t n = PyBytes_Size(encoded);
            const char *t = PyBytes_AsString(encoded);
            const text *name = &s->lay[at].name;
            if (t == NULL || reserve(&s->js, name->n + n + 4) < 0) {
                result = -1;
                goto done;
            }
            if (s->js.n > first)
                put(&s->js, ",", 1);
            put(&s->js, "\"", 1);
            put(&s->js, name->s, name->n);
            put(&s->js, "\":", 2);
            put(&s->js, t, n);
            continue;
        }
        if (o == s->lay[at].dflt)
            continue;
        if (s->lay[at].dflt == NULL) { /* a list field (`default_factory=list`): left out when empty */
            if (PyList_CheckExact(o) && PyList_Size(o) == 0)
                continue;
            goto done;
        }
        if (s->js.n > first) {
            if (reserve(&s->js, 1) < 0) {
                result = -1;
                goto done;
            }
            put(&s->js, ",", 1);
        }
        rc = json_member(s, at, o);
        if (rc <= 0) {
            result = rc;
            goto done;
        }
    }
    if (reserve(&s->js, 1) < 0) {
        result = -1;
        goto done;
    }
    put(&s->js, "}", 1);

    /* its lines, then its GPUs' */
    char tags[TAGS_MAX];
    text none = {NULL, 0};
    long lines = 0;
    if (mask) {
        Py_ssize_t tags_len = tag_text(s, j, TAGS_PROCESS, cmd_t, pid_t, ppid_t, key_t, none, tags);
        for (int k = 0; k < s->nf; k++) {
            if (!v[k].kind)
                continue;
            if (line(s, s->f[k].name, s->f[k].name_len, tags, tags_len, &v[k]) < 0) {
                result = -1;
                goto done;
            }
            lines++;
        }
    }
    for (Py_ssize_t i = 0; i < ngpus; i++) {
        if (!g[i].mask)
            continue;
        Py_ssize_t tags_len = tag_text(s, j, TAGS_GPU, cmd_t, pid_t, none, key_t, g[i].uuid, tags);
        for (int k = 0; k < s->ng; k++) {
            if (!g[i].v[k].kind)
                continue;
            if (line(s, s->g[k].name, s->g[k].name_len, tags, tags_len, &g[i].v[k]) < 0) {
                result = -1;
                goto done;
            }
            lines++;
        }
    }
    if (PyList_Append(j->fresh, key) < 0) {
        result = -1;
        goto done;
    }
    *changed |= mask != 0 || ngpus != 0;
    *count = lines;
    result = 1;
done:
    Py_XDECREF(encoded);
    Py_XDECREF(pgpus);
    Py_XDECREF(key);
    return result;
}

static int by_value(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* write `obj` (a job) here: 1 (its lines in s->out, *new_job, *count), 0 when `step` must take it (what
 * was written of it is dropped, no key added), -1 on error */
static int write_job(sample *s, PyObject *obj, PyObject **new_job, long *count) {
    job j;
    long long job_id, epoch;
    int rc = int_attr(obj, s->s_job, 0, &job_id);
    if (rc <= 0)
        return rc;
    rc = int_attr(obj, s->s_epoch, 0, &epoch);
    if (rc <= 0)
        return rc;
    j.job.s = decimal(job_id, j.job_s + sizeof j.job_s);
    j.job.n = j.job_s + sizeof j.job_s - j.job.s;
    j.epoch.n = 0;
    if (epoch) {
        j.epoch.s = decimal(epoch, j.epoch_s + sizeof j.epoch_s);
        j.epoch.n = j.epoch_s + sizeof j.epoch_s - j.epoch.s;
    }
    /* `job_key`: the job, or job@epoch */
    memcpy(j.key_s, j.job.s, (size_t)j.job.n);
    j.key.n = j.job.n;
    if (j.epoch.n) {
        j.key_s[j.key.n++] = '@';
        memcpy(j.key_s + j.key.n, j.epoch.s, (size_t)j.epoch.n);
        j.key.n += j.epoch.n;
    }
    j.key.s = j.key_s;

    /* the text so far goes out in chunks of about FLUSH_AT: small blocks the allocator reuses, where one
     * growing buffer and its copy would touch fresh memory for every sample */
    if (s->out.n >= FLUSH_AT && flush(&s->out, s->chunks) < 0)
        return -1;
    int result = 0;
    PyObject *user = NULL, *procs = NULL, *key = NULL, *items = NULL;
    long long *pids = NULL;
    j.fresh = NULL;
    Py_ssize_t mark = s->out.n;
    s->js.n = 0;
    user = PyObject_GetAttr(obj, s->s_user);
    if (user == NULL)
        return -1;
    if (!PyUnicode_CheckExact(user))
        goto done;
    j.user.n = 0;
    if (PyUnicode_GetLength(user) > 0) {
        rc = plain_str(user, &j.user);
        if (rc <= 0) {
            result = rc;
            goto done;
        }
    }
    procs = PyObject_GetAttr(obj, s->s_processes);
    if (procs == NULL) {
        result = -1;
        goto done;
    }
    if (!PyList_CheckExact(procs))
        goto done;
    key = PyUnicode_DecodeASCII(j.key.s, j.key.n, NULL);
    if (key == NULL) {
        result = -1;
        goto done;
    }
    rc = PySet_Contains(s->seen_jobs, key);
    if (rc != 0) {
        result = rc < 0 ? -1 : 0;
        goto done;
    }

    /* each process' fields in one call (`astuple` of exactly the process struct), and the job line: its
     * processes, counting those a process rolled up */
    Py_ssize_t nprocs = PyList_Size(procs);
    items = PyList_New(nprocs);
    if (items == NULL) {
        result = -1;
        goto done;
    }
    long long n = nprocs;
    pids = PyMem_Malloc(sizeof(long long) * (size_t)(nprocs ? nprocs : 1));
    if (pids == NULL) {
        PyErr_NoMemory();
        result = -1;
        goto done;
    }
    for (Py_ssize_t i = 0; i < nprocs; i++) {
        PyObject *p = PyList_GetItem(procs, i);
        if ((PyObject *)Py_TYPE(p) != s->cls)
            goto done;
        PyObject *t = PyObject_CallFunctionObjArgs(s->astuple, p, NULL);
        if (t == NULL) {
            result = -1;
            goto done;
        }
        PyList_SetItem(items, i, t); /* steals the reference */
        if (!PyTuple_CheckExact(t) || PyTuple_Size(t) != s->np)
            goto done;
        rc = int_value(PyTuple_GetItem(t, s->i_pid), 1, &pids[i]);
        if (rc <= 0) {
            result = rc;
            goto done;
        }
        PyObject *o = PyTuple_GetItem(t, s->i_rolledup);
        if (!PyLong_CheckExact(o))
            goto done;
        int overflow = 0;
        long long rolledup = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (rolledup == -1 && PyErr_Occurred()) {
            result = -1;
            goto done;
        }
        if (overflow > 0 || (rolledup > 0 && n > LLONG_MAX - rolledup))
            n = LLONG_MAX; /* `min(..., INT64_MAX)` */
        else if (overflow == 0 && rolledup > 0)
            n += rolledup;
    }
    /* two processes of one pid would share a key: `unique_key` numbers the second, the pure path's */
    qsort(pids, (size_t)nprocs, sizeof(long long), by_value);
    for (Py_ssize_t i = 1; i < nprocs; i++)
        if (pids[i] == pids[i - 1])
            goto done;
    char tags[TAGS_MAX];
    text none = {NULL, 0};
    Py_ssize_t tags_len = tag_text(s, &j, TAGS_JOB, none, none, none, j.key, none, tags);
    value v = {1, n, 0.0};
    if (line(s, "job_processes", 13, tags, tags_len, &v) < 0) {
        result = -1;
        goto done;
    }

    /* its processes, and the JSON of the skeleton's processes in s->js */
    j.fresh = PyList_New(0);
    if (j.fresh == NULL || reserve(&s->js, 1) < 0) {
        result = -1;
        goto done;
    }
    put(&s->js, "[", 1);
    long lines = 1;
    int changed = 0;
    for (Py_ssize_t i = 0; i < nprocs; i++) {
        long plines = 0;
        rc = write_process(s, &j, PyList_GetItem(items, i), &plines, &changed);
        if (rc <= 0) {
            result = rc;
            goto done;
        }
        lines += plines;
    }
    if (reserve(&s->js, 1) < 0) {
        result = -1;
        goto done;
    }
    put(&s->js, "]", 1);

    /* taken: its keys are known from now on */
    if (PySet_Add(s->seen_jobs, key) < 0) {
        result = -1;
        goto done;
    }
    for (Py_ssize_t i = 0; i < nprocs; i++) {
        if (PySet_Add(s->seen_procs, PyList_GetItem(j.fresh, i)) < 0) {
            result = -1;
            goto done;
        }
    }
    if (changed) { /* `replace(job, processes=Raw(JSON of the skeleton's processes))` */
        PyObject *json = PyBytes_FromStringAndSize(s->js.p, s->js.n);
        PyObject *raw = json == NULL ? NULL : PyObject_CallFunctionObjArgs(s->raw, json, NULL);
        PyObject *kwargs = raw == NULL ? NULL : Py_BuildValue("{sO}", "processes", raw);
        PyObject *args = kwargs == NULL ? NULL : PyTuple_Pack(1, obj);
        *new_job = args == NULL ? NULL : PyObject_Call(s->replace, args, kwargs);
        Py_XDECREF(args);
        Py_XDECREF(kwargs);
        Py_XDECREF(raw);
        Py_XDECREF(json);
        if (*new_job == NULL) {
            result = -1;
            goto done;
        }
    } else {
        Py_INCREF(obj);
        *new_job = obj;
    }
    *count = lines;
    result = 1;
done:
    if (result != 1)
        s->out.n = mark; /* nothing of a job the pure path takes (or of an error) */
    PyMem_Free(pids);
    Py_XDECREF(items);
    Py_XDECREF(j.fresh);
    Py_XDECREF(key);
    Py_XDECREF(procs);
    Py_XDECREF(user);
    return result;
}
static int read_fields(PyObject *fields, field *f, int *nf) {
    Py_ssize_t n = PyTuple_Size(fields);
    if (n < 0)
        return -1;
    if (n > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "jobs: too many fields");
        return -1;
    }
    *nf = (int)n;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *row = PyTuple_GetItem(fields, k);
        if (row == NULL)
            return -1;
        PyObject *attr, *name, *flag, *keep_zero, *zero;
        if (!PyArg_ParseTuple(row, "UUOOO:jobs field", &attr, &name, &flag, &keep_zero, &zero))
            return -1;
        f[k].attr = attr;
        f[k].name = PyUnicode_AsUTF8AndSize(name, &f[k].name_len);
        if (f[k].name == NULL)
            return -1;
        if (!plain(f[k].name, f[k].name_len)) {
            PyErr_SetString(PyExc_ValueError, "jobs: a measurement name that needs escaping");
            return -1;
        }
        f[k].flag = PyObject_IsTrue(flag);
        f[k].keep_zero = PyObject_IsTrue(keep_zero);
        if (f[k].flag < 0 || f[k].keep_zero < 0)
            return -1;
        f[k].zero = zero;
    }
    return 0;
}

/* `layout`: (the process struct, its fields: (name, default, from `default_factory=list`) in order, `astuple`,
 * `msgspec.Raw`, `msgspec.json.encode`) */
static int read_layout(sample *s, PyObject *layout) {
    PyObject *fields;
    if (!PyArg_ParseTuple(layout, "OO!OOO:jobs layout", &s->cls, &PyTuple_Type, &fields, &s->astuple, &s->raw,
                          &s->encode))
        return -1;
    Py_ssize_t n = PyTuple_Size(fields);
    if (n > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "jobs: too many process fields");
        return -1;
    }
    s->np = (int)n;
    const char *names[] = {"pid", "ppid", "cmd", "gpus", "rolledup"};
    int *at[] = {&s->i_pid, &s->i_ppid, &s->i_cmd, &s->i_gpus, &s->i_rolledup};
    for (size_t i = 0; i < 5; i++)
        *at[i] = -1;
    for (int k = 0; k < s->nf; k++)
        s->fi[k] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *dflt;
        int factory;
        if (!PyArg_ParseTuple(PyTuple_GetItem(fields, i), "UOp:jobs layout field", &name, &dflt, &factory))
            return -1;
        s->lay[i].name.s = PyUnicode_AsUTF8AndSize(name, &s->lay[i].name.n);
        if (s->lay[i].name.s == NULL)
            return -1;
        if (!plain(s->lay[i].name.s, s->lay[i].name.n) || !json_plain(s->lay[i].name.s, s->lay[i].name.n)) {
            PyErr_SetString(PyExc_ValueError, "jobs: a field name that needs escaping");
            return -1;
        }
        s->lay[i].dflt = factory ? NULL : dflt;
        s->lay[i].int_default = 0;
        if (!factory && PyLong_CheckExact(dflt)) {
            int overflow = 0;
            s->lay[i].int_value = PyLong_AsLongLongAndOverflow(dflt, &overflow);
            if (s->lay[i].int_value == -1 && PyErr_Occurred())
                return -1;
            if (overflow) {
                PyErr_SetString(PyExc_ValueError, "jobs: an int default beyond int64");
                return -1;
            }
            s->lay[i].int_default = 1;
        }
        for (size_t w = 0; w < 5; w++)
            if (PyUnicode_CompareWithASCIIString(name, names[w]) == 0)
                *at[w] = (int)i;
        for (int k = 0; k < s->nf; k++)
            if (PyUnicode_Compare(name, s->f[k].attr) == 0)
                s->fi[k] = (int)i;
    }
    int ok = 1;
    for (size_t i = 0; i < 5; i++)
        ok &= *at[i] >= 0;
    for (int k = 0; k < s->nf; k++)
        ok &= s->fi[k] >= 0;
    if (!ok || s->lay[s->i_gpus].dflt != NULL) {
        PyErr_SetString(PyExc_ValueError, "jobs: the layout lacks a field (or `gpus` is not a list field)");
        return -1;
    }
    return 0;
}

static PyObject *jobs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *list, *cluster, *host, *proc_fields, *gpu_fields, *layout, *stamp, *step;
    sample s;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "O!UUO!O!O!O!O!O!UOO:jobs", &PyList_Type, &list, &cluster, &host, &PySet_Type,
                          &s.seen_jobs, &PySet_Type, &s.seen_procs, &PyTuple_Type, &proc_fields, &PyTuple_Type,
                          &gpu_fields, &PyTuple_Type, &layout, &PyList_Type, &s.chunks, &stamp, &s.replace,
                          &step))
        return NULL;
    s.stamp.s = PyUnicode_AsUTF8AndSize(stamp, &s.stamp.n);
    if (s.stamp.s == NULL || read_fields(proc_fields, s.f, &s.nf) < 0 || read_fields(gpu_fields, s.g, &s.ng) < 0 ||
        read_layout(&s, layout) < 0)
        return NULL;
    s.foreign = PySet_Size(s.seen_procs) != 0;
    int fast = plain_str(cluster, &s.cluster);
    if (fast > 0)
        fast = plain_str(host, &s.host);
    if (fast < 0)
        return NULL;
    PyObject **names[] = {&s.s_job, &s.s_user, &s.s_epoch, &s.s_processes, &s.s_uuid};
    const char *words[] = {"job", "user", "epoch", "processes", "uuid"};
    PyObject *out = NULL, *result = NULL;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if ((*names[i] = PyUnicode_InternFromString(words[i])) == NULL)
            goto fail;
    out = PyList_New(0);
    if (out == NULL)
        goto fail;
    long count = 0;
    Py_ssize_t n = PyList_Size(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyList_GetItem(list, i);
        if (obj == NULL)
            goto fail;
        Py_INCREF(obj); /* `step` may change the list */
        PyObject *new_job = NULL;
        long lines = 0;
        int rc = fast ? write_job(&s, obj, &new_job, &lines) : 0;
        if (rc == 0) {
            s.foreign = 1;
            PyObject *r = flush(&s.out, s.chunks) < 0 ? NULL : PyObject_CallFunctionObjArgs(step, obj, NULL);
            if (r != NULL) {
                PyObject *q;
                if (PyArg_ParseTuple(r, "Ol:jobs step", &q, &lines)) {
                    Py_INCREF(q);
                    new_job = q;
                }
                Py_DECREF(r);
            }
        }
        Py_DECREF(obj);
        if (new_job == NULL)
            goto fail;
        count += lines;
        int appended = PyList_Append(out, new_job);
        Py_DECREF(new_job);
        if (appended < 0)
            goto fail;
    }
    if (flush(&s.out, s.chunks) < 0)
        goto fail;
    result = Py_BuildValue("(Ol)", out, count);
fail:
    Py_XDECREF(out);
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        Py_XDECREF(*names[i]);
    PyMem_Free(s.out.p);
    PyMem_Free(s.js.p);
    return result;
}

/* a line value as `format_line` writes a `value` field that is an exact int (int64 with 'i', uint64 with
 * 'u') or a finite float (repr; below the smallest normal magnitude, zero included, "0.0"): 1 and its text
 * in num[32] (*s, *repr as `value_text` gives them; the length returned in *n), 0 for anything else (a
 * type or value `format_line` writes otherwise or refuses), -1 on error */
static int field_value(PyObject *o, char *num, const char **s, char **repr, Py_ssize_t *n) {
    value v;
    *repr = NULL;
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        v.kind = 1;
        v.i = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v.i == -1 && PyErr_Occurred())
            return -1;
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) { /* beyond uint64 */
                PyErr_Clear();
                return 0;
            }
            char *p = num + 31;
            *p = 'u';
            do {
                *--p = (char)('0' + u % 10);
                u /= 10;
            } while (u);
            *s = p;
            *n = num + 32 - p;
            return 1;
        }
        if (overflow < 0)
            return 0;
    } else if (PyFloat_CheckExact(o)) {
        v.kind = 2;
        v.d = PyFloat_AsDouble(o);
        if (!isfinite(v.d))
            return 0;
        if (fabs(v.d) < DBL_MIN) {
            memcpy(num, "0.0", 3);
            *s = num;
            *n = 3;
            return 1;
        }
    } else {
        return 0;
    }
    *n = value_text(&v, num, s, repr);
    return *n < 0 ? -1 : 1;
}

/* Fault in the pages of [p, p + n), fresh memory about to be written whole, in one call where writing would
 * take a page fault per page: `madvise(MADV_POPULATE_WRITE)` (Linux 5.14; elsewhere, or when it fails,
 * nothing happens and the writes fault the pages in as usual). Why: a sample's messages are half a megabyte
 * of fresh memory, and in a VM a fault per 4 KiB page cost more than writing the text (issue 24's bench).
 * Pages already there are left as they are (the call only maps what is missing); the contents never change. */
static void populate(char *p, Py_ssize_t n) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    if (n < POPULATE_AT)
        return;
    long size = sysconf(_SC_PAGESIZE);
    if (size <= 0)
        return;
    uintptr_t page = (uintptr_t)size;
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + (uintptr_t)n) & ~(page - 1);
    if (end > start)
        (void)madvise((void *)start, end - start, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}

/* join(pieces) -> bytes: `b"".join(pieces)` of a list of bytes, its pages faulted in at once (`populate`) */
static PyObject *join(PyObject *self, PyObject *pieces) {
    (void)self;
    if (!PyList_CheckExact(pieces)) {
        PyErr_SetString(PyExc_TypeError, "join: a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_Size(pieces), total = 0;
    if (n == 1 && PyBytes_CheckExact(PyList_GetItem(pieces, 0))) { /* as `b"".join` does: the piece itself */
        PyObject *only = PyList_GetItem(pieces, 0);
        Py_INCREF(only);
        return only;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyList_GetItem(pieces, i);
        if (!PyBytes_CheckExact(piece)) {
            PyErr_SetString(PyExc_TypeError, "join: a list of bytes");
            return NULL;
        }
        Py_ssize_t size = PyBytes_Size(piece);
        if (size > PY_SSIZE_T_MAX - total)
            return PyErr_NoMemory();
        total += size;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    char *o = out == NULL ? NULL : PyBytes_AsString(out);
    if (o == NULL) {
        Py_XDECREF(out);
        return NULL;
    }
    populate(o, total);
    for (Py_ssize_t i = 0; i < n; i++) { /* (no Python code runs here: the list stays as it was) */
        PyObject *piece = PyList_GetItem(pieces, i);
        Py_ssize_t size = PyBytes_Size(piece);
        memcpy(o, PyBytes_AsString(piece), (size_t)size);
        o += size;
    }
    return out;
}

/* the bytes of `buffer` as a new bytes object (and the buffer freed) */
static PyObject *take(buffer *b) {
    PyObject *out = PyBytes_FromStringAndSize(b->p, b->n);
    PyMem_Free(b->p);
    return out;
}

/* lines(names, tags, values, stamp) -> bytes | None: `{names[i]}{tags} value={values[i]}{stamp}` for each
 * value, as `format_shared` writes it (`field_value`: its plain values, and zeros, subnormals and uint64 as
 * `format_line` writes them); None when one is of another kind (the pure path writes or refuses them).
 * The names must need no escape (the registry's measurements: payloads.py checks them). */
static PyObject *lines(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *names, *tags, *values, *stamp;
    if (!PyArg_ParseTuple(args, "O!UO!U:lines", &PyTuple_Type, &names, &tags, &PyTuple_Type, &values, &stamp))
        return NULL;
    Py_ssize_t n = PyTuple_Size(values);
    if (PyTuple_Size(names) != n) {
        PyErr_SetString(PyExc_ValueError, "lines: as many names as values");
        return NULL;
    }
    text t, st;
    t.s = PyUnicode_AsUTF8AndSize(tags, &t.n);
    st.s = PyUnicode_AsUTF8AndSize(stamp, &st.n);
    if (t.s == NULL || st.s == NULL)
        return NULL;
    buffer b = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) {
        char num[32];
        const char *num_s = NULL;
        char *repr = NULL;
        Py_ssize_t num_len = -1;
        int rc = field_value(PyTuple_GetItem(values, i), num, &num_s, &repr, &num_len);
        text name;
        name.s = rc > 0 ? PyUnicode_AsUTF8AndSize(PyTuple_GetItem(names, i), &name.n) : NULL;
        if (name.s == NULL || reserve(&b, name.n + t.n + 7 + num_len + st.n) < 0) {
            PyMem_Free(repr);
            PyMem_Free(b.p);
            if (rc == 0) /* not plain: the pure path's */
                Py_RETURN_NONE;
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "lines: names must be str");
            return NULL;
        }
        put(&b, name.s, name.n);
        put(&b, t.s, t.n);
        put(&b, " value=", 7);
        put(&b, num_s, num_len);
        put(&b, st.s, st.n);
        PyMem_Free(repr);
    }
    return take(&b);
}

/* values(obj, table) -> (names, values, zeros) | None: `sample_fields.field_values(obj, table)` for a table of rows
 * (attribute, measurement, converter, zero, zero written) whose converter is a code (`sample_fields.Level.coded`: 0 none,
 * 1 `_to_float`, 2 `_kib_to_mib`, 3 `_pstate`), computed as those do (IEEE: int -> double rounds to nearest
 * even as `float(int)` does, a division by 1024 is exact); None when a value is not an exact int or float, or
 * an int the converter would take beyond int64 (the pure `field_values` then). */
static PyObject *values(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *obj, *table;
    if (!PyArg_ParseTuple(args, "OO!:values", &obj, &PyTuple_Type, &table))
        return NULL;
    Py_ssize_t n = PyTuple_Size(table);
    PyObject *names = PyList_New(0), *vals = PyList_New(0), *zeros = PyDict_New(), *result = NULL;
    if (names == NULL || vals == NULL || zeros == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *row = PyTuple_GetItem(table, k);
        if (row == NULL || !PyTuple_Check(row) || PyTuple_Size(row) != 5) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "values: rows of 5");
            goto done;
        }
        PyObject *attr = PyTuple_GetItem(row, 0), *name = PyTuple_GetItem(row, 1), *zero = PyTuple_GetItem(row, 3);
        long code = PyLong_AsLong(PyTuple_GetItem(row, 2));
        int keep_zero = PyObject_IsTrue(PyTuple_GetItem(row, 4));
        if ((code == -1 && PyErr_Occurred()) || keep_zero < 0)
            goto done;
        PyObject *v = PyObject_GetAttr(obj, attr), *bv = NULL;
        if (v == NULL)
            goto done;
        int sure = 1, take = 0;
        if (PyLong_CheckExact(v)) {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(v);
                goto done;
            }
            if (overflow || x != 0 || keep_zero) {
                if (code == 0) {
                    take = 1;
                    Py_INCREF(v);
                    bv = v;
                } else if (code == 1) { /* float(v) within +-2^53, else none */
                    take = !overflow && x >= -F53 && x <= F53;
                    bv = take ? PyFloat_FromDouble((double)x) : NULL;
                } else if (code == 2 || code == 3) { /* v / 1024, float(v - 1): when v <= 2^53 */
                    if (overflow < 0 || (code == 3 && x == LLONG_MIN)) {
                        sure = 0; /* below int64: Python's own arithmetic */
                    } else {
                        take = overflow == 0 && x <= F53;
                        bv = take ? PyFloat_FromDouble(code == 2 ? (double)x / 1024.0 : (double)(x - 1)) : NULL;
                    }
                } else {
                    sure = 0;
                }
            }
        } else if (PyFloat_CheckExact(v)) {
            double d = PyFloat_AsDouble(v);
            if (d != 0.0 || keep_zero) { /* (NaN is true) */
                if (code == 0 || (code == 1 && !(d > -DBL_MIN && d < DBL_MIN && d != 0.0))) {
                    take = 1;
                    Py_INCREF(v);
                    bv = v;
                } else if (code == 2 || code == 3) {
                    take = d <= 9007199254740992.0;
                    bv = take ? PyFloat_FromDouble(code == 2 ? d / 1024.0 : d - 1.0) : NULL;
                } else if (code != 1) {
                    sure = 0;
                }
            }
        } else {
            sure = 0;
        }
        Py_DECREF(v);
        if (!sure) {
            Py_XDECREF(bv);
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        if (take) {
            if (bv == NULL)
                goto done;
            int rc = PyList_Append(vals, bv);
            Py_DECREF(bv);
            if (rc < 0 || PyList_Append(names, name) < 0 || PyDict_SetItem(zeros, attr, zero) < 0)
                goto done;
        }
    }
    {
        PyObject *nt = PyList_AsTuple(names), *vt = PyList_AsTuple(vals);
        if (nt != NULL && vt != NULL)
            result = PyTuple_Pack(3, nt, vt, zeros);
        Py_XDECREF(nt);
        Py_XDECREF(vt);
    }
done:
    Py_XDECREF(names);
    Py_XDECREF(vals);
    Py_XDECREF(zeros);
    return result;
}

/* numbered(name, head, tail, values, stamp) -> bytes | None: `{name}{head}{i}{tail} value={values[i]}i{stamp}`
 * for each value (hwthread i's line); None when one is not an int in int64. */
static PyObject *numbered(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name, *head, *tail, *values, *stamp;
    if (!PyArg_ParseTuple(args, "UUUO!U:numbered", &name, &head, &tail, &PyList_Type, &values, &stamp))
        return NULL;
    text nm, hd, tl, st;
    nm.s = PyUnicode_AsUTF8AndSize(name, &nm.n);
    hd.s = PyUnicode_AsUTF8AndSize(head, &hd.n);
    tl.s = PyUnicode_AsUTF8AndSize(tail, &tl.n);
    st.s = PyUnicode_AsUTF8AndSize(stamp, &st.n);
    if (nm.s == NULL || hd.s == NULL || tl.s == NULL || st.s == NULL)
        return NULL;
    buffer b = {NULL, 0, 0};
    Py_ssize_t n = PyList_Size(values);
    for (Py_ssize_t i = 0; i < n; i++) {
        value v = {1, 0, 0.0};
        PyObject *o = PyList_GetItem(values, i);
        int rc = 0;
        if (PyLong_CheckExact(o)) {
            int overflow = 0;
            v.i = PyLong_AsLongLongAndOverflow(o, &overflow);
            rc = v.i == -1 && PyErr_Occurred() ? -1 : !overflow;
        }
        if (rc <= 0 || reserve(&b, nm.n + hd.n + 24 + tl.n + 7 + 32 + st.n) < 0) {
            PyMem_Free(b.p);
            if (rc == 0)
                Py_RETURN_NONE;
            return NULL;
        }
        char index[24], num[32];
        const char *index_s = decimal((long long)i, index + sizeof index);
        num[31] = 'i';
        const char *num_s = decimal(v.i, num + 31);
        put(&b, nm.s, nm.n);
        put(&b, hd.s, hd.n);
        put(&b, index_s, index + sizeof index - index_s);
        put(&b, tl.s, tl.n);
        put(&b, " value=", 7);
        put(&b, num_s, num + 32 - num_s);
        put(&b, st.s, st.n);
    }
    return take(&b);
}

static PyObject *float_repr(PyObject *self, PyObject *arg) {
    (void)self;
    double d = PyFloat_AsDouble(arg);
    if (d == -1.0 && PyErr_Occurred())
        return NULL;
    char num[32];
    const char *s;
    char *repr = NULL;
    value v = {2, 0, d};
    Py_ssize_t n = isfinite(d) ? value_text(&v, num, &s, &repr) : 0;
    if (n == 0) {
        repr = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        s = repr;
        n = repr == NULL ? -1 : (Py_ssize_t)strlen(repr);
    }
    if (n < 0)
        return NULL;
    PyObject *text = PyUnicode_DecodeASCII(s, n, NULL);
    PyMem_Free(repr);
    return text;
}

/* the character after the backslash of each character `string_field` escapes, 0 for the others */
/* `format._string_field(text).encode()`: the text quoted, with '\\' and '"' escaped and CR, LF written as
 * `\r`, `\n` (one pass: the pure path's four replacements never touch what an earlier one wrote); None for
 * a str without UTF-8 (lone surrogates), which the pure path writes */
static PyObject *string_field(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "string_field: a str");
        return NULL;
    }
    Py_ssize_t n;
    const char *t = PyUnicode_AsUTF8AndSize(arg, &n);
    if (t == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t extra = lp_string_escapes(t, n);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n + extra + 2);
    if (out == NULL)
        return NULL;
    char *o = PyBytes_AsString(out);
    if (o == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    *o++ = '"';
    o = lp_string_escape(o, t, n, extra);
    *o = '"';
    return out;
}

static PyMethodDef methods[] = {
    {"string_field", string_field, METH_O,
     "string_field(text: str) -> bytes | None: `format._string_field(text).encode()` (None: the pure path's)."},
    {"jobs", jobs, METH_VARARGS,
     "jobs(jobs, cluster, host, seen_jobs, seen_procs, proc_fields, gpu_fields, layout, chunks, stamp, replace, "
     "step) -> (list, int): the lines of a sample's jobs appended to `chunks` and the jobs as the skeleton "
     "holds them (encoding as `sample_to_lp.each_job(jobs, step)`'s); `step` for each job not written here."},
    {"lines", lines, METH_VARARGS,
     "lines(names, tags, values, stamp) -> bytes | None: the lines of one object's numbers (`put`)."},
    {"values", values, METH_VARARGS,
     "values(obj, table) -> (names, values, zeros) | None: `sample_fields.field_values` (converters as codes)."},
    {"numbered", numbered, METH_VARARGS,
     "numbered(name, head, tail, values, stamp) -> bytes | None: the lines of hwthreads 0, 1, ... (int64s)."},
    {"join", join, METH_O,
     "join(pieces: list[bytes]) -> bytes: `b\"\".join(pieces)`, the pages of a large result faulted in at once."},
    {"float_repr", float_repr, METH_O,
     "float_repr(x: float) -> str: `repr(x)` as the writer writes a float value (tests hold the two equal)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_write", "The compiled writer of Sonar job and process lines (see payloads.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__write(void) { return PyModule_Create(&module); }
