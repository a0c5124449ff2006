"""The energy span reads the run's own GPUs (by PCI bus id), not every GPU of the host."""

import sys
from types import SimpleNamespace

import trtfuse
from trtfuse import gpu_energy


class FakeNvml:
    """NVML with three GPUs whose counters advance by their index + 1 joules per read."""

    def __init__(self):
        self.by_bus = {"0000:18:00.0": 0, "0000:2a:00.0": 1, "0000:3b:00.0": 2}
        self.reads = {0: 0, 1: 0, 2: 0}

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return self.by_bus[bus]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.reads[h] += 1
        return self.reads[h] * (h + 1) * 1000

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == 1  # NVML_CLOCK_SM
        return 1500 + 100 * h

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x4 if h == 2 else 0x1  # GPU 2 held by the power cap, the others idle


def test_the_span_sums_only_the_named_cuda_devices(monkeypatch):
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    # CUDA_VISIBLE_DEVICES=2 makes the host's third GPU CUDA device 0 (no GPU here: a stand-in cuda_runtime)
    cuda = SimpleNamespace(pci_bus_id=lambda d: ["0000:3b:00.0"][d])
    monkeypatch.setitem(sys.modules, "trtfuse.cuda_runtime", cuda)
    monkeypatch.setattr(trtfuse, "cuda_runtime", cuda, raising=False)
    with gpu_energy.EnergySpan([0], sample_s=0) as span:
        pass
    out = span.result(samples=300)
    assert out["gpus"] == 1 and out["joules"] == 3.0  # GPU 2 alone: 3 J between its two reads
    assert nvml.reads == {0: 0, 1: 0, 2: 2} and "sm_clock_mhz" not in out
    with gpu_energy.EnergySpan(sample_s=0) as every:  # none named: every GPU NVML sees
        pass
    assert every.result(samples=1)["gpus"] == 3


def test_the_span_samples_the_sm_clock_and_the_power_cap_of_its_gpus(monkeypatch):
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cuda = SimpleNamespace(pci_bus_id=lambda d: ["0000:3b:00.0", "0000:18:00.0"][d])
    monkeypatch.setitem(sys.modules, "trtfuse.cuda_runtime", cuda)
    monkeypatch.setattr(trtfuse, "cuda_runtime", cuda, raising=False)
    # the sampling thread's step, taken here (sample_s=0: no thread), so that nothing depends on the clock
    with gpu_energy.EnergySpan([0, 1], sample_s=0) as span:
        assert span.sample() and span.sample() and span.sample()
    out = span.result(samples=1)
    assert out["sm_clock_mhz"] == 1600  # GPUs 2 and 0: 1700 and 1500 MHz
    assert out["power_capped_fraction"] == 1.0 and out["clock_samples"] == 3  # GPU 2 capped in every sample
    with gpu_energy.EnergySpan([1], sample_s=0) as alone:
        assert alone.sample()
    assert alone.result(samples=1)["power_capped_fraction"] == 0.0
    def not_supported(*_):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml.nvmlDeviceGetClockInfo = not_supported  # a driver without the query: no sample, nothing said of clocks
    with gpu_energy.EnergySpan([1], sample_s=0) as old:
        assert not old.sample()
    assert "sm_clock_mhz" not in old.result(samples=1)


def test_only_tensorrt_runs_measure_energy():
    assert gpu_energy.gpus(SimpleNamespace(name="onnxruntime"), {}) == (None, False)
