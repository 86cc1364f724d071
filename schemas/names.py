"""What a cluster name, a host name, a job id, a job name and a tag value may be: decided once, here.

Names from the wire travel far: into NATS subjects, InfluxDB series keys, file names of the Sonar tree, and
the metric store's checkpoint paths (cc-backend 1.5.4 skips a sample whose `cluster` or `hostname` contains
`..`, `/` or `\\`, because they escaped its checkpoint directory). Tag values are also shown on terminals and
dashboards, where an escape sequence (`\\x1b[31m`) repaints what an operator reads. So every entry (the
gateway, `consume ingest`, the workers, `hpcbus validate`, `hpcbus pub --validate`) asks this module, through
`schemas.lineprotocol.parse_payload` and the Sonar decoder, and refuses what it calls unsafe, with the reason.

The rules, and the real limits behind the lengths:

* host name (`hostname`, `host`, `node`, `nodename` tags: `HOST_TAGS`): dot-separated labels of
  `[A-Za-z0-9_-]`, no empty label (so no `..`, no leading or trailing dot), no label starting with `-`, at
  most `HOST_MAX` = 253 characters: the longest name DNS can carry (RFC 1035: 255 octets on the wire, 253 as
  text). The DNS label limit of 63 is not enforced: Slurm and Sonar names need not be DNS names, and a long
  label harms nothing here (file names are shortened by the Sonar tree's writer). The underscore is accepted
  as Slurm's hostlists accept it (`schemas.noderange`).
* Sonar host name (`sonar_host_problem`, `SONAR_HOST_PATTERN`): stricter than a host name on the bus. Sonar's
  `Hostname` (NordicHPC/sonar `util/formats/newfmt/types.go`, `doc/NEW-FORMAT.md`) is a "dotted host name or
  prefix of same, with standard restrictions on character set": RFC 1123 labels of letters, digits and inner
  hyphens, 1 to `SONAR_LABEL_MAX` = 63 characters each, at most `HOST_MAX` characters in all. So `c1_5` and a
  single label of 253 characters are host names the bus carries (line protocol and ClusterCockpit allow them)
  but no Sonar envelope may name them: `consume sonar` refuses such a host once, with this reason, rather
  than build envelopes its own validator refuses (docs/mapping.md, "Host names Sonar refuses").
* cluster name: the same rule (dots are valid: `fox.educloud.no`), at most `CLUSTER_MAX` = 253 characters
  (Sonar 0.19 types `meta.cluster` as a `Clustername`, which this rule satisfies: schemas/sonar; a cluster
  name is a run of subject tokens and a directory name).
* job id (`job` tag): 1 to `JOB_ID_MAX` = 64 characters of `[A-Za-z0-9_.+:@\\[\\]-]`, not `.`/`..` and no
  `..` (Slurm `123_4`, `123+0`, `123.batch`; PBS `123[4].server`; Grid Engine `123.1`). 64 is far above
  any scheduler's id (Slurm's are 32-bit numbers with a suffix) and keeps a series key small.
* job name: any text of printable characters, at most `JOB_NAME_MAX` = 1024 characters. A job name is the
  user's (`sbatch -J`), never a path or a key, so it is made safe rather than refused (`safe_text`: control
  characters become spaces, cut at 1024): one user's odd name must not cost the other jobs of a poll.
* any tag key, tag value or measurement: no control character (C0 `\\x00`-`\\x1f` including tab and newline,
  DEL `\\x7f`, C1 `\\x80`-`\\x9f`, which terminals also obey; and the Unicode bidi controls
  U+202A-U+202E, U+2066-U+2069 and the line/paragraph separators U+2028, U+2029, which reorder or break
  what a dashboard shows, so that `n1\\u202e` reads as another name), values at most `TAG_VALUE_MAX` = 1024
  characters: a tag is part of a series key; InfluxDB refuses a series key over 64 KiB, and a kilobyte in one
  tag is a command line or a payload put in a tag by mistake, not a name.
* a name that becomes one path component (`path_component_problem`): no `/`, `\\`, NUL, not `.` or `..`, no
  `..` anywhere (cc-backend's own test), at most 255 bytes (Linux `NAME_MAX`). Host and cluster names pass
  it by construction.
* measurement, event class, log component (`measurement_problem`): besides the rule of any name above, no
  `/`, `\\`, `.` (so no `..`), `*`, `>` and no white space. An event class and a log component are NATS
  subject tokens (`<cluster>.events.<class>`), where `.` splits a token and `*`, `>` are wildcards; a
  measurement becomes an InfluxDB measurement, a metric store key and a Grafana query's name, and the gateway
  makes measurements of Telegraf's field keys (`cpu` + `usage_user`), so one rule covers every kind: no
  real writer's measurement holds these characters (the metric registry, Telegraf's inputs, Slurm's profile
  plugin and cc-metric-collector use `[A-Za-z0-9_-]`).
* field key (`field_key_problem`): the rule of a tag key (no control character, at most 1024 characters).
  A Telegraf field key also becomes part of a measurement's name (`<measurement>_<field>`): that name is
  checked by `measurement_problem` where it is made (`schemas.foreign.influx`).
* `type-id` and `stype` (`device_id_problem`, `DEVICE_TAGS`): the metric store (cc-metric-store, cc-backend's
  `pkg/metricstore`) appends `type`+`type-id` (`socket0`, `accelerator00000000:3b:00.0`) and
  `stype`+`stype-id` to the host's selector: each is a level key below the host in memory, in its REST
  queries and in its checkpoints (the Avro writer makes field names of them, replacing only `:` and `.`).
  A device id is a number (a hwthread, core or socket), a PCI bus id (`00000000:3B:00.0`), a GPU UUID
  (`GPU-5c89852c-...`, `MIG-...`), or the Sonar translation's repeat of one (`GPU-...#2`); and a node-level
  line's `type-id` is its `stype`, a word (`disk`, `process`): so 1 to `DEVICE_ID_MAX` = 64 characters of
  `[A-Za-z0-9_.:#-]`, no `..` and not `.` (NVIDIA's UUIDs are 40, MIG's 44). `type-id=../../x` is refused.
  `stype-id` stays free text (the spec's own example is `stype-id=/homes`; processes are `<job>/<pid>`).
* fields per line: at most `FIELDS_MAX` = 1,000 (`fields_problem`). A ClusterCockpit line has one field
  (cc-metric-collector and Slurm's `acct_gather_profile/influxdb` plugin send `value` alone); Telegraf's
  widest inputs send a few hundred in one line (`kernel_vmstat`: every `/proc/vmstat` counter, about 190 on
  Linux 6; `nstat`'s TcpExt about 150; `mysql`'s global status 400 to 600). The gateway makes one
  measurement per numeric field of a Telegraf line, so a line of 10,000 fields (90 kB) was 10,000 new
  InfluxDB measurements; 1,000 is about twice the widest real line.

Every function returns the reason as text, or None when the value is fine; reasons quote the value with
`shown`, which escapes control characters and cuts long values, so a reason is itself safe to print.
"""

