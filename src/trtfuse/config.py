"""Run settings: src/trtfuse/configs/default.toml, then a user TOML file, then command-line overrides.

Every key a user may set exists in default.toml, so an unknown key is always a typo and is reported
as one, with the valid keys beside it.
"""

from __future__ import annotations

import copy
import difflib
import sys
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from trtfuse.errors import UserError

SCENARIOS = ("offline", "server", "singlestream", "multistream")
MODES = ("performance", "accuracy")
# tensorrt.plugins: which layers run on trtfuse's fused plugins. "tails": the bottleneck tails; "all": the tails and the
# stem (each also computing the next conv1 where the kernel holds it), every projection and 3x3 conv the plugin runs
# faster than TensorRT, the pool head, and in a float build the LayerNorms. Each fusion and the modes that enable it:
# src/trtfuse/passes/fusions.py. Normalized here, once, as settings load; everything after reads one of these three.
PLUGIN_MODES = ("off", "tails", "all")
# --plugins, said the same by every command that takes it.
PLUGINS_HELP = ("off: TensorRT's own kernels; tails: the bottleneck tails (conv + BN + residual + ReLU) on "
                "trtfuse's fused int8 kernel; all: every fusion of src/trtfuse/passes/fusions.py at the precision (int8: the "
                "tails, projections, stem, narrow 3x3 convs and pool head; fp32/fp16: the LayerNorms)")


def plugin_mode(value: Any) -> str:
    """tensorrt.plugins as one of PLUGIN_MODES. Older configs, reports and callers said true/false (and the CLI
    "on"): true and "on" mean "tails"."""
    if value is True or value == "on":
        return "tails"
    if value is False or value is None or value == "":
        return "off"
    if value in PLUGIN_MODES:
        return value
    raise UserError(f"tensorrt.plugins must be one of {', '.join(PLUGIN_MODES)}, not {value!r}",
                    'e.g. plugins = "tails" (the fused bottleneck tails) or "all" (tails and projections)')


# tensorrt.plugin_exclude: the fusion sites left to TensorRT although --plugins enables their kind, each
# "<kind>:<anchor node name>" (residual_conv_rewrite.site_id; kinds: the conv family's, residual_conv_rewrite.KINDS).
# Written by measurement (trtfuse.plugin_sites: the sites where TensorRT's own layers are faster at the engine's batch).
PLUGIN_SITE_KINDS = ("tail", "proj", "fused", "conv3x3", "stem", "next", "pool")


def plugin_exclude(value: Any) -> tuple[str, ...]:
    """tensorrt.plugin_exclude as a sorted tuple of distinct site ids; a list, or one string of ids split by commas."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    out = set()
    for item in items:
        item = item.strip() if isinstance(item, str) else item
        if item == "":
            continue
        kind, _, anchor = item.partition(":") if isinstance(item, str) else ("", "", "")
        if kind not in PLUGIN_SITE_KINDS or not anchor:
            raise UserError(f"tensorrt.plugin_exclude: {item!r} is not a site id (<kind>:<node name>, kind one of "
                            f"{', '.join(PLUGIN_SITE_KINDS)})",
                            'e.g. plugin_exclude = ["tail:/layer4/layer4.2/Add"], as `trtfuse bench edge '
                            'latency-profile` writes them')
        out.add(item)
    return tuple(sorted(out))


Settings = dict[str, dict[str, Any]]


def defaults() -> Settings:
    text = resources.files("trtfuse.configs").joinpath("default.toml").read_text()
    return tomllib.loads(text)


def _read_toml(path: str | Path) -> Settings:
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist", "check the path given to --config") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {path} is not valid TOML ({e})", "fix the line it names") from None


def _typed(key: str, value: Any, default: Any) -> Any:
    """``value`` converted to ``default``'s type, or a UserError naming the key."""
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise UserError(f"config key {key} must be {kind.__name__}, not {value!r}",
                    f"e.g. {key.split('.')[-1]} = {default!r}")


def merge(base: Settings, updates: dict[str, Any], source: str) -> Settings:
    """``updates`` ({"section.key": value} or nested) applied to ``base``, validated against defaults."""
    flat: dict[str, Any] = {}
    for name, value in updates.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    merged = copy.deepcopy(base)
    valid = [f"{s}.{k}" for s, keys in base.items() for k in keys]
    for key, value in flat.items():
        section, _, name = key.partition(".")
        if key == "tensorrt.plugins":  # true/false from configs written before the modes
            value = plugin_mode(value)
        elif key == "tensorrt.plugin_exclude":
            value = list(plugin_exclude(value))
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(f"unknown config key {key!r} in {source}",
                            f"{hint}valid keys: {', '.join(valid)}")
        merged[section][name] = _typed(key, value, base[section][name])
    _check(merged)
    return merged


