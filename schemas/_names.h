/* schemas/_names.h: the rules of `schemas/names.py` that the C extensions apply, written once.
 *
 * Why a header of its own: the line readers (`_lineshape.h`: the canonical line of `_scan.c` and `_place.c`)
 * and the Sonar -> LP writer (`translate/_write.c`, which writes a GPU's uuid as its `type-id`) must take
 * exactly the names the pure path takes, and hand anything else to it. Everything is `static inline` over
 * bytes; the tables are marked unused, as an extension may need only one of them.
 *
 * Include after <Python.h> (Py_ssize_t).
 */
#ifndef HPCBUS_NAMES_H
#define HPCBUS_NAMES_H

#define LP_JOB_ID_MAX 64
#define LP_DEVICE_ID_MAX 64 /* `names.DEVICE_ID_MAX` */

/* the bytes of a job id (`names._JOB_ID`) and of a device id (`names._DEVICE_ID`: `type-id`, `stype`) */
static const unsigned char LP_JOB_ID_BYTES[256] __attribute__((unused)) = {
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1, ['_'] = 1, ['.'] = 1,
    ['+'] = 1,         [':'] = 1,         ['@'] = 1,         ['['] = 1, [']'] = 1, ['-'] = 1,
};
static const unsigned char LP_DEVICE_ID_BYTES[256] __attribute__((unused)) = {
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1, ['_'] = 1, ['.'] = 1, [':'] = 1, ['#'] = 1, ['-'] = 1,
};

/* `names._charset_problem(...) is None`: 1 to `limit` bytes of `table`, not '.', no '..' */
static inline int lp_id_like(const unsigned char *table, const char *s, Py_ssize_t n, Py_ssize_t limit) {
    if (n == 0 || n > limit)
        return 0;
    if (n == 1 && s[0] == '.')
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!table[c])
            return 0;
        if (c == '.' && i > 0 && s[i - 1] == '.')
            return 0;
    }
    return 1;
}

/* `names.job_id_problem(...) is None`: [A-Za-z0-9_.+:@[]-]{1,64}, not '.', no '..' */
static inline int lp_job_id(const char *s, Py_ssize_t n) { return lp_id_like(LP_JOB_ID_BYTES, s, n, LP_JOB_ID_MAX); }

/* `names.device_id_problem(...) is None`: [A-Za-z0-9_.:#-]{1,64}, not '.', no '..' */
static inline int lp_device_id(const char *s, Py_ssize_t n) {
    return lp_id_like(LP_DEVICE_ID_BYTES, s, n, LP_DEVICE_ID_MAX);
}

/* `common.device_key(s) == s` (`schemas/translate`): a device id of at most 56 bytes (room for a repeat's `#n`) */
static inline int lp_device_key(const char *s, Py_ssize_t n) {
    return lp_id_like(LP_DEVICE_ID_BYTES, s, n, LP_DEVICE_ID_MAX - 8);
}

/* `names.measurement_problem(...) is None` for a measurement of name bytes (`lp_name_byte`: no white space,
 * '\\' or control byte): none of '/', '.', '*' and '>' */
static inline int lp_measurement_name(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '/' || c == '.' || c == '*' || c == '>')
            return 0;
    }
    return 1;
}

#endif /* HPCBUS_NAMES_H */
