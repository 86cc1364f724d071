"""NVML GPU reader through a fake `pynvml` with the real call signatures and the real error classes."""

import logging
from types import SimpleNamespace

import pytest

from hpcbus.producers.node.gpu_nvml import NvmlGpuReader, _import_pynvml

REAL = _import_pynvml()  # only for its constants and NVMLError classes; no driver needed


class Card:
    def __init__(self, index, unsupported=(), lost=False, **values):
        self.index = index
        self.unsupported = set(unsupported)
        self.lost = lost
        self.v = {
            "uuid": f"GPU-0000000{index}-926f-e54f-9828-ad1d8680469a",
            "bus": f"00000000:{0x18 + index:02X}:00.0",
            "name": "NVIDIA GeForce RTX 2080 Ti",
            "util": (48, 17),
            "mem": (11811160064, 9731768320),
            "temp": 75,
            "power_mw": 208500,
            "limit_mw": 250000,
            "constraints_mw": [100000, 280000],
            "clocks": {1: 1815, 2: 7000},
            "max_clocks": {1: 2100, 2: 7000},
            "fan": 42,
            "pstate": 2,
            "mode": 0,
            "energy_mj": 123456789,
            "arch": REAL.NVML_DEVICE_ARCH_TURING,
            "vbios": "90.02.0B.00.C7",
            "compute": [SimpleNamespace(pid=2010, usedGpuMemory=9050112 * 1024)],
            "graphics": [],
            "samples": [
                SimpleNamespace(pid=2010, timeStamp=1000, smUtil=40, memUtil=10, encUtil=0, decUtil=0),
                SimpleNamespace(pid=2010, timeStamp=2000, smUtil=60, memUtil=14, encUtil=0, decUtil=0),
            ],
        }
        self.v.update(values)


class FakeNvml:
    """Same function names and argument lists as pynvml (nvidia-ml-py 13)."""

    def __init__(self, cards=(), init_error=None, driver="560.35.03", cuda=12060):
        for k in dir(REAL):
            if k.startswith(("NVML_", "NVMLError")):
                setattr(self, k, getattr(REAL, k))
        self.cards = list(cards)
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.init_calls = 0
        self.shutdown_calls = 0
        self.since: list[int] = []

    def _get(self, handle, fn, key):
        if handle.lost:
            raise REAL.NVMLError_GpuIsLost()
        if fn in handle.unsupported:
            raise REAL.NVMLError_NotSupported()
        return handle.v[key]

    def nvmlInit(self):
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index):
        card = self.cards[index]
        if card is None:
            raise REAL.NVMLError_Unknown()
        return card

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetUUID(self, handle):
        return self._get(handle, "uuid", "uuid")

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=self._get(handle, "pci", "bus"), domain=0, bus=0x18, device=0)

    def nvmlDeviceGetName(self, handle):
        return self._get(handle, "name", "name")

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu, memory = self._get(handle, "util", "util")
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        total, used = self._get(handle, "mem", "mem")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        if sensor != REAL.NVML_TEMPERATURE_GPU:
            raise REAL.NVMLError_InvalidArgument()
        return self._get(handle, "temp", "temp")

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._get(handle, "power", "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._get(handle, "limit", "limit_mw")

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return self._get(handle, "limit", "limit_mw")

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle):
        return self._get(handle, "constraints", "constraints_mw")

    def nvmlDeviceGetClockInfo(self, handle, type):
        if type not in (REAL.NVML_CLOCK_SM, REAL.NVML_CLOCK_MEM):
            raise REAL.NVMLError_InvalidArgument()
        return self._get(handle, "clock", "clocks")[type]

    def nvmlDeviceGetMaxClockInfo(self, handle, type):
        return self._get(handle, "maxclock", "max_clocks")[type]

    def nvmlDeviceGetFanSpeed(self, handle):
        return self._get(handle, "fan", "fan")

    def nvmlDeviceGetPerformanceState(self, handle):
        return self._get(handle, "pstate", "pstate")

    def nvmlDeviceGetComputeMode(self, handle):
        return self._get(handle, "mode", "mode")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._get(handle, "energy", "energy_mj")

    def nvmlDeviceGetArchitecture(self, device):
        return self._get(device, "arch", "arch")

    def nvmlDeviceGetVbiosVersion(self, handle):
        return self._get(handle, "vbios", "vbios")

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._get(handle, "procs", "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._get(handle, "procs", "graphics")

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):
        self.since.append(timeStamp)
        samples = self._get(handle, "putil", "samples")
        if not samples:
            raise REAL.NVMLError_NotFound()
        return samples


