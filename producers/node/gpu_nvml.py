"""NVIDIA GPUs through NVML (pynvml from the nvidia-ml-py package), per card and per process.

Written against the real pynvml call signatures; the module is a constructor parameter so tests pass a
fake with the same functions and the real `NVMLError` classes. Rules that keep a node agent alive:

- Every NVML call is guarded. `NVMLError_NotSupported`, `NoPermission` and friends leave that one field
  None; a card whose handle or UUID cannot be had, or that reports `GpuIsLost`, is reported with
  `failing = 1` (Sonar's "generic failure") instead of disappearing.
- No pynvml module, no libnvidia-ml, no driver, or zero cards: no GPU readings and exactly one log line
  (INFO), then nothing more. Initialisation is retried every `retry_s` silently, so a driver loaded
  after boot is picked up.

Units are NVML's where they are natural (percent, degrees C, MHz) and converted where they are not:
milliwatts -> watts, bytes -> KiB, millijoules -> joules.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import warnings
from collections.abc import Callable
from typing import Any, Literal

import msgspec

log = logging.getLogger(__name__)

_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_PSTATE_UNKNOWN = 32


class GpuProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A process using a card, from NVML's running-process lists and process utilisation samples."""

    pid: int
    memory_kib: int | None = None
    """GPU memory used by the process, KiB; None when NVML does not know (e.g. MIG without privileges)."""
    sm_util: int | None = None
    """Share of the card's SMs the process used in the last sampling window, percent."""
    mem_util: int | None = None
    """Share of the memory controller the process used in the last sampling window, percent."""
    kind: str = "compute"
    """`compute` or `graphics` context (a process can appear in both; then it is listed once, compute)."""


class GpuReading(msgspec.Struct, kw_only=True):
    """One card at one time (Sonar `SampleGpu`; ClusterCockpit nvidia collector). None = not available."""

    index: int
    """NVML index on this node (may change at boot; `uuid` does not)."""
    uuid: str = ""
    """The card's id on the bus (Sonar `uuid`, accelerator `type-id`, job events' `accelerators`): the
    NVML UUID, or the PCI bus id when the reader was made with `type_id="pci"` (and the bus id is known)."""
    nvml_uuid: str = ""
    """NVML's UUID whatever `uuid` holds ("" when NVML would not tell)."""
    bus_id: str = ""
    """PCI bus id in cc-metric-collector's spelling (`pci_bus_id`), e.g. `00000000:49:00.0`."""
    name: str | None = None
    failing: int = 0
    """0 when the card answered, 1 when it did not (handle, UUID or 'GPU is lost' errors)."""
    fan_percent: int | None = None
    """Primary fan speed, percent of maximum (can exceed 100)."""
    compute_mode: str | None = None
    """`Default`, `Exclusive_Process`, `Prohibited` (or `Exclusive_Thread` on old drivers)."""
    performance_state: int | None = None
    """P-state 0 (fastest) .. 15; None when unknown. (Sonar's JSON adds 1.)"""
    memory_total_kib: int | None = None
    memory_used_kib: int | None = None
    """Framebuffer memory in use, KiB (Sonar `memory`)."""
    ce_util_percent: int | None = None
    """Percent of the last sample period in which a kernel ran (`nv_util`, Sonar `ce_util`)."""
    memory_util_percent: int | None = None
    """Percent of the last sample period in which device memory was read or written (`nv_mem_util`)."""
    temperature_c: int | None = None
    """Core temperature, degrees Celsius."""
    power_w: float | None = None
    """Current board power draw, watts (NVML mW / 1000)."""
    power_limit_w: float | None = None
    """Enforced power limit, watts."""
    ce_clock_mhz: int | None = None
    """Current SM clock, MHz."""
    memory_clock_mhz: int | None = None
    """Current memory clock, MHz."""
    energy_j: float | None = None
    """Energy since driver load, joules (Volta and newer)."""
    processes: list[GpuProcess] = msgspec.field(default_factory=list)


