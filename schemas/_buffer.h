/* schemas/_buffer.h: what the C extensions writing text share (`translate/_write.c`: LP payloads,
 * `ocs/_read.c`: event lines and the jobs envelope): the growing byte buffer, integers in decimal, and the
 * escape of a line-protocol string field.
 *
 * Why one header: both write text into a buffer that grows by doubling, write ints in decimal and escape
 * string fields (JSON, a quote every few bytes); each had its own copy of the same code (the writer's first size kept: it flushes at 32 KiB, so one allocation serves
 * a call). `static inline` (each extension is one translation unit on the stable
 * ABI: no symbol is shared at link time). Include after <Python.h>.
 */
#ifndef HPCBUS_BUFFER_H
#define HPCBUS_BUFFER_H

#include <stdint.h>
#include <string.h>

/* a growing byte buffer of UTF-8 text; zeroed to start, `PyMem_Free(b.p)` at the end */
typedef struct {
    char *p;
    Py_ssize_t n, cap;
} buffer;

/* room for `more` bytes after the `n` held (doubling, 64 KiB at first): 0, or -1 with MemoryError set */
static inline int reserve(buffer *b, Py_ssize_t more) {
    if (b->n + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap * 2 : 65536;
    if (cap < b->n + more)
        cap = b->n + more;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* the decimal digits of v, sign and all, ending at `end`; returns where they start (21 bytes are enough) */
static inline char *decimal(long long v, char *end) {
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char *p = end;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return p;
}

/* --- a line-protocol string field's value (`format._string_field`, without its quotes) -------------------- */

/* what each byte is escaped as after a backslash (0: copied as it is): `\\` and `"`, CR and LF as `\r` and
 * `\n`. Every other byte is copied: in UTF-8 no byte of a multi-byte character is ASCII. */
static const char LP_STRING_ESCAPED[256] = {['\\'] = '\\', ['"'] = '"', ['\r'] = 'r', ['\n'] = 'n'};

/* the bytes of 8 at `p` that are escaped: the high bit of each such byte (word at a time: for each of the
 * four, `x` = the word XOR that byte in every lane; a lane of `x` is zero exactly where the byte is it, and
 * `~(((x & 0x7f..) + 0x7f..) | x | 0x7f..)` sets the high bit of exactly those lanes, no carry crossing) */
static inline uint64_t lp_escapes8(const char *p) {
    const uint64_t lanes = 0x0101010101010101ULL, low = 0x7f7f7f7f7f7f7f7fULL;
    uint64_t w, found = 0;
    memcpy(&w, p, 8);
    const unsigned char targets[] = {'\\', '"', '\r', '\n'};
    for (int k = 0; k < 4; k++) {
        uint64_t x = w ^ (lanes * targets[k]);
        found |= ~(((x & low) + low) | x | low);
    }
    return found;
}

/* the number of lanes `lp_escapes8` marked (each lane's high bit, moved to its low bit, summed by the
 * multiply into the top byte: at most 8, no carry) */
static inline Py_ssize_t lp_marked(uint64_t found) {
    return (Py_ssize_t)(((found >> 7) * 0x0101010101010101ULL) >> 56);
}

/* how many bytes escaping [t, t+n) adds */
static inline Py_ssize_t lp_string_escapes(const char *t, Py_ssize_t n) {
    Py_ssize_t extra = 0, i = 0;
    for (; i + 8 <= n; i += 8)
        extra += lp_marked(lp_escapes8(t + i));
    for (; i < n; i++)
        extra += LP_STRING_ESCAPED[(unsigned char)t[i]] != 0;
    return extra;
}

/* [t, t+n) escaped into `o`, which has room for n + `extra` (`lp_string_escapes`); returns the end. One pass:
 * the pure path's four replacements never touch what an earlier one wrote. */
static inline char *lp_string_escape(char *o, const char *t, Py_ssize_t n, Py_ssize_t extra) {
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t end = n - i >= 8 ? i + 8 : n; /* a word at a time: copied whole when nothing in it escapes */
        if (extra == 0 || (end - i == 8 && lp_escapes8(t + i) == 0)) {
            end = extra == 0 ? n : end;
            memcpy(o, t + i, (size_t)(end - i));
            o += end - i;
            i = end;
            continue;
        }
        for (; i < end; i++) {
            unsigned char c = (unsigned char)t[i];
            char escaped = LP_STRING_ESCAPED[c];
            if (escaped) {
                *o++ = '\\';
                *o++ = escaped;
                extra--;
            } else {
                *o++ = (char)c;
            }
        }
    }
    return o;
}

#endif