def test_normal_cards():
    fake = FakeNvml([Card(0), Card(1, compute=[], samples=[], pstate=32)])
    reader = NvmlGpuReader(fake)
    g0, g1 = reader.read(since_us=1700000000000000)
    assert fake.since == [1700000000000000, 1700000000000000]
    assert (g0.index, g0.uuid, g0.bus_id, g0.failing) == (
        0,
        "GPU-00000000-926f-e54f-9828-ad1d8680469a",
        "00000000:18:00.0",
        0,
    )
    assert g0.name == "NVIDIA GeForce RTX 2080 Ti"
    assert (g0.ce_util_percent, g0.memory_util_percent, g0.temperature_c, g0.fan_percent) == (48, 17, 75, 42)
    assert g0.memory_used_kib == 9731768320 // 1024 and g0.memory_total_kib == 11811160064 // 1024
    assert (g0.power_w, g0.power_limit_w, g0.energy_j) == (208.5, 250.0, 123456.789)
    assert (g0.ce_clock_mhz, g0.memory_clock_mhz) == (1815, 7000)
    assert (g0.performance_state, g0.compute_mode) == (2, "Default")
    (p,) = g0.processes
    assert (p.pid, p.memory_kib, p.sm_util, p.mem_util, p.kind) == (
        2010,
        9050112,
        60,
        14,
        "compute",
    )  # newest sample
    assert g1.processes == [] and g1.performance_state is None  # NVML_PSTATE_UNKNOWN
    assert fake.init_calls == 1
    reader.read()
    assert fake.init_calls == 1  # initialised once
    reader.close()
    assert fake.shutdown_calls == 1


def test_cards_for_sysinfo():
    (card,) = NvmlGpuReader(FakeNvml([Card(0)])).read_cards()
    assert (card.address, card.manufacturer, card.model, card.architecture) == (
        "00000000:18:00.0",
        "NVIDIA",
        "NVIDIA GeForce RTX 2080 Ti",
        "Turing",
    )
    assert (card.driver, card.cuda_version, card.vbios) == ("560.35.03", "12.6", "90.02.0B.00.C7")
    assert card.memory_kib == 11811160064 // 1024
    assert (card.power_limit_w, card.min_power_limit_w, card.max_power_limit_w) == (250.0, 100.0, 280.0)
    assert (card.max_ce_clock_mhz, card.max_memory_clock_mhz) == (2100, 7000)


def test_not_supported_fields_stay_unset():
    unsupported = {"fan", "energy", "temp", "putil", "power", "mode", "pstate", "procs"}
    (g,) = NvmlGpuReader(FakeNvml([Card(0, unsupported=unsupported)])).read()
    assert (g.fan_percent, g.energy_j, g.temperature_c, g.power_w) == (None, None, None, None)
    assert (g.compute_mode, g.performance_state, g.processes) == (None, None, [])
    assert g.failing == 0 and g.ce_util_percent == 48
    (card,) = NvmlGpuReader(FakeNvml([Card(0, unsupported={"limit", "constraints", "arch"})])).read_cards()
    assert (card.power_limit_w, card.max_power_limit_w, card.architecture) == (None, None, "")


def test_lost_card_and_missing_handle_are_failing_not_dropped():
    readings = NvmlGpuReader(FakeNvml([Card(0, lost=True), None, Card(2)])).read()
    assert [(g.index, g.failing) for g in readings] == [(0, 1), (1, 1), (2, 0)]
    assert readings[0].uuid == "" and readings[0].power_w is None


def test_library_not_found_logs_once_and_retries_silently(caplog):
    now = [1000.0]
    fake = FakeNvml(init_error=REAL.NVMLError_LibraryNotFound())
    reader = NvmlGpuReader(fake, retry_s=600.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="hpcbus.producers.node.gpu_nvml"):
        assert reader.read() == []
        assert reader.read() == []
        assert fake.init_calls == 1  # not retried before retry_s
        now[0] += 601
        assert reader.read() == []
        assert fake.init_calls == 2
    info = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(info) == 1
    assert "NVML Shared Library Not Found" in info[0].getMessage()
    assert reader.read_cards() == []
    # the driver appears later: picked up on the next retry
    fake.init_error = None
    fake.cards = [Card(0)]
    now[0] += 601
    assert [g.index for g in reader.read()] == [0]


def test_zero_cards(caplog):
    fake = FakeNvml([])
    with caplog.at_level(logging.INFO, logger="hpcbus.producers.node.gpu_nvml"):
        reader = NvmlGpuReader(fake)
        assert reader.read() == [] and reader.read() == []
    assert len(caplog.records) == 1 and "no GPU" in caplog.records[0].getMessage()
    assert fake.shutdown_calls == 1 and not reader.available


def test_driver_not_loaded():
    reader = NvmlGpuReader(FakeNvml([Card(0)], init_error=REAL.NVMLError_DriverNotLoaded()))
    assert reader.read() == []
    assert "Driver Not Loaded" in reader.unavailable_reason


@pytest.mark.parametrize("bad", [0xFFFFFFFF, 101])
def test_out_of_range_process_percentages_are_unknown(bad):
    samples = [SimpleNamespace(pid=7, timeStamp=1, smUtil=bad, memUtil=3, encUtil=0, decUtil=0)]
    (g,) = NvmlGpuReader(FakeNvml([Card(0, compute=[], samples=samples)])).read()
    (p,) = g.processes
    assert (p.pid, p.sm_util, p.mem_util, p.memory_kib) == (7, None, 3, None)
