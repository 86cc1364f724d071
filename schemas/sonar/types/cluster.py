"""Partitions and node states of a cluster: the attributes of a `cluster` envelope."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpcbus.schemas.sonar.types.common import SonarStruct
from hpcbus.schemas.sonar.types.scalars import Clustername, NodeRange, NonemptyString, Timestamp


class ClusterPartition(SonarStruct, kw_only=True):
    """A partition: a unique name and some nodes (a node may be in several partitions)."""

    name: NonemptyString
    """Partition name."""
    nodes: list[NodeRange] = []
    """Nodes in the partition."""


class ClusterNodes(SonarStruct, kw_only=True):
    """Managed nodes that share the same state(s)."""

    names: Annotated[list[NodeRange], msgspec.Meta(min_length=1)]
    """The nodes; the spec requires at least one NodeRange."""
    states: list[str] = []
    """The state(s) of the nodes, sinfo's StateComplete split into upper-case words (eg MIXED, DRAIN)."""


class ClusterAttributes(SonarStruct, kw_only=True):
    """Cluster description: partitions and node states."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Clustername = ""
    """The canonical cluster name."""
    slurm: bool = False
    """True if at least some nodes are under Slurm management."""
    partitions: list[ClusterPartition] = []
    """Descriptions of the partitions on the cluster."""
    nodes: list[ClusterNodes] = []
    """Descriptions of the managed nodes on the cluster."""
