"""Pure parsers of Slurm command output (sacct, squeue, sinfo) and builders of what we derive from them.

Nothing here runs a command: the Slurm producer runs `sacct`/`squeue`/`sinfo` and hands the text to these
modules, so every quirk of the text formats can be tested against captured output without a Slurm.
"""
