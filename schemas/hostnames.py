"""One node, one name: the host-name form a site picks for everything that names its nodes on the bus.

Why: Sonar 0.19 names a node by its short host name by default (`hostname-only`), while a node agent may
report the kernel's FQDN; a site running both would see `c1-10` and `c1-10.fox.example.org` as two nodes
(two series in InfluxDB, two hosts in the metric store, samples Jobanalyzer cannot join with job records).
The node agent (`produce node`), the Sonar translator (`consume sonar`, both directions) and the batch-system
producers (`produce slurm`, `produce ocs`: job records, cc-backend's start_job `resources` and node states,
cluster envelopes) therefore take the same setting (`hpcbus.settings.HostnameSettings`) and name every node
through `host_name` / `host_list` / `rename_job` / `rename_hosts`:

- `as-is`: the name as the source gives it;
- `short`: up to the first dot (`c1-10.fox.example.org` -> `c1-10`);
- `domain`: the short name plus `.<domain>` (`c1-10` -> `c1-10.fox.example.org`).

An IPv4 address is left as it is in every form (its first dot is not a domain's).
"""

from __future__ import annotations

import typing
from typing import Literal

import msgspec

HostnameForm = Literal["as-is", "short", "domain"]
FORMS: tuple[str, ...] = typing.get_args(HostnameForm)


def host_name(name: str, form: HostnameForm = "as-is", domain: str = "") -> str:
    """`name` in `form` (see the module docstring); `domain` is used by the `domain` form only."""
    if form == "as-is" or not name or name.replace(".", "").isdigit():
        return name
    short = name.split(".", 1)[0]
    return f"{short}.{domain}" if form == "domain" and domain else short


def host_names(names: tuple[str, ...], form: HostnameForm = "as-is", domain: str = "") -> tuple[str, ...]:
    """Each of `names` in `form`, in their order, each once (two spellings of one node are one node); the
    tuple itself when `form` is `as-is`."""
    if form == "as-is":
        return names
    return tuple(dict.fromkeys(host_name(n, form, domain) for n in names))


def host_list(text: str, form: HostnameForm = "as-is", domain: str = "") -> str:
    """A host list (Sonar's `HostnameRange`, Slurm's `c1-[5-6,8-9],gpu-[10-12].fox`) with each name in `form`:
    names are cut at commas outside brackets, and a name's domain starts at its first dot outside brackets.
    Text that is not a host list (Sonar's `None assigned`) is kept as it is."""
    if form == "as-is" or not text or " " in text:
        return text
    out: list[str] = []
    depth, start, dot = 0, 0, -1
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif depth == 0 and ch == "." and dot < 0:
            dot = i
        elif depth == 0 and ch == ",":
            name = text[start:i]
            out.append(_formed(name, dot - start if dot >= 0 else -1, form, domain))
            start, dot = i + 1, -1
    return ",".join(out)


def _formed(name: str, dot: int, form: HostnameForm, domain: str) -> str:
    if not name or name.replace(".", "").isdigit():
        return name
    short = name if dot < 0 else name[:dot]
    return f"{short}.{domain}" if form == "domain" and domain else short


T = typing.TypeVar("T", bound=msgspec.Struct)


def rename_job(job: T, form: HostnameForm = "as-is", domain: str = "") -> T:
    """A Sonar job record (`SlurmJob`) with its `nodes` (host lists) in `form`; the record itself when
    `form` is `as-is` or it names no nodes."""
    nodes: list[str] | None = getattr(job, "nodes", None)
    if form == "as-is" or not nodes:
        return job
    return msgspec.structs.replace(job, nodes=[host_list(n, form, domain) for n in nodes])


def rename_hosts(env: T, form: HostnameForm = "as-is", domain: str = "") -> T:
    """A Sonar envelope (any kind) with every node name in `form`: a sample's or sysinfo's `node`, each
    error's `node`, a job record's `nodes`, a cluster's partition `nodes` and node `names` (host lists). The
    envelope itself when `form` is `as-is`."""
    if form == "as-is":
        return env
    replace = msgspec.structs.replace
    changes: dict[str, object] = {}
    errors = getattr(env, "errors", None)
    if errors:
        changes["errors"] = [
            replace(e, node=host_name(e.node, form, domain)) if e.node else e for e in errors
        ]
    data = getattr(env, "data", None)
    attributes = getattr(data, "attributes", None)
    if data is not None and attributes is not None:
        a: dict[str, object] = {}
        if getattr(attributes, "node", ""):
            a["node"] = host_name(attributes.node, form, domain)
        if getattr(attributes, "slurm_jobs", None):
            a["slurm_jobs"] = [rename_job(j, form, domain) for j in attributes.slurm_jobs]
        if getattr(attributes, "partitions", None):
            a["partitions"] = [
                replace(p, nodes=[host_list(n, form, domain) for n in p.nodes]) for p in attributes.partitions
            ]
        if getattr(attributes, "nodes", None):
            a["nodes"] = [
                replace(n, names=[host_list(x, form, domain) for x in n.names]) for n in attributes.nodes
            ]
        if a:
            changes["data"] = replace(data, attributes=replace(attributes, **a))
    return replace(env, **changes) if changes else env
