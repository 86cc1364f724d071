"""`hpcbus produce node`, collection half: readers that turn /proc, /sys and NVML into typed readings.

One module per family (cpu, memory, load, net, disk, processes, jobs, energy, cpufreq, infiniband,
lustre, gpu_nvml, sysinfo); `collector.NodeCollector` runs them every interval and returns one
`NodeSample`. Every reader takes a `root` under which `/proc` and `/sys` are found, so tests run them
against fixture trees. Readings are `msgspec.Struct`s in natural units documented on each field;
naming them as metrics (docs/mapping.md) and publishing them are other modules' jobs.
"""

from hpcbus.producers.node.collector import NodeCollector, NodeCollectorConfig, NodeSample

__all__ = ["NodeCollector", "NodeCollectorConfig", "NodeSample"]
