"""What the machine is: CPU, memory, OS, GPUs, and the software stack, for an MLPerf system description.

Every probe is guarded: a missing tool or file gives "unknown" (or "none" / 0 where the thing is
known to be absent, e.g. no ``nvidia-smi``), never an exception. ``probe()`` returns the raw facts;
``system_description()`` turns them into the fields of MLPerf Inference's ``systems/<system>.json``.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

UNKNOWN = "unknown"
NONE = "none"
NVIDIA_SMI_TIMEOUT_S = 20

# MLPerf Inference's systems/<system>.json: the fields its submission checker requires, then the
# ones it wants filled with something meaningful (both lists as of the v4.x-v6.x checkers).
REQUIRED_FIELDS = (
    "division", "submitter", "status", "system_name", "number_of_nodes", "host_processor_model_name",
    "host_processors_per_node", "host_processor_core_count", "host_memory_capacity",
    "host_storage_capacity", "host_storage_type", "accelerators_per_node", "accelerator_model_name",
    "accelerator_memory_capacity", "framework", "operating_system",
)
MORE_FIELDS = (
    "system_type", "system_type_detail", "other_software_stack", "host_processor_frequency",
    "host_processor_caches", "host_processor_interconnect", "host_memory_configuration",
    "host_networking", "host_network_card_count", "host_networking_topology",
    "accelerator_frequency", "accelerator_host_interconnect", "accelerator_interconnect",
    "accelerator_interconnect_topology", "accelerator_memory_configuration",
    "accelerator_on-chip_memories", "cooling", "hw_notes", "sw_notes",
)


def _guarded(default):
    """The probe's result, or ``default`` when it raises anything at all."""
    def wrap(fn):
        @functools.wraps(fn)
        def probe(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a probe never takes the command down
                return default
        return probe
    return wrap


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace")


# -- host ---------------------------------------------------------------------------------------

@_guarded({})
def _cpuinfo() -> dict:
    """/proc/cpuinfo: model name, sockets, cores per socket, MHz, cache (of the first processor)."""
    text = _read("/proc/cpuinfo")
    blocks = [b for b in text.split("\n\n") if b.strip()]
    fields = [dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in b.splitlines()))
              for b in blocks]
    if not fields:
        return {}
    first = fields[0]
    sockets = {f.get("physical id") for f in fields if f.get("physical id") is not None}
    info = {"model": first.get("model name") or first.get("Model") or first.get("cpu model"),
            "sockets": len(sockets) or None, "logical": len(fields)}
    if first.get("cpu cores", "").isdigit():
        info["cores_per_socket"] = int(first["cpu cores"])
    if first.get("cpu MHz"):
        info["mhz"] = float(first["cpu MHz"])
    if first.get("cache size"):
        info["cache"] = first["cache size"]
    return info


def cpu_model() -> str:
    """The host CPU's model name, which every benchmark record carries (hosts of one GPU kind differ)."""
    return _cpuinfo().get("model") or platform.processor() or "unknown"


@_guarded(None)
def _meminfo_kib() -> int | None:
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read("/proc/meminfo"), re.MULTILINE)
    return int(m.group(1)) if m else None


@_guarded(UNKNOWN)
def _operating_system() -> str:
    name = None
    try:
        name = platform.freedesktop_os_release().get("PRETTY_NAME")
    except (OSError, AttributeError):
        pass
    name = name or f"{platform.system()} {platform.release()}".strip()
    kernel = platform.release()
    return f"{name} (kernel {kernel})" if kernel and kernel not in name else name


@_guarded(None)
def _disk_bytes(path: str = "/") -> int | None:
    return shutil.disk_usage(path).total


@_guarded(UNKNOWN)
def _storage_type() -> str:
    """NVMe SSD / SSD / HDD from /sys/block (the real disks, not loop/ram/zram devices)."""
    kinds = set()
    for dev in Path("/sys/block").iterdir():
        if re.match(r"(loop|ram|zram|dm-|md|sr|fd)", dev.name):
            continue
        rotational = (dev / "queue" / "rotational").read_text().strip()
        kinds.add("NVMe SSD" if dev.name.startswith("nvme") else "HDD" if rotational == "1" else "SSD")
    return ", ".join(sorted(kinds)) if kinds else UNKNOWN


