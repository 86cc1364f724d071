"""Producers: what `hpcbus produce <name>` (and `hpcbus pub`) run, one folder per command, each with a README.

They read the node (/proc, /sys, NVML), the batch system (sacct/squeue/sinfo, the OCS accounting file) or a
person's input, and publish line protocol on the bus through the outbox (`hpcbus.outbox`).
"""
