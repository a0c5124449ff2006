"""The GPUs' energy over a span, from NVML's total-energy counter (nvidia-ml-py), and their SM clock and power
capping sampled over it.

This is the GPU's own counter (board power as the driver integrates it, in mJ), not MLPerf Power's
external analyzer at the wall: reports say so. Where NVML or the counter is missing (no GPU, an old
driver, the null engine on a CPU) the span reads as None and nothing else changes.

The clock samples say whether a rate was set by the power limit: at the 700 W cap the driver lowers the SM clock
(the software power-cap clock reason), and two engines that draw different power on different data then run at
different clocks.
"""

from __future__ import annotations

import threading
import time

NOTE = "the GPUs' own energy counter (NVML), not an MLPerf Power measurement at the wall"
SW_POWER_CAP = 0x4   # nvmlClocksThrottleReasonSwPowerCap (nvmlClocksEventReasonSwPowerCap): the clock held for power
NVML_CLOCK_SM = 1
SAMPLE_S = 1.0   # one short NVML query a second: no noticeable load on a LoadGen run's host


class EnergySpan:
    """``with EnergySpan(cuda_devices) as span: ...`` then ``span.result(samples)``: the energy of the run's
    GPUs (CUDA device numbers, as the run names them), not of every GPU of the host."""

    def __init__(self, cuda_devices: list[int] | None = None, on: bool = True, sample_s: float = SAMPLE_S):
        self._devices, self._on = cuda_devices, on
        self._nvml = None
        self._handles: list = []
        self._start_mj: list[int] = []
        self._t0 = self._t1 = 0.0
        self._end_mj: list[int] = []
        self._sample_s = sample_s
        self._samples: list[tuple[float, bool]] = []   # (mean SM clock over the GPUs in MHz, any GPU power capped)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def __enter__(self):
        self._t0 = time.perf_counter()
        if not self._on:
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = _handles(pynvml, self._devices)
            self._start_mj = [pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVML, no GPU, no counter: the span has no energy
            self._nvml = None
        if self._nvml is not None and self._sample_s > 0:
            self._sampler = threading.Thread(target=self._sample_clocks, name="trtfuse-gpu-clocks", daemon=True)
            self._sampler.start()
        self._t0 = time.perf_counter()
        return self

    def _sample_clocks(self) -> None:
        while not self._stop.wait(self._sample_s) and self.sample():
            pass

    def sample(self) -> bool:
        """One sample of the GPUs' mean SM clock and whether the power cap holds any of them; False where the driver
        lacks these queries (then no more are taken)."""
        nvml = self._nvml
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        try:
            mhz = [nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM) for h in self._handles]
            capped = bool(reasons) and any(reasons(h) & SW_POWER_CAP for h in self._handles)
        except Exception:  # noqa: BLE001 - a driver without these queries: no clock samples
            return False
        self._samples.append((sum(mhz) / len(mhz), capped))
        return True

    def __exit__(self, *exc):
        self._t1 = time.perf_counter()
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
        if self._nvml is not None:
            try:
                self._end_mj = [self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
            except Exception:  # noqa: BLE001
                self._end_mj = []
            finally:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # noqa: BLE001
                    pass

    def result(self, samples: int) -> dict | None:
        """Joules, average watts and samples per joule over the span (None without a counter)."""
        if not self._end_mj or len(self._end_mj) != len(self._start_mj):
            return None
        joules = sum(e - s for s, e in zip(self._start_mj, self._end_mj)) / 1000.0
        seconds = self._t1 - self._t0
        if joules <= 0 or seconds <= 0:
            return None
        out = {"joules": round(joules, 1), "seconds": round(seconds, 3), "avg_watts": round(joules / seconds, 1),
               "samples_per_joule": round(samples / joules, 2), "gpus": len(self._start_mj), "source": NOTE}
        if self._samples:   # the clock over the span, and how much of it the power limit held it
            out["sm_clock_mhz"] = round(sum(m for m, _ in self._samples) / len(self._samples))
            out["power_capped_fraction"] = round(sum(c for _, c in self._samples) / len(self._samples), 3)
            out["clock_samples"] = len(self._samples)
        return out


def _handles(pynvml, cuda_devices: list[int] | None) -> list:
    """NVML's handles of the CUDA devices (by PCI bus id: NVML numbers GPUs its own way and ignores
    CUDA_VISIBLE_DEVICES); every GPU NVML sees when none are named."""
    if not cuda_devices:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    from trtfuse import cuda_runtime

    return [pynvml.nvmlDeviceGetHandleByPciBusId(cuda_runtime.pci_bus_id(d)) for d in cuda_devices]


def gpus(runner, settings: dict) -> tuple[list[int] | None, bool]:
    """EnergySpan's arguments for a run: a TensorRT run's GPUs (``tensorrt.devices``); off for other backends."""
    if runner.name != "tensorrt":
        return None, False
    from trtfuse import cuda_runtime
    from trtfuse.backends.tensorrt_backend import parse_devices

    return parse_devices(settings["tensorrt"]["devices"], cuda_runtime.device_count()), True