@_guarded([])
def _network_cards() -> list[dict]:
    """The network interfaces backed by a device (/sys/class/net/*/device: physical or virtio NICs, not
    lo, bridges, veths or ifb): name, driver, link speed (Mbit/s; None where the driver says none)."""
    cards = []
    for dev in sorted(Path("/sys/class/net").iterdir()):
        if not (dev / "device").exists():
            continue
        driver = (dev / "device" / "driver")
        try:
            speed = int((dev / "speed").read_text().strip())
        except (OSError, ValueError):
            speed = None
        cards.append({"name": dev.name, "driver": driver.resolve().name if driver.exists() else None,
                      "speed_mbit": speed if speed and speed > 0 else None})
    return cards


# -- GPUs ---------------------------------------------------------------------------------------

def _run(cmd: list[str]) -> str | None:
    """stdout of ``cmd``, or None when it is missing, fails or hangs."""
    if not shutil.which(cmd[0]):
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _visible(index: str, uuid: str) -> bool:
    """Whether CUDA_VISIBLE_DEVICES lets this process see the GPU (nvidia-smi lists every GPU of the
    host): a run on one GPU of four describes a system of one. Entries are indices or UUID prefixes."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return True
    for entry in (e.strip() for e in given.split(",")):
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry
        if entry == index or (entry.startswith("GPU-") and uuid.startswith(entry)):
            return True
    return False


@_guarded({"count": 0, "names": [], "memory_mib": [], "driver": UNKNOWN, "cuda_driver": UNKNOWN,
           "tool": UNKNOWN, "indices": []})
def _gpus() -> dict:
    """nvidia-smi's GPUs that this process may use (CUDA_VISIBLE_DEVICES): names, memory (MiB), driver,
    the CUDA version the driver supports. No nvidia-smi: no GPUs ("none", 0); one that fails: "unknown"."""
    if not shutil.which("nvidia-smi"):
        return {"count": 0, "names": [], "memory_mib": [], "driver": NONE, "cuda_driver": NONE, "tool": NONE,
                "indices": []}
    out = _run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader"])
    if out is None:
        return {"count": 0, "names": [], "memory_mib": [], "driver": UNKNOWN, "cuda_driver": UNKNOWN,
                "tool": "nvidia-smi failed", "indices": []}
    names, memory, drivers, indices = [], [], [], []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not _visible(parts[0], parts[1]):
            continue
        indices.append(parts[0])
        names.append(parts[2])
        m = re.match(r"(\d+)", parts[3])
        memory.append(int(m.group(1)) if m else None)
        drivers.append(parts[4])
    header = _run(["nvidia-smi"]) or ""
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return {"count": len(names), "names": names, "memory_mib": memory,
            "driver": drivers[0] if drivers else UNKNOWN,
            "cuda_driver": cuda.group(1) if cuda else UNKNOWN, "tool": "nvidia-smi", "indices": indices}


@_guarded({})
def _gpu_links(index: str = "0") -> dict:
    """nvidia-smi's max SM clock (MHz), PCIe link (generation, width) of GPU ``index``, and its active
    NVLink links: {} where it says nothing usable."""
    out = _run(["nvidia-smi", "-i", index, "--query-gpu=clocks.max.sm,pcie.link.gen.max,pcie.link.width.max",
                "--format=csv,noheader,nounits"])
    facts: dict = {}
    if out and out.strip():
        parts = [p.strip() for p in out.strip().splitlines()[0].split(",")]
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            facts.update(sm_clock_mhz=int(parts[0]), pcie_gen=int(parts[1]), pcie_width=int(parts[2]))
    links = _run(["nvidia-smi", "nvlink", "--status", "-i", index])
    if links is not None:
        facts["nvlinks"] = len(re.findall(r"Link \d+: [\d.]+ GB/s", links))
    return facts


def _trtfuse_version() -> str:
    """The installed distribution's version, else (a checkout on the path, as on the GPU machine) the
    package's own with the commit where git can tell it."""
    installed = _dist_version("trtfuse")
    if installed:
        return installed
    from trtfuse import __version__

    checkout = Path(__file__).resolve().parents[2]
    commit = _run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"])
    return f"{__version__} (source tree{' ' + commit.strip() if commit and commit.strip() else ''})"


# -- software -----------------------------------------------------------------------------------

@_guarded(None)
def _dist_version(*names: str) -> str | None:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


@_guarded(NONE)
def _tensorrt_version() -> str:
    try:
        import tensorrt  # noqa: PLC0415 - optional, and slow to import

        return str(tensorrt.__version__)
    except Exception:  # noqa: BLE001 - not importable (or broken): its package metadata, if any
        return _dist_version("tensorrt", "tensorrt-cu12", "tensorrt-cu11", "tensorrt-cu13") or NONE


