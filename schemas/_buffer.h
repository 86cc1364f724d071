/* schemas/_buffer.h: the growing byte buffer and the integer text that the C extensions writing text share
 * (`translate/_write.c`: LP payloads, `ocs/_read.c`: event lines).
 *
 * Why one header: both write text into a buffer that grows by doubling and write ints in decimal; each had
 * its own copy of the same code (the writer's first size kept: it flushes at 32 KiB, so one allocation serves
 * a call). `static inline` (each extension is one translation unit on the stable
 * ABI: no symbol is shared at link time). Include after <Python.h>.
 */
#ifndef HPCBUS_BUFFER_H
#define HPCBUS_BUFFER_H

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

#endif