from __future__ import annotations

import re

__all__ = [
    "CLUSTER_MAX",
    "CONTROL_CHARACTERS",
    "DEVICE_ID_MAX",
    "DEVICE_TAGS",
    "FIELDS_MAX",
    "HOST_MAX",
    "HOST_TAGS",
    "JOB_ID_MAX",
    "JOB_NAME_MAX",
    "NAME_COMPONENT_MAX",
    "SONAR_HOST_PATTERN",
    "SONAR_LABEL",
    "SONAR_LABEL_MAX",
    "TAG_VALUE_MAX",
    "cluster_problem",
    "device_id_problem",
    "field_key_problem",
    "fields_problem",
    "has_control",
    "host_problem",
    "is_host",
    "job_id_problem",
    "job_name_problem",
    "measurement_problem",
    "path_component_problem",
    "safe_text",
    "shown",
    "sonar_host_problem",
    "tag_problem",
    "tag_set_problem",
    "tags_problem",
    "text_problem",
]

HOST_MAX = 253
"""Longest host name: DNS's limit for a name in text form (RFC 1035, 255 octets on the wire)."""
CLUSTER_MAX = 253
"""Longest cluster name: cluster names are domain-like (`fox.educloud.no`); Sonar 0.19's `Clustername` has
no length limit of its own, so this one is the bus's (a subject and a directory name)."""
JOB_ID_MAX = 64
"""Longest job id: Slurm's are 32-bit numbers plus a step/array suffix; 64 leaves room for PBS server names."""
JOB_NAME_MAX = 1024
"""Longest job name accepted (Slurm keeps what the user gave; longer is a script or a payload, not a name)."""
TAG_VALUE_MAX = 1024
"""Longest tag value (part of an InfluxDB series key, which InfluxDB caps at 64 KiB)."""
NAME_COMPONENT_MAX = 255
"""Longest file name in bytes (Linux `NAME_MAX`)."""
DEVICE_ID_MAX = 64
"""Longest `type-id` or `stype`: a GPU UUID is 40 characters, a MIG UUID 44, a PCI bus id 16."""
FIELDS_MAX = 1000
"""Most fields one line may carry: about twice the widest line a real writer sends (Telegraf's `mysql` global
status, 400 to 600 fields; `kernel_vmstat` about 190); ClusterCockpit's writers send one (`value`)."""