@_guarded(UNKNOWN)
def _cuda_runtime_version() -> str:
    """The CUDA runtime cuda.bindings (cuda-python) links, e.g. "12.4"; "none" without it."""
    try:
        from cuda.bindings import runtime  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        try:
            from cuda import cudart as runtime  # noqa: PLC0415 - cuda-python < 12.6
        except Exception:  # noqa: BLE001
            return NONE
    err, version = runtime.cudaRuntimeGetVersion()
    if int(err) != 0:
        return UNKNOWN
    return f"{version // 1000}.{(version % 1000) // 10}"


def probe() -> dict:
    """Facts about this machine; each value is what was found, "unknown" or "none"."""
    cpu = _cpuinfo()
    mem_kib = _meminfo_kib()
    gpus = _gpus()
    cuda = _cuda_runtime_version()
    if cuda in (NONE, UNKNOWN) and gpus["cuda_driver"] not in (NONE, UNKNOWN):
        cuda = f"{gpus['cuda_driver']} (driver)"
    logical = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    return {
        "hostname": platform.node() or UNKNOWN,
        "cpu_model": cpu.get("model") or platform.processor() or UNKNOWN,
        "cpu_sockets": cpu.get("sockets") or 1,
        "cpu_cores_per_socket": cpu.get("cores_per_socket") or logical or UNKNOWN,
        "cpu_logical": logical or UNKNOWN,
        "cpu_usable": usable or UNKNOWN,
        "cpu_mhz": cpu.get("mhz") or UNKNOWN,
        "cpu_cache": cpu.get("cache") or UNKNOWN,
        "memory_bytes": mem_kib * 1024 if mem_kib else UNKNOWN,
        "disk_bytes": _disk_bytes() or UNKNOWN,
        "storage_type": _storage_type(),
        "network_cards": _network_cards(),
        "os": _operating_system(),
        "python": platform.python_version() or sys.version.split()[0],
        "gpu_count": gpus["count"],
        "gpu_names": gpus["names"],
        "gpu_memory_mib": gpus["memory_mib"],
        "gpu_driver": gpus["driver"],
        "gpu_links": _gpu_links(gpus["indices"][0]) if gpus["count"] else {},
        "cuda": cuda,
        "tensorrt": _tensorrt_version(),
        "onnxruntime": _dist_version("onnxruntime", "onnxruntime-gpu") or NONE,
        "loadgen": _dist_version("mlcommons-loadgen", "mlcommons_loadgen") or NONE,
        "trtfuse": _trtfuse_version(),
    }


# -- MLPerf's system description ----------------------------------------------------------------

def _gb(nbytes) -> str:
    """Bytes as MLPerf writes capacities: "80 GB" (binary gigabytes, rounded)."""
    if not isinstance(nbytes, (int, float)) or nbytes <= 0:
        return UNKNOWN
    gib = nbytes / 2**30
    if gib >= 1024:
        return f"{gib / 1024:.1f} TB".replace(".0 TB", " TB")
    return f"{round(gib)} GB"


def framework(info: dict, backends: set[str]) -> str:
    """The inference stack the runs used: TensorRT + CUDA, or ONNX Runtime, and trtfuse + LoadGen."""
    parts = []
    if "tensorrt" in backends:
        parts.append(f"TensorRT {info['tensorrt']}, CUDA {info['cuda']}")
    if "onnxruntime" in backends:
        parts.append(f"ONNX Runtime {info['onnxruntime']}")
    if "null" in backends:
        parts.append("no inference (trtfuse's null backend)")
    parts.append(f"trtfuse {info['trtfuse']} (MLPerf LoadGen {info['loadgen']})")
    return "; ".join(parts)


def _networking(cards) -> str:
    if not cards:
        return UNKNOWN
    parts = []
    for c in cards:
        detail = ", ".join(x for x in (c.get("driver"), f"{c['speed_mbit'] / 1000:g} Gbit/s"
                                       if c.get("speed_mbit") else None) if x)
        parts.append(f"{c['name']}" + (f" ({detail})" if detail else ""))
    return "Ethernet: " + "; ".join(parts)


