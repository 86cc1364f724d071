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
 * A line is taken only when it is a canonical metric line as `lp_canonical` (`schemas/_lineshape.h`, the
 * rules this scan shares with the LP -> Sonar read, `translate/_place.c`) says: at most 1024 bytes of
 *     measurement(,key=value)+ value=NUMBER SECONDS
 * every byte printable ASCII, no escape, quote, '=' or '#' but the separators, valid host, level, cluster
 * and job tags, SECONDS in [earliest, end). Anything else is handed to the pure path: this file decides
 * nothing the pure path would decide otherwise.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_lineshape.h"

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
    lp_lines lines;
    lp_lines_of(&lines, buf, size);
    lp_parts parts;
    const char *line;
    Py_ssize_t len, rest = 0;
    while (lp_next_line(&lines, &line, &len)) {
        PyObject *item;
        if (lp_canonical(line, len, earliest, end, &parts)) {
            item = PyUnicode_DecodeASCII(line, len, NULL);
        } else {
            item = PyLong_FromSsize_t(lines.number);
            rest++;
        }
        if (lp_append_new(out, item) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return Py_BuildValue("(Nni)", out, rest, lines.plain); /* N: the tuple takes `out` over */
}

LP_EXTENSION(_scan, "The compiled line-protocol scan (see scan.py).", "scan", scan,
             "scan(payload: bytes, earliest: int, end: int) -> (list[str | int], int, bool): per non-empty "
             "line, its text when it is a canonical metric line taken as it came, else its line number (for "
             "the pure path); how many line numbers; whether the payload is plain ASCII.")
