"""The card's energy and power through NVML (nvidia-ml-py): the calibration sweep's joules per pass
(``calibration.sweep``), and the benchmarks that ask whether the power cap binds (``benchmarks.pass_energy_gpu``,
``benchmarks.engine_gpu``).

Imports without nvidia-ml-py; ``device_handle`` then raises ImportError (the sweep and ``engine_gpu`` run on without
energy)."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

try:
    import pynvml
except ImportError:  # reported by device_handle, the first call any use of this module makes
    pynvml = None


def device_handle(index: int):
    if pynvml is None:
        raise ImportError("energy figures need nvidia-ml-py (import pynvml)")
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def power_limit_w(handle) -> float:
    """The enforced power limit: the card lowers its clocks to stay under it."""
    return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3


def card_meter(index: int):
    """An ``EnergyMeter`` of card ``index`` with its power limit as ``limit_w``, or None (the reason printed) where
    NVML does not answer: the caller then measures no energy."""
    try:
        handle = device_handle(index)
        meter = EnergyMeter(handle)
        meter.limit_w = power_limit_w(handle)
        return meter
    except Exception as e:  # ImportError, or NVMLError where the driver library is missing
        print(f"no energy figures: {e!r}", flush=True)
        return None


def idle_watts(meter, seconds: float = 1.0) -> float:
    """The card's power with nothing running, over ``seconds`` of an ``EnergyMeter``."""
    torch.cuda.synchronize()
    with meter:
        time.sleep(seconds)
    return meter.joules / seconds


class EnergyMeter:
    """Joules from NVML's energy counter over a ``with`` block, and power (W) and SM clock (MHz) sampled every
    ``period`` s on a thread meanwhile."""

    def __init__(self, handle, period: float = 0.02):
        self.handle, self.period = handle, period

    def __enter__(self) -> EnergyMeter:
        self.power, self.clock, self._stop = [], [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.period):
            self.power.append(pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3)
            self.clock.append(pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM))

    def __exit__(self, *exc) -> None:
        self.joules = (pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self._mj) / 1e3
        self._stop.set()
        self._thread.join()

    def summary(self, seconds: float) -> dict:
        """Joules, mean watts over ``seconds`` (the timed span), and the sampled medians."""
        return {"joules": self.joules, "watts": self.joules / seconds,
                "watts_sampled_median": float(np.median(self.power)) if self.power else None,
                "sm_mhz_median": float(np.median(self.clock)) if self.clock else None}