SONAR_LABEL_MAX = 63
"""Longest label of a Sonar `Hostname` (RFC 1123's, and DNS's)."""
SONAR_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
"""One label of a Sonar `Hostname`: letters, digits and inner hyphens, 1 to 63 characters (regex text)."""
SONAR_HOST_PATTERN = rf"^{SONAR_LABEL}(?:\.{SONAR_LABEL})*(?!\n)$"
"""A Sonar `Hostname`: dot-separated `SONAR_LABEL`s (at most `HOST_MAX` characters, which the pattern leaves
to the length check). Written for both Python's `re` and ECMA-262 (JSON Schema validators): `(?!\n)$`
because Python's `$` also matches before a final newline. The Sonar schema's `Hostname` type
(`schemas.sonar.types.scalars`) is this pattern."""

DEVICE_TAGS = ("type-id", "stype")
"""Tags whose value is a level key of the metric store below the host (`device_id_problem`): `type-id`, and
`stype`, which a node-level line carries as its `type-id` on the bus (`lineprotocol.node_level_tags`)."""

HOST_TAGS = ("hostname", "host", "node", "nodename")
"""Tags that name a host: `hostname` (ClusterCockpit), `host` (cc-metric-store's alternative, Telegraf,
Slurm's profile plugin), `node` and `nodename` (Sonar's and Slurm's words). A line names one host: all of
these it carries must agree, and at `consume ingest` they must name the sending node."""

