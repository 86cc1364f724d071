"""`python -m hpcbus.schemas.metrics < docs/mapping.md` prints the document with both metric tables updated;
without input it prints the two tables (no file I/O here: stdin and stdout only)."""

import sys

from hpcbus.schemas.metrics.tables import node_table, render_doc, sonar_table

if sys.stdin.isatty():
    sys.stdout.write(f"{sonar_table()}\n\n{node_table()}\n")
else:
    sys.stdout.write(render_doc(sys.stdin.read()))
