"""Where the shared reference corpus lives; tests read it in place (never copied into the repo)."""

from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CORPUS = SHARED / "corpus"
SPEC = SHARED / "spec"
SLURM_CORPUS = CORPUS / "slurm"

HB_JOBINFO_FIELDS = [
    "JobID",
    "JobName",
    "User",
    "Partition",
    "NodeList",
    "NNodes",
    "NCPUs",
    "NTasks",
    "State",
    "Submit",
    "Start",
    "End",
    "Timelimit",
    "Elapsed",
    "TotalCPU",
    "CPUTime",
    "UserCPU",
    "SystemCPU",
    "ReqMem",
    "MaxRSS",
    "MaxVMSize",
    "ReqTRES",
    "AllocTRES",
    "TRESUsageInMax",
    "TRESUsageInTot",
    "TRESUsageOutTot",
    "MaxDiskRead",
    "MaxDiskWrite",
    "MaxRSSNode",
    "MaxRSSTask",
    "MaxVMSizeNode",
    "MaxVMSizeTask",
    "MaxDiskReadNode",
    "MaxDiskReadTask",
    "MaxDiskWriteNode",
    "MaxDiskWriteTask",
    "Comment",
]
"""The `--format` of hb-jobinfo's capture (corpus PROVENANCE.md), `☃`-delimited with a trailing delimiter."""