CONTROL_CHARACTERS = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069"
"""What `has_control` finds, as the inside of a regular expression's character class (`[...]`): C0, DEL, C1,
the Unicode line and paragraph separators and the bidi embedding, override and isolate controls."""
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")
_HOST = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_-]*)(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")
_HOST_CHAR = re.compile(r"[^A-Za-z0-9_.-]")
_SONAR_HOST = re.compile(SONAR_HOST_PATTERN)
_SONAR_HOST_CHAR = re.compile(r"[^A-Za-z0-9.-]")
_JOB_ID = re.compile(r"[A-Za-z0-9_.+:@\[\]-]+")
_JOB_ID_CHAR = re.compile(r"[^A-Za-z0-9_.+:@\[\]-]")
_DEVICE_ID = re.compile(r"[A-Za-z0-9_.:#-]+")
_DEVICE_ID_CHAR = re.compile(r"[^A-Za-z0-9_.:#-]")
_MEASUREMENT_CHAR = re.compile(rf"[/\\.*>\s{CONTROL_CHARACTERS}]")
_SHOWN = 40


def shown(value: str) -> str:
    """`value` quoted for a reason: control characters escaped (`repr`), cut after 40 characters with its
    length said, so a reason about a hostile value is itself safe to log and short."""
    if len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def has_control(text: str) -> bool:
    """True when `text` holds a control character (C0, DEL, C1, a bidi control or a line separator)."""
    return _CONTROL.search(text) is not None


def safe_text(text: str, limit: int) -> str:
    """`text` made printable: every control character (`has_control`) becomes a space, and it is cut to
    `limit` characters. For free text such as a job name, where refusing would lose the record around it."""
    if len(text) <= limit and _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(" ", text[:limit])


def text_problem(text: str, what: str, limit: int) -> str | None:
    """Reason why `text` is not safe printable text of at most `limit` characters (`what` names it)."""
    bad = _CONTROL.search(text)
    if bad is not None:
        return (
            f"{what} {shown(text)} holds the control character {bad.group()!r} at offset {bad.start()} "
            "(escape sequences and control characters are refused: they repaint terminals and dashboards)"
        )
    if len(text) > limit:
        return f"{what} of {len(text)} characters is longer than {limit}"
    return None


def _size_problem(name: str, what: str, limit: int) -> str | None:
    """Reason why `name` is empty or longer than `limit`, else None (the first question of every name rule)."""
    if name == "":
        return f"{what} is empty"
    if len(name) > limit:
        return f"{what} {shown(name)} is longer than {limit} characters ({len(name)})"
    return None


def _dotted_problem(name: str, what: str, limit: int) -> str | None:
    if _HOST.fullmatch(name) is not None and len(name) <= limit:
        return None
    sized = _size_problem(name, what, limit)
    if sized is not None:
        return sized
    bad = _HOST_CHAR.search(name)
    if bad is not None:
        char = bad.group()
        why = (
            " (a path separator: names become file and directory names)"
            if char in "/\\"
            else " (control characters are refused)"
            if _CONTROL.match(char)
            else ""
        )
        return f"{what} {shown(name)}: character {char!r} at offset {bad.start()} is not allowed{why}"
    if ".." in name:
        return f"{what} {shown(name)} contains '..' (could leave a directory when used in a path)"
    if name.startswith(".") or name.endswith("."):
        return f"{what} {shown(name)} starts or ends with '.'"
    return f"{what} {shown(name)}: a label starts with '-'"


def host_problem(name: str) -> str | None:
    """Reason why `name` is not a host name (see the module docstring), None when it is one."""
    return _dotted_problem(name, "host name", HOST_MAX)


def is_host(name: str) -> bool:
    """`host_problem(name) is None`, without building a reason (the hot path of every line)."""
    return len(name) <= HOST_MAX and _HOST.fullmatch(name) is not None


def sonar_host_problem(name: str) -> str | None:
    """Reason why `name` may not be a Sonar `Hostname` (see the module docstring: RFC 1123 labels of at most
    63 characters, at most `HOST_MAX` in all), None when it may. Stricter than `host_problem`: `c1_5` is a
    host on the bus, not in a Sonar envelope."""
    if len(name) <= HOST_MAX and _SONAR_HOST.match(name) is not None:
        return None
    what = "Sonar Hostname"
    sized = _size_problem(name, what, HOST_MAX)
    if sized is not None:
        return sized
    bad = _SONAR_HOST_CHAR.search(name)
    if bad is not None:
        return (
            f"{what} {shown(name)}: character {bad.group()!r} at offset {bad.start()} is not allowed "
            "(letters, digits, inner hyphens and dots between labels: RFC 1123)"
        )
    for label in name.split("."):
        if label == "":
            return f"{what} {shown(name)} has an empty label (a leading, trailing or double dot)"
        if len(label) > SONAR_LABEL_MAX:
            return (
                f"{what} {shown(name)} has a label of {len(label)} characters, longer than {SONAR_LABEL_MAX}"
            )
        if label.startswith("-") or label.endswith("-"):
            return f"{what} {shown(name)}: the label {shown(label)} starts or ends with '-'"
    return f"{what} {shown(name)} is not dot-separated labels of letters, digits and inner hyphens"


def cluster_problem(name: str) -> str | None:
    """Reason why `name` is not a cluster name (dots allowed), None when it is one."""
    return _dotted_problem(name, "cluster name", CLUSTER_MAX)


def _charset_problem(
    value: str, what: str, full: re.Pattern[str], char: re.Pattern[str], limit: int, allowed: str = ""
) -> str | None:
    """Reason why `value` is not 1 to `limit` characters of the set `full` matches (`char` finds one outside
    it; `allowed` says the set in the reason), or is `.` or holds `..`; None when it is fine. The rule of job
    ids and device ids: names that are keys, never paths."""
    if full.fullmatch(value) is not None and len(value) <= limit and ".." not in value and value != ".":
        return None
    if value == "":
        return f"{what} is empty"
    if len(value) > limit:
        return f"{what} {shown(value)} is longer than {limit} characters ({len(value)})"
    bad = char.search(value)
    if bad is not None:
        return f"{what} {shown(value)}: character {bad.group()!r} at offset {bad.start()} is not allowed{allowed}"
    return f"{what} {shown(value)} is '.' or contains '..'"


def job_id_problem(job: str) -> str | None:
    """Reason why `job` is not a job id, None when it is one."""
    return _charset_problem(job, "job id", _JOB_ID, _JOB_ID_CHAR, JOB_ID_MAX)


def device_id_problem(value: str, what: str = "type-id") -> str | None:
    """Reason why `value` is not a device id (a `type-id`, or the `stype` a node-level line carries as its
    `type-id`: `what`), None when it is one. See the module docstring for why: the metric store keys a level
    below the host with it."""
    allowed = " (a device id is a number, a PCI bus id or a UUID: [A-Za-z0-9_.:#-])"
    return _charset_problem(value, what, _DEVICE_ID, _DEVICE_ID_CHAR, DEVICE_ID_MAX, allowed)


def measurement_problem(name: str, what: str = "measurement") -> str | None:
    """Reason why `name` may not be a measurement, event class or log component (`what`), None when it may:
    printable, at most 1024 characters, and none of `/`, `\\`, `.`, `*`, `>` or white space (subject tokens,
    path and key characters: see the module docstring)."""
    reason = text_problem(name, what, TAG_VALUE_MAX)
    if reason is not None:
        return reason
    bad = _MEASUREMENT_CHAR.search(name)
    if bad is None:
        return None if name else f"{what} is empty"
    char = bad.group()
    why = (
        "a path separator"
        if char in "/\\"
        else "it splits a NATS subject token, and '..' leaves a directory"
        if char == "."
        else "a NATS subject wildcard"
        if char in "*>"
        else "white space ends a NATS subject token"
    )
    return f"{what} {shown(name)}: character {char!r} at offset {bad.start()} is not allowed ({why})"


def field_key_problem(key: str) -> str | None:
    """Reason why `key` may not be a field key (the rule of a tag key: printable, at most 1024 characters)."""
    return text_problem(key, "field key", TAG_VALUE_MAX)


def fields_problem(fields: dict[str, object]) -> tuple[str, str] | None:
    """`(path, reason)` of the first thing wrong with a line's fields (more than `FIELDS_MAX` of them, or a
    key `field_key_problem` refuses), else None."""
    if len(fields) > FIELDS_MAX:
        return (
            "fields",
            f"{len(fields)} fields in one line, more than {FIELDS_MAX} (the widest real writer sends a few "
            "hundred; each field of a Telegraf line becomes a measurement)",
        )
    for key in fields:
        reason = field_key_problem(key)
        if reason is not None:
            return (f"field {key!r}" if has_control(key) else f"field {key}"), reason
    return None


def job_name_problem(name: str) -> str | None:
    """Reason why `name` is not a job name (printable text, at most `JOB_NAME_MAX`), None when it is one."""
    return text_problem(name, "job name", JOB_NAME_MAX)


def path_component_problem(name: str) -> str | None:
    """Reason why `name` may not become one path component (a file or directory name), None when it may."""
    if name in ("", ".", ".."):
        return f"{shown(name)} is not a file name"
    for char in ("/", "\\", "\x00"):
        if char in name:
            return f"{shown(name)} holds {char!r}, which would make it a path, not one name"
    if ".." in name:
        return f"{shown(name)} contains '..'"
    if len(name.encode("utf-8", "surrogatepass")) > NAME_COMPONENT_MAX:
        return f"{shown(name)} is longer than {NAME_COMPONENT_MAX} bytes, the longest file name"
    return None


def tag_problem(key: str, value: str) -> str | None:
    """Reason why the tag `key=value` is refused (control characters, length, or the rule of a name tag)."""
    if key in HOST_TAGS:
        return host_problem(value)
    if key == "cluster":
        return cluster_problem(value)
    if key == "job":
        return job_id_problem(value)
    if key in DEVICE_TAGS:
        return device_id_problem(value, key)
    return text_problem(key, "tag key", TAG_VALUE_MAX) or text_problem(value, "tag value", TAG_VALUE_MAX)


def tags_problem(measurement: str, tags: dict[str, str], what: str = "measurement") -> tuple[str, str] | None:
    """`(path, reason)` of the first thing wrong with a line's measurement (`measurement_problem`; `what`:
    "event class" or "log component" for those lines) and tags, else None: each tag by `tag_problem`, and the
    host tags must agree (`hostname=n001,host=n002` names two hosts; whichever a reader keys on, one of them
    is forged)."""
    reason = measurement_problem(measurement, what)
    if reason is not None:
        return "measurement", reason
    return tag_set_problem(tags)


def tag_set_problem(tags: dict[str, str]) -> tuple[str, str] | None:
    """`tags_problem` of the tags alone: each tag by `tag_problem`, and the host tags must agree."""
    for key, value in tags.items():
        reason = tag_problem(key, value)
        if reason is not None:
            return (f"tag {key!r}" if has_control(key) else f"tag {key}"), reason
    first = ""
    for key in HOST_TAGS:  # in this order, so the reason reads the same whatever order the tags came in
        if key not in tags:
            continue
        if not first:
            first = key
        elif tags[key] != tags[first]:
            return (
                f"tag {key}",
                f"{first}={shown(tags[first])} and {key}={shown(tags[key])} name two hosts: a line is about one "
                "host (a reader keyed on either tag would see a forged one)",
            )
    return None