def system_description(info: dict, *, system_name: str, submitter: str, division: str,
                       status: str = "available", system_type: str = "datacenter",
                       backends: set[str] = frozenset()) -> dict:
    """MLPerf Inference's systems/<system>.json from ``probe()``'s facts. Fields no probe can know
    (networking, cooling, interconnects) are "unknown": ``unknown_fields`` lists them for the user."""
    gpus = info.get("gpu_count") or 0
    names = sorted(set(info.get("gpu_names") or []))
    memory = [m for m in info.get("gpu_memory_mib") or [] if m]
    mhz = info.get("cpu_mhz")
    links = info.get("gpu_links") or {}
    desc = {
        "submitter": submitter,
        "division": division,
        "status": status,
        "system_name": system_name,
        "system_type": system_type,
        "system_type_detail": UNKNOWN,
        "number_of_nodes": 1,
        "host_processor_model_name": info.get("cpu_model", UNKNOWN),
        "host_processors_per_node": info.get("cpu_sockets", UNKNOWN),
        "host_processor_core_count": info.get("cpu_cores_per_socket", UNKNOWN),
        "host_processor_vcpu_count": info.get("cpu_logical", UNKNOWN),
        "host_processor_frequency": f"{mhz:,.0f} MHz" if isinstance(mhz, (int, float)) else UNKNOWN,
        "host_processor_caches": info.get("cpu_cache", UNKNOWN),
        "host_processor_interconnect": UNKNOWN,
        "host_memory_capacity": _gb(info.get("memory_bytes")),
        "host_memory_configuration": UNKNOWN,
        "host_storage_capacity": _gb(info.get("disk_bytes")),
        "host_storage_type": info.get("storage_type", UNKNOWN),
        # No device-backed interface seen (a container may hide the host's): unknown, not 0.
        "host_networking": _networking(info.get("network_cards")),
        "host_network_card_count": len(info.get("network_cards") or []) or UNKNOWN,
        "host_networking_topology": UNKNOWN,
        # The checker counts a 0 as an empty field; CPU-only submissions write "0".
        "accelerators_per_node": gpus or "0",
        "accelerator_model_name": " + ".join(names) if names else NONE,
        "accelerator_memory_capacity": _gb(max(memory) * 2**20) if memory else (NONE if not gpus else UNKNOWN),
        # The memory type is in the name NVIDIA gives its boards ("NVIDIA H100 80GB HBM3").
        "accelerator_memory_configuration": (_memory_type(names) or UNKNOWN) if gpus else NONE,
        "accelerator_frequency": (f"{links['sm_clock_mhz']} MHz (max SM clock)" if "sm_clock_mhz" in links
                                  else UNKNOWN) if gpus else NONE,
        "accelerator_host_interconnect": (f"PCIe Gen{links['pcie_gen']} x{links['pcie_width']}" if "pcie_gen" in links
                                          else UNKNOWN) if gpus else NONE,
        "accelerator_interconnect": (f"NVLink ({links['nvlinks']} links per accelerator)" if links.get("nvlinks")
                                     else "none" if gpus == 1 and "nvlinks" in links else UNKNOWN) if gpus else NONE,
        "accelerator_interconnect_topology": UNKNOWN if gpus else NONE,
        "accelerator_on-chip_memories": UNKNOWN if gpus else NONE,
        "cooling": UNKNOWN,
        "framework": framework(info, set(backends)),
        "operating_system": info.get("os", UNKNOWN),
        "other_software_stack": ", ".join(
            [f"Python {info.get('python', UNKNOWN)}"]
            + ([f"NVIDIA driver {info['gpu_driver']}"] if info.get("gpu_driver") not in (None, NONE) else [])
            + ([f"CUDA {info['cuda']}"] if info.get("cuda") not in (None, NONE) else [])
            + ([f"TensorRT {info['tensorrt']}"] if info.get("tensorrt") not in (None, NONE) else [])
            + [f"ONNX Runtime {info.get('onnxruntime', UNKNOWN)}",
               f"mlcommons-loadgen {info.get('loadgen', UNKNOWN)}", f"trtfuse {info.get('trtfuse', UNKNOWN)}"]),
        "hw_notes": "",
        "sw_notes": "",
    }
    return desc


def _memory_type(names: list[str]) -> str | None:
    found = sorted({m.group(0) for n in names for m in [re.search(r"\b(HBM\w*|GDDR\w*|LPDDR\w*)\b", n)] if m})
    return ", ".join(found) or None


def unknown_fields(desc: dict) -> list[str]:
    return [k for k, v in desc.items() if v == UNKNOWN]