def _check(s: Settings) -> None:
    run = s["run"]
    if run["scenario"] not in SCENARIOS:
        raise UserError(f"unknown scenario {run['scenario']!r}", f"use one of: {', '.join(SCENARIOS)}")
    if run["mode"] not in MODES:
        raise UserError(f"unknown mode {run['mode']!r}", f"use one of: {', '.join(MODES)}")
    if run["batch_size"] < 1 or run["batch_size"] > 65536:
        raise UserError(f"batch size {run['batch_size']} is impossible",
                        "use a batch size from 1 to the model's maximum (e.g. --batch-size 8)")
    for key in ("sample_count", "performance_sample_count", "warmup_batches"):
        if run[key] < 0:
            raise UserError(f"run.{key} is negative ({run[key]})", "use 0 or a positive number")
    if run["threads"] < 0:
        raise UserError(f"run.threads must be 0 (one per backend stream) or more, not {run['threads']}",
                        "use --threads 0")
    if run["sut"] not in ("auto", "python", "native"):
        raise UserError(f"run.sut must be auto, python or native, not {run['sut']!r}", "e.g. --sut native")
    if run["sut"] == "native" and run["backend"] not in ("tensorrt", "null", "auto"):
        raise UserError(f"the native SUT runs TensorRT engines and the null engine, not --backend {run['backend']}",
                        "use --sut python for onnxruntime or triton, or --backend tensorrt / null")
    if s["native"]["samples"] not in ("host", "device"):
        raise UserError(f"native.samples must be host or device, not {s['native']['samples']!r}", 'e.g. samples = "host"')
    if s["native"]["batch_timeout_us"] < 0 or s["native"]["null_batch_us"] < 0:
        raise UserError("native.batch_timeout_us and native.null_batch_us must not be negative",
                        "use 0 (none) or a positive number of microseconds")
    if run["watchdog_s"] <= 0:
        raise UserError("run.watchdog_s must be positive", "e.g. watchdog_s = 120")
    server = s["server"]
    if server["target_qps"] <= 0:
        raise UserError(f"server target QPS must be positive, not {server['target_qps']}",
                        "e.g. --target-qps 100")
    if s["offline"]["target_qps"] < 0:
        raise UserError(f"Offline target QPS (the samples/s LoadGen expects) must be positive, not "
                        f"{s['offline']['target_qps']:g}", "e.g. --target-qps 2000, or leave it out for the "
                        "warm-up's estimate")
    if server["target_latency_ms"] <= 0:
        raise UserError("server latency bound and batch timeout must be positive",
                        "e.g. --latency-bound-ms 15")
    if s["tensorrt"]["tactic_sources"] not in ("", "default", "none"):
        raise UserError(f"tensorrt.tactic_sources must be \"default\" or \"none\", not {s['tensorrt']['tactic_sources']!r}",
                        'use "default" (TensorRT\'s own), or "none" where cuBLAS/cuDNN are not installed')
    triton = s["triton"]
    if triton["transport"] not in ("grpc", "shm", "cuda") or triton["inflight"] < 1 or triton["timeout_s"] <= 0:
        raise UserError(f"triton settings: transport must be grpc, shm or cuda (not {triton['transport']!r}), inflight 1 "
                        f"or more (not {triton['inflight']}), timeout_s positive (not {triton['timeout_s']})",
                        "e.g. transport = \"grpc\", inflight = 2, timeout_s = 60")
    for scenario in ("singlestream", "multistream"):
        if s[scenario]["expected_latency_ms"] < 0:
            raise UserError(f"{scenario}.expected_latency_ms is negative", "use 0 (measured in warm-up) or more")
    for scenario in SCENARIOS:
        for key in ("min_duration_ms", "min_query_count"):
            if s[scenario][key] < 0:
                raise UserError(f"{scenario}.{key} is negative", "use 0 or a positive number")


def load(config_file: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then ``config_file``, then ``overrides`` ({"section.key": value}; None values skipped)."""
    settings = defaults()
    if config_file:
        settings = merge(settings, _read_toml(config_file), str(config_file))
    if overrides:
        given = {k: v for k, v in overrides.items() if v is not None}
        settings = merge(settings, given, "the command line")
    _check(settings)
    return settings