class GpuCard(msgspec.Struct, frozen=True, kw_only=True):
    """Static description of a card for sysinfo (Sonar `SysinfoGpuCard`)."""

    index: int
    uuid: str = ""
    address: str = ""
    """PCI bus id."""
    manufacturer: str = "NVIDIA"
    model: str = ""
    architecture: str = ""
    """e.g. `Turing`, `Ampere`, `Hopper` (from nvmlDeviceGetArchitecture)."""
    driver: str = ""
    """Driver version, e.g. `560.35.03`."""
    cuda_version: str = ""
    """Highest CUDA version the driver supports, e.g. `12.6` (what Sonar puts in `firmware`)."""
    vbios: str = ""
    """Video BIOS version of the card."""
    memory_kib: int | None = None
    power_limit_w: float | None = None
    min_power_limit_w: float | None = None
    max_power_limit_w: float | None = None
    max_ce_clock_mhz: int | None = None
    max_memory_clock_mhz: int | None = None


def _import_pynvml() -> Any:
    """The real module. The deprecated `pynvml` wrapper package warns on import; that is not ours to fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pynvml

    return pynvml


_BUS_ID = re.compile(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.[0-7]")


def pci_bus_id(bus_id: str) -> str:
    """NVML's bus id as cc-metric-collector writes its type-id (`%08X:%02X:%02X.0` of domain, bus, device).

    NVML's `busId` normally has that form already; the legacy 4-digit domain (`busIdLegacy`, old drivers)
    and lower-case hex are normalised so the same card gets the same id from both programs. Anything else
    is returned stripped and upper-cased.
    """
    text = bus_id.strip().rstrip("\x00")
    m = _BUS_ID.fullmatch(text)
    if m is None:
        return text.upper()
    domain, bus, device = (int(g, 16) for g in m.groups())
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


class NvmlGpuReader:
    """Reads NVIDIA cards through `nvml` (default: `import pynvml` on first use).

    `read(since_us)` takes the time of the previous sample (microseconds since the epoch; 0 = none) for
    per-process utilisation samples.
    """

    def __init__(
        self,
        nvml: Any = None,
        retry_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        type_id: Literal["uuid", "pci"] = "uuid",
    ):
        self._module = nvml
        self.type_id = type_id
        """What `GpuReading.uuid` holds (`NodeCollectorConfig.gpu_type_id` says why one or the other)."""
        self.nvml: Any = None
        self.retry_s = retry_s
        self.clock = clock
        self._handles: list[Any] | None = None
        self._failed_at: float | None = None
        self._announced = False
        self.unavailable_reason = ""
        """Why there are no GPU readings ("" when NVML works); for diagnostics."""

    # -- set-up ---------------------------------------------------------------------------------------

    def _off(self, reason: str) -> None:
        self._handles = None
        self._failed_at = self.clock()
        self.unavailable_reason = reason
        if not self._announced:
            log.info("no NVIDIA GPU readings: %s", reason)
            self._announced = True
        else:
            log.debug("NVML still unavailable: %s", reason)

    def _ensure(self) -> bool:
        if self._handles is not None:
            return True
        if self._failed_at is not None and self.clock() - self._failed_at < self.retry_s:
            return False
        if self.nvml is None:
            try:
                self.nvml = self._module if self._module is not None else _import_pynvml()
            except ImportError as exc:
                self._off(f"pynvml not importable ({exc})")
                return False
        nvml = self.nvml
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._off(f"NVML: {exc}")
            return False
        except OSError as exc:
            self._off(f"NVML: {exc}")
            return False
        if count == 0:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()  # balance nvmlInit: the retry will initialise again
            self._off("NVML found no GPU")
            return False
        handles: list[Any] = []
        for i in range(count):
            try:
                handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
            except nvml.NVMLError:
                handles.append(None)
        self._handles = handles
        self._failed_at = None
        self.unavailable_reason = ""
        return True

    def close(self) -> None:
        """Release NVML (nvmlShutdown); harmless when it was never initialised."""
        if self._handles is not None and self.nvml is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
        self._handles = None

    @property
    def available(self) -> bool:
        """True when NVML is initialised with at least one card (tries to initialise if due)."""
        return self._ensure()

    # -- guarded calls --------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any, lost: list[bool] | None = None) -> Any:
        """`nvml.<name>(*args)`, or None on any NVML error (the field is then unset). 'GPU is lost' and
        'unknown' errors mark the card as failing via `lost`."""
        nvml = self.nvml
        fn = getattr(nvml, name, None)
        if fn is None:
            return None  # older binding without this function
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if lost is not None and type(exc).__name__ in ("NVMLError_GpuIsLost", "NVMLError_Unknown"):
                lost[0] = True
            return None

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self.nvml, name, default))

    # -- readings -------------------------------------------------------------------------------------

    def read(self, since_us: int = 0) -> list[GpuReading]:
        if not self._ensure():
            return []
        assert self._handles is not None
        return [self._read_card(i, h, since_us) for i, h in enumerate(self._handles)]

    def _read_card(self, index: int, h: Any, since_us: int) -> GpuReading:
        if h is None:
            return GpuReading(index=index, failing=1)
        lost = [False]
        c = self._call
        uuid = c("nvmlDeviceGetUUID", h, lost=lost)
        pci = c("nvmlDeviceGetPciInfo", h, lost=lost)
        util = c("nvmlDeviceGetUtilizationRates", h, lost=lost)
        mem = c("nvmlDeviceGetMemoryInfo", h, lost=lost)
        power = c("nvmlDeviceGetPowerUsage", h, lost=lost)
        limit = c("nvmlDeviceGetEnforcedPowerLimit", h, lost=lost)
        pstate = c("nvmlDeviceGetPerformanceState", h, lost=lost)
        mode = c("nvmlDeviceGetComputeMode", h, lost=lost)
        energy = c("nvmlDeviceGetTotalEnergyConsumption", h, lost=lost)
        nvml_uuid = _text(uuid) if uuid is not None else ""
        bus_id = pci_bus_id(_text(pci.busId)) if pci is not None else ""
        reading = GpuReading(
            index=index,
            uuid=(bus_id or nvml_uuid) if self.type_id == "pci" else nvml_uuid,
            nvml_uuid=nvml_uuid,
            bus_id=bus_id,
            name=_opt_text(c("nvmlDeviceGetName", h, lost=lost)),
            fan_percent=_opt_int(c("nvmlDeviceGetFanSpeed", h, lost=lost)),
            compute_mode=None if mode is None else _COMPUTE_MODES.get(int(mode), str(mode)),
            performance_state=None if pstate is None or int(pstate) >= _PSTATE_UNKNOWN else int(pstate),
            memory_total_kib=None if mem is None else int(mem.total) // 1024,
            memory_used_kib=None if mem is None else int(mem.used) // 1024,
            ce_util_percent=None if util is None else int(util.gpu),
            memory_util_percent=None if util is None else int(util.memory),
            temperature_c=_opt_int(
                c("nvmlDeviceGetTemperature", h, self._const("NVML_TEMPERATURE_GPU", 0), lost=lost)
            ),
            power_w=None if power is None else int(power) / 1000.0,
            power_limit_w=None if limit is None else int(limit) / 1000.0,
            ce_clock_mhz=_opt_int(c("nvmlDeviceGetClockInfo", h, self._const("NVML_CLOCK_SM", 1), lost=lost)),
            memory_clock_mhz=_opt_int(
                c("nvmlDeviceGetClockInfo", h, self._const("NVML_CLOCK_MEM", 2), lost=lost)
            ),
            energy_j=None if energy is None else int(energy) / 1000.0,
            processes=self._processes(h, since_us),
        )
        if lost[0] or uuid is None:
            reading.failing = 1
        return reading

    def _processes(self, h: Any, since_us: int) -> list[GpuProcess]:
        mem: dict[int, tuple[int | None, str]] = {}
        for fn, kind in (
            ("nvmlDeviceGetGraphicsRunningProcesses", "graphics"),
            ("nvmlDeviceGetComputeRunningProcesses", "compute"),
        ):
            for p in self._call(fn, h) or []:
                used = getattr(p, "usedGpuMemory", None)
                mem[int(p.pid)] = (None if used is None else int(used) // 1024, kind)
        util: dict[int, tuple[int, int | None, int | None]] = {}
        for s in self._call("nvmlDeviceGetProcessUtilization", h, since_us) or []:
            pid, stamp = int(s.pid), int(s.timeStamp)
            if pid in util and util[pid][0] > stamp:
                continue
            util[pid] = (stamp, _pct(s.smUtil), _pct(s.memUtil))
        out: list[GpuProcess] = []
        for pid in sorted(set(mem) | set(util)):
            m, kind = mem.get(pid, (None, "compute"))
            _, sm, mu = util.get(pid, (0, None, None))
            out.append(GpuProcess(pid=pid, memory_kib=m, sm_util=sm, mem_util=mu, kind=kind))
        return out

    def read_cards(self) -> list[GpuCard]:
        """Static card descriptions for sysinfo; [] without NVML or cards."""
        if not self._ensure():
            return []
        assert self._handles is not None
        c = self._call
        driver = _opt_text(c("nvmlSystemGetDriverVersion")) or ""
        cuda = c("nvmlSystemGetCudaDriverVersion")
        cuda_version = "" if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        arch_names = {
            int(getattr(self.nvml, k)): k.removeprefix("NVML_DEVICE_ARCH_").capitalize()
            for k in dir(self.nvml)
            if k.startswith("NVML_DEVICE_ARCH_") and k != "NVML_DEVICE_ARCH_UNKNOWN"
        }
        cards: list[GpuCard] = []
        for index, h in enumerate(self._handles):
            if h is None:
                cards.append(GpuCard(index=index, driver=driver, cuda_version=cuda_version))
                continue
            pci = c("nvmlDeviceGetPciInfo", h)
            mem = c("nvmlDeviceGetMemoryInfo", h)
            arch = c("nvmlDeviceGetArchitecture", h)
            limit = c("nvmlDeviceGetEnforcedPowerLimit", h)
            if limit is None:
                limit = c("nvmlDeviceGetPowerManagementLimit", h)
            constraints = c("nvmlDeviceGetPowerManagementLimitConstraints", h)
            lo, hi = (None, None) if not constraints else (constraints[0], constraints[1])
            cards.append(
                GpuCard(
                    index=index,
                    uuid=_opt_text(c("nvmlDeviceGetUUID", h)) or "",
                    address=_text(pci.busId) if pci is not None else "",
                    model=_opt_text(c("nvmlDeviceGetName", h)) or "",
                    architecture="" if arch is None else arch_names.get(int(arch), "Unknown"),
                    driver=driver,
                    cuda_version=cuda_version,
                    vbios=_opt_text(c("nvmlDeviceGetVbiosVersion", h)) or "",
                    memory_kib=None if mem is None else int(mem.total) // 1024,
                    power_limit_w=None if limit is None else int(limit) / 1000.0,
                    min_power_limit_w=None if lo is None else int(lo) / 1000.0,
                    max_power_limit_w=None if hi is None else int(hi) / 1000.0,
                    max_ce_clock_mhz=_opt_int(
                        c("nvmlDeviceGetMaxClockInfo", h, self._const("NVML_CLOCK_SM", 1))
                    ),
                    max_memory_clock_mhz=_opt_int(
                        c("nvmlDeviceGetMaxClockInfo", h, self._const("NVML_CLOCK_MEM", 2))
                    ),
                )
            )
        return cards


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_text(v: Any) -> str | None:
    return None if v is None else _text(v)


def _pct(v: Any) -> int | None:
    """Per-process percentages; NVML uses 0xFFFFFFFF (and other out-of-range values) for 'unknown'."""
    n = int(v)
    return n if 0 <= n <= 100 else None
