"""A node's hardware and software: the attributes of a `sysinfo` envelope (sent daily and at boot)."""

from __future__ import annotations

from hpcbus.schemas.sonar.types.common import SonarStruct
from hpcbus.schemas.sonar.types.scalars import (
    Clustername,
    Hostname,
    NonemptyString,
    NonzeroUint,
    Timestamp,
    Uint,
)


class SysinfoGpuCard(SonarStruct, kw_only=True):
    """Per-card information; string values are card-specific and not all are available on all cards."""

    index: Uint = 0
    """Local card index, may change at boot."""
    uuid: str = ""
    """UUID as reported by card (constructed by the producer if the card has none)."""
    address: str = ""
    """Intra-system card address, eg PCI address."""
    manufacturer: str = ""
    """A keyword: "NVIDIA", "AMD", "Intel" (others TBD)."""
    model: str = ""
    """The manufacturer's model string."""
    architecture: str = ""
    """Card-dependent, for NVIDIA this is "Turing", "Volta" etc."""
    driver: str = ""
    """The manufacturer's driver string."""
    firmware: str = ""
    """The manufacturer's firmware string."""
    memory: Uint = 0
    """GPU memory in kilobytes."""
    power_limit: Uint = 0
    """Power limit in watts."""
    max_power_limit: Uint = 0
    """Max power limit in watts."""
    min_power_limit: Uint = 0
    """Min power limit in watts."""
    max_ce_clock: Uint = 0
    """Max clock of compute element (MHz)."""
    max_memory_clock: Uint = 0
    """Max clock of GPU memory (MHz)."""


class SysinfoSoftwareVersion(SonarStruct, kw_only=True):
    """One software package available on the node (dropped by Sonar in v0.16, still accepted)."""

    key: NonemptyString
    """A unique identifier for the software package."""
    name: str = ""
    """Human-readable name of the software package."""
    version: NonemptyString = ""
    """The package's version number, in some package-specific format (the spec does not require it in words:
    absent is accepted, a present empty string is not)."""


class SysinfoAttributes(SonarStruct, kw_only=True):
    """A node: its CPUs, memory, devices and topology."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Clustername = ""
    """The canonical cluster name."""
    node: Hostname = ""
    """The name of the host as it is known to itself."""
    os_name: NonemptyString = ""
    """Operating system name (the sysname field of struct utsname)."""
    os_release: NonemptyString = ""
    """Operating system version (the release field of struct utsname)."""
    architecture: NonemptyString = ""
    """Architecture name (the machine field of struct utsname). Required by the spec, but Sonar 0.13 did not
    send it (corpus `sonar__newfmt_sysinfo.json` record 1): real data wins, so it may be absent."""
    numa_nodes: Uint = 0
    """Number of NUMA nodes (not in the spec text; Sonar v0.19)."""
    sockets: NonzeroUint = 0
    """Number of CPU sockets."""
    cores_per_socket: NonzeroUint = 0
    """Number of physical cores per socket."""
    threads_per_core: NonzeroUint = 0
    """Number of hyperthreads per physical core."""
    cpu_model: str = ""
    """Manufacturer's model name."""
    memory: NonzeroUint = 0
    """Primary memory in kilobytes."""
    topo_svg: str = ""
    """Base64-encoded SVG output of lstopo."""
    topo_text: str = ""
    """Text output of lstopo (not in the spec text; Sonar v0.18)."""
    cards: list[SysinfoGpuCard] = []
    """Per-card information."""
    software: list[SysinfoSoftwareVersion] = []
    """Per-software-package information (Sonar stopped sending it in v0.16)."""
    distances: list[list[Uint]] = []
    """NUMA distance matrix, one row per NUMA node (not in the spec text; Sonar v0.19)."""
