"""Two commits of trtfuse on one GPU lease, timed by one timer: engines alone and each plugin kernel family's layers.

    trtfuse bench ab pack --before COMMIT [--out .devcache/ab]     # here (CPU): BEFORE's files, the models, wheels
    python3.10 -m trtfuse bench ab run --out FILE                  # GPU machine (tools/device_trt.sh redesign-ab)

BEFORE is built with its own code (its plugin build, its engine build, from the packed `git archive` unpacked outside
the work tree), AFTER with this checkout's; every engine is then timed by one standalone worker
(trtfuse/bench/ab_timer.py: TensorRT + cuda-python, CUDA events, no trtfuse import), one process per side since both
plugin libraries register the same plugin names, the two sides alternating engine by engine and round by round (ABBA)
so that clock and power drift fall on both. Layer times are TensorRT's profiler on the same engines (plugins all),
each plugin layer put in its kernel family by the rewritten graph its side built; so both sides' layers are measured
by the same harness against their own library, in the network they run in.

Stages (each resumes what an earlier call left: built libraries and engines are kept under --work, the record is
merged): libs (both plugin libraries, concurrently), engines (ResNet-50 at each --batches and EfficientNet-Lite0 at
256, plugins off and all, per side; BEFORE first, its timing cache then seeds AFTER's so that TensorRT's own layers
get the same tactics), time (engines alone, then layer profiles), tests (AFTER's GPU and TensorRT tests, the list of
every test's outcome). --deadline-s stops starting work that would not end in time; run the step again to go on.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from trtfuse.bench import REPO
from trtfuse.errors import UserError
from trtfuse.files import sha256

DEFAULT_BEFORE = "04a5227"   # the last commit with harness/ (package-dir), the residual_conv library, the old scripts
PACK = REPO / ".devcache" / "ab"
WORK = Path("/tmp/trtfuse-ab")
BUNDLE_MODELS = Path("/tmp/trtfuse-e2e/models")   # the device bundle (trtfuse bench bundle stash)
SIDES = ("before", "after")
MODES = ("off", "all")
LITE0 = "efficientnet-lite0"
BAR = 0.99                    # after >= 0.99 x before, in speed, for every engine and kernel family
STAGES = ("libs", "engines", "time", "tests")
TUNING = "benchmarks/results/residual_conv_tuning_h100.json"
# What BEFORE's run needs of its commit: all but the docs, the tests and the records (its tuning cache is kept).
SKIP = ("docs/", "tests/", ".ci/", "benchmarks/results/")
TIMER = Path(__file__).with_name("ab_timer.py")
MARK = "AB-RESULT "
PLUGIN_BUILD = ("-m", "trtfuse.plugin_build", "build")   # each side's own plugin build
# AFTER's GPU and TensorRT tests: tools/device_trt.sh's steps conv-test, conv3x3, stem, next, layernorm, backend-test,
# gpu-test (their pytest parts; gpu-test without the two files backend-test ran), with a rough cost each for the
# deadline.
TESTS = (
    ("conv-test", "tensorrt", ("tests/test_residual_conv_plugin.py",), 120),
    ("conv3x3-test", "gpu", ("tests/test_conv3x3.py",), 60),
    ("stem-test", "gpu or tensorrt", ("tests/test_stem.py",), 60),
    ("next-test", "gpu or tensorrt", ("tests/test_next_conv.py",), 60),
    ("layernorm", "tensorrt", ("tests/test_layernorm_plugin.py",), 60),
    ("backend-test", "gpu or tensorrt", ("tests/test_cuda_runtime.py", "tests/test_tensorrt_backend.py"), 60),
    ("gpu-test", "gpu or tensorrt", ("tests/test_lanes.py", "tests/test_triton_export.py", "tests/test_triton_gpu.py"),
     60),
)


def tests_env(name: str, env: dict) -> dict:
    """The environment of TESTS' entry ``name``: gpu-test serves through Triton 2.51's Python backend, whose stub
    answers empty outputs with NumPy 2 (trtfuse serve refuses it), so the Triton payload's NumPy 1
    ($TRTFUSE_TRITON_NUMPY1, set by device_trt.sh) comes first, as in device_trt.sh's own gpu-test step."""
    numpy1 = os.environ.get("TRTFUSE_TRITON_NUMPY1")
    if name != "gpu-test" or not numpy1:
        return env
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (numpy1, env.get("PYTHONPATH", "")) if p)}


def log(msg: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git(repo: Path, *args: str, binary: bool = False):
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except OSError as e:
        raise UserError(f"git does not run here ({e})", "install git, or run this where the checkout is") from e
    if out.returncode:
        raise UserError(f"git {' '.join(args)} failed: {out.stderr.decode(errors='replace').strip()}",
                        "run from a git checkout of trtfuse that holds the commit")
    return out.stdout if binary else out.stdout.decode().strip()


# ============================================================================= pack (CPU)
def pack(before: str, out: Path, models_dir: Path, models: list[str], wheels: list[Path], repo: Path = REPO) -> dict:
    """BEFORE's files (``git archive``, SKIP left out), the named model folders and the wheels, into ``out``, written
    whole: a new folder beside it, then swapped in. Returns the manifest."""
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{before}^{{commit}}"],
                           capture_output=True, text=True, check=False) if before else None
    commit = found.stdout.strip() if found and found.returncode == 0 else ""
    if not commit:
        raise UserError(f"unknown commit '{before}'", "pass --before COMMIT, a commit of this checkout")
    layout = ("src" if git(repo, "ls-tree", "--name-only", commit, "src/trtfuse") else
              "harness" if git(repo, "ls-tree", "--name-only", commit, "harness") else "")
    if not layout or not git(repo, "ls-tree", "--name-only", commit, "tools/dev_env.sh"):
        raise UserError(f"commit {commit[:12]} has no trtfuse package (src/trtfuse or harness/) with tools/dev_env.sh",
                        "pick a commit of this project's own history")
    for name in models:
        if not (models_dir / name / "model.json").is_file():
            raise UserError(f"{models_dir / name} is no prepared model folder (no model.json)",
                            "pass --models-dir, the bundle's models/ (trtfuse bench bundle prepare)")
    for w in wheels:
        if not w.is_file() or w.suffix != ".whl":
            raise UserError(f"{w} is not a wheel file", "pass --wheel PATH.whl (a cp310 or py3 wheel)")
    out = Path(out)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = {}
        kept = 0
        with tarfile.open(fileobj=io.BytesIO(git(repo, "archive", "--format=tar", commit, binary=True))) as raw, \
                tarfile.open(tmp / "before.tar.gz", "w:gz") as tar:
            for m in raw.getmembers():
                if (m.name + "/" * m.isdir()).startswith(SKIP) and m.name != TUNING:
                    continue
                tar.addfile(m, raw.extractfile(m) if m.isfile() else None)
                kept += m.isfile()
        if models:
            with tarfile.open(tmp / "models.tar.gz", "w:gz") as tar:
                for name in models:
                    tar.add(models_dir / name, arcname=name)
        if wheels:
            (tmp / "wheels").mkdir()
            for w in wheels:
                shutil.copy2(w, tmp / "wheels" / w.name)
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(tmp))] = {"bytes": p.stat().st_size, "sha256": sha256(p)}
        manifest = {"before": commit, "subject": git(repo, "log", "-1", "--format=%s", commit),
                    "date": git(repo, "log", "-1", "--format=%cI", commit), "layout": layout, "files_archived": kept,
                    "models": models, "wheels": [w.name for w in wheels], "files": files,
                    "bytes": sum(f["bytes"] for f in files.values())}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def read_pack(pack_dir: Path) -> dict:
    mf = pack_dir / "manifest.json"
    if not mf.is_file():
        raise UserError(f"{mf} does not exist", "make it on the CPU machine (`trtfuse bench ab pack`) and carry "
                        f"{pack_dir.name} (.devcache/ab) with the device call")
    manifest = json.loads(mf.read_text())
    for name, f in manifest["files"].items():
        p = pack_dir / name
        if not p.is_file() or p.stat().st_size != f["bytes"] or sha256(p) != f["sha256"]:
            raise UserError(f"{p} is missing or differs from the pack's manifest", "carry the whole .devcache/ab")
    return manifest


# ============================================================================= results (pure: tested on CPU)
def engine_keys(batches, models=("resnet50", LITE0)) -> list[str]:
    keys = [f"resnet50/b{b}/{m}" for b in batches for m in MODES] if "resnet50" in models else []
    return keys + ([f"{LITE0}/b256/{m}" for m in MODES] if LITE0 in models else [])


def split_key(key: str) -> tuple[str, int, str]:
    model, b, mode = key.split("/")
    return model, int(b[1:]), mode


def families_of(model) -> dict[str, str]:
    """Plugin node name -> its kernel family, from a rewritten ONNX graph: tail, proj, fused, conv3x3, stem (the
    rewrite's plugin_kind), "+next" where the node computes the next conv1 too; the pool head "pool"."""
    from trtfuse.passes.residual_conv_rewrite import PLUGIN_DOMAIN, PLUGIN_OP, POOL_OP, plugin_kind

    fams = {}
    for n in model.graph.node:
        if n.domain != PLUGIN_DOMAIN:
            continue
        if n.op_type == PLUGIN_OP:
            fams[n.name] = plugin_kind(n) + ("+next" if any(a.name == "next_weights" for a in n.attribute) else "")
        elif n.op_type == POOL_OP:
            fams[n.name] = "pool"
    return fams


def layer_family(layer: str, fams: dict[str, str]) -> str:
    """A profiled layer's family: a plugin node's (TensorRT names the layer after it), "reformat" for the copies
    TensorRT puts around layers, else "trt" (TensorRT's own layers)."""
    if layer.startswith("Reformatting") or "reformat" in layer.lower():
        return "reformat"
    for part in layer.split(" + "):
        if part.strip() in fams:
            return fams[part.strip()]
    # a name TensorRT decorated: the node's name as a whole word in it
    words = set(re.findall(r"[\w.]+", layer))
    return next((f for n, f in fams.items() if n in words), "trt")


def order(round_: int, index: int) -> tuple[str, str]:
    """Which side runs first for the ``index``-th engine in round ``round_``: alternating over engines and rounds (ABBA),
    so that each side goes first equally often and a drift in clock or power falls on both."""
    return SIDES if (round_ + index) % 2 == 0 else SIDES[::-1]


def _ratio(before_ms, after_ms):
    return round(before_ms / after_ms, 4) if before_ms and after_ms else None


def summarize(data: dict, bar: float = BAR) -> None:
    """From the raw rounds in ``data`` ("rounds": {key: {side: [ms, ...]}}, "profiles": {key: {side: [{layer: ms}]}},
    "families": {key: {side: {node: family}}}): each engine's and each family's before/after, the speed ratio
    (before time / after time: >= ``bar`` meets the bar) and the verdict in data["bars"]."""
    median = statistics.median
    failures, complete = [], True
    data["engine_time"] = {}
    for key, sides in sorted(data.get("rounds", {}).items()):
        model, batch, mode = split_key(key)
        row = {"model": model, "batch": batch, "plugins": mode}
        for s in SIDES:
            v = sides.get(s) or []
            row[f"{s}_ms"] = round(median(v), 4) if v else None
            row[f"{s}_samples_per_s"] = round(batch / median(v) * 1e3, 1) if v else None
            row[f"{s}_spread"] = round((max(v) - min(v)) / median(v), 4) if v else None
            row[f"{s}_rounds"] = len(v)
        row["ratio"] = _ratio(row["before_ms"], row["after_ms"])
        row["bar_met"] = row["ratio"] is not None and row["ratio"] >= bar
        complete &= row["ratio"] is not None
        if row["ratio"] is not None and not row["bar_met"]:
            failures.append(f"engine {key}: {row['ratio']}")
        data["engine_time"][key] = row
    data["layer_time"] = {}
    for key, sides in sorted(data.get("profiles", {}).items()):
        per_side = {}
        for s in SIDES:
            runs = sides.get(s) or []
            names = dict.fromkeys(n for r in runs for n in r)
            per_side[s] = {n: median([r[n] for r in runs if n in r]) for n in names}
        fams = data.get("families", {}).get(key, {})
        fam = {n: layer_family(n, fams.get(s, {})) for s in SIDES for n in per_side[s]}
        table = {}
        for s in SIDES:
            for n, ms in per_side[s].items():
                t = table.setdefault(fam[n], {"layers": 0, "before_ms": 0.0, "after_ms": 0.0})
                t[f"{s}_ms"] += ms
                t["layers"] += s == "after"
        layers = []
        for n in sorted(set(per_side["before"]) & set(per_side["after"]), key=lambda n: -per_side["after"][n]):
            if fam[n] not in ("trt", "reformat"):
                layers.append([n, fam[n], round(per_side["before"][n], 4), round(per_side["after"][n], 4),
                               _ratio(per_side["before"][n], per_side["after"][n])])
        for f, t in table.items():
            t["before_ms"], t["after_ms"] = round(t["before_ms"], 4), round(t["after_ms"], 4)
            t["ratio"] = _ratio(t["before_ms"], t["after_ms"])
            if f in ("trt", "reformat"):   # TensorRT's own: shown, not a kernel family of ours
                continue
            t["bar_met"] = t["ratio"] is not None and t["ratio"] >= bar
            complete &= t["ratio"] is not None
            if t["ratio"] is not None and not t["bar_met"]:
                failures.append(f"layers {key} {f}: {t['ratio']}")
        for s in SIDES:  # a profile in which no layer is a plugin node's names them some other way: no verdict
            if any(fams.get(s, {}).values()) and per_side[s] and \
                    all(fam[n] in ("trt", "reformat") for n in per_side[s]):
                complete = False
                failures.append(f"layers {key}: no {s} layer named after a plugin node (e.g. {next(iter(per_side[s]))})")
        data["layer_time"][key] = {"families": dict(sorted(table.items())), "plugin_layers": layers,
                                   "under_bar": sum(1 for r in layers if r[4] is not None and r[4] < bar)}
    wanted = set(data.get("engine_keys", []))
    complete &= bool(wanted) and wanted <= set(data["engine_time"])
    complete &= all(k in data["layer_time"] for k in wanted if k.endswith("/all"))
    data["bars"] = {"threshold": bar, "complete": bool(complete), "met": bool(complete) and not failures,
                    "failures": failures,
                    "rule": "ratio = before time / after time (after's speed over before's), per engine (median of "
                            "the rounds) and per kernel family (sum of its layers' medians)"}


def write(out: Path, data: dict) -> None:
    from trtfuse.bench.runs import save_record

    summarize(data)
    save_record(out, data)


# ============================================================================= run (device)
class Deadline:
    def __init__(self, seconds: float):
        self.end = time.time() + seconds

    def left(self) -> float:
        return self.end - time.time()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


class Side:
    """One side's tree, plugin library, engine cache, model copies and environment."""

    def __init__(self, name: str, tree: Path, work: Path, build_dir: Path):
        self.name, self.tree, self.work, self.build_dir = name, tree, work / name, build_dir
        self.home, self.models = self.work / "home", self.work / "models"
        self.lib = build_dir / "libtrtfuse_plugins.so"
        self.tuning = tree / TUNING

    def env(self, base: dict) -> dict:
        # no trtfuse on the path but the side's own (its tools/dev_env.sh puts it there)
        paths = [p for p in base.get("PYTHONPATH", "").split(os.pathsep)
                 if p and not p.startswith(str(REPO)) and "trtfuse-path-" not in p]
        return {**base, "PYTHONPATH": os.pathsep.join(paths), "TRTFUSE_HOME": str(self.home),
                "TRTFUSE_BUILD_DIR": str(self.build_dir), "TRTFUSE_PLUGIN_LIB": str(self.lib),
                "TRTFUSE_RESIDUAL_CONV_CACHE": str(self.tuning)}

    def cmd(self, *argv: str) -> list[str]:
        """argv run in the side's tree with its package importable (its own tools/dev_env.sh)."""
        return ["bash", "-c", 'source tools/dev_env.sh && exec "$@"', "ab", *argv]


# Each side's engine builder: its own trtfuse (on the path by its dev_env.sh) builds what it is asked, one JSON a line.
BUILDER = r"""
import json, sys, time
from trtfuse.engine import BuildConfig, build_engine
for line in sys.stdin:
    r = json.loads(line)
    t0 = time.time()
    try:
        cfg = BuildConfig(precision="int8", plugins=r["plugins"], batch=r["batch"], input_format="int8", profiles=1)
        out = {"ok": True, "engine": str(build_engine(r["model_dir"], cfg)), "seconds": round(time.time() - t0, 1)}
    except BaseException as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print("AB-RESULT " + json.dumps(out), flush=True)
"""


class Proc:
    """A child answering one JSON line per request: answers on stdout (lines starting with ``mark``, or every line
    when ``mark`` is empty), everything else to ``log``."""

    def __init__(self, argv, env, cwd, log_path: Path, mark: str = ""):
        self.log = open(log_path, "a")  # noqa: SIM115 - the child's stderr until close()
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, bufsize=1)
        self.mark = mark

    def ask(self, request: dict, timeout: float) -> dict:
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        got = {}

        def read():
            for line in self.p.stdout:
                if not self.mark or line.startswith(self.mark):
                    got["answer"] = json.loads(line[len(self.mark):])
                    return
                self.log.write(line)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if "answer" not in got:
            self.close()
            raise RuntimeError(f"no answer in {timeout:.0f} s to {request.get('cmd', request)} "
                               f"(exit {self.p.poll()}; log {self.log.name})")
        return got["answer"]

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def nvidia_smi() -> dict:
    fields = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=False).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(zip(fields.split(","), (v.strip() for v in out[0].split(",")))) if out else {}


def run(args) -> int:
    from trtfuse.sysinfo import cpu_model
    from trtfuse.bench.runs import run_stage

    deadline = Deadline(args.deadline_s)
    manifest = read_pack(args.pack)
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    if data.get("before", {}).get("commit") not in (None, manifest["before"]):
        raise UserError(f"{out} holds a run against {data['before']['commit'][:12]}, the pack {manifest['before'][:12]}",
                        "pass another --out, or remove it")
    data.setdefault("errors", {})
    try:
        after = git(REPO, "rev-parse", "HEAD")
        dirty = bool(git(REPO, "status", "--porcelain", "--untracked-files=no"))
    except UserError:  # the device's copy of the tree has no .git: the lead's command names the commit
        after, dirty = os.environ.get("AB_AFTER_COMMIT", "unknown (no .git on the device)"), None
    data.update({
        "suite": "trtfuse bench ab", "gpu": nvidia_smi().get("name"), "host_cpu": cpu_model(),
        "before": {k: manifest[k] for k in ("subject", "date", "layout")} | {"commit": manifest["before"]},
        "engine_keys": engine_keys(args.batches), "bar": BAR,
        "method": ("each side's plugin library and engines built by its own code; one standalone timer "
                   "(ab_timer.py: TensorRT + cuda-python, CUDA events) in one process per side, the sides "
                   "alternating per engine and round (ABBA); engine time: median over rounds of the median of "
                   f"{args.reps} repetitions of N back-to-back inferences (~{args.target_ms} ms each), input every "
                   "byte 1, one optimization profile, int8 input; layer time: TensorRT's profiler on the plugins-all "
                   "engines, per-layer median over runs and rounds, summed per kernel family")})
    # the record may add up over several calls: each one's command and the tree it ran
    data.setdefault("calls", []).append({"command": "trtfuse bench ab " + " ".join(args.argv), "after": after,
                                         "uncommitted_changes": dirty, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                            time.gmtime())})
    data["after"] = {"commit": after} if len({c["after"] for c in data["calls"]}) == 1 else \
        {"commit": "several: see calls", "commits": sorted({c["after"] for c in data["calls"]})}
    work = Path(args.work)
    sides = {"before": Side("before", work / "before" / f"tree-{manifest['before'][:12]}", work,
                            work / "before" / "build"),
             "after": Side("after", REPO, work, Path(os.environ.get("TRTFUSE_BUILD_DIR", work / "after" / "build")))}
    logs = out.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ)
    stages = args.stages or [s for s in STAGES if s not in data.get("done", [])]

    def save():
        write(out, data)

    def stage(name, fn):
        if name in stages and not deadline.allows(1):
            data.setdefault("incomplete", {})[name] = "not started: the deadline had passed"
            log(f"stage {name}: not started, the deadline has passed")
        elif name in stages:
            log(f"stage {name} ({deadline.left():.0f} s left)")
            run_stage(data, name, fn, save, log)
            if name not in data["errors"] and data.get("incomplete", {}).get(name) is None:
                data["done"] = sorted(set(data.get("done", [])) | {name})
                save()

    def models() -> dict[str, Path]:
        """Each model's source folder: ResNet-50 from the device bundle, EfficientNet-Lite0 from the pack."""
        src = {"resnet50": Path(args.bundle_models) / "resnet50"}
        lite0 = work / "models-src" / LITE0
        if not (lite0 / "model.json").is_file() and (args.pack / "models.tar.gz").is_file():
            lite0.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(args.pack / "models.tar.gz") as tar:
                tar.extractall(lite0.parent)
        src[LITE0] = lite0 if (lite0 / "model.json").is_file() else Path(args.bundle_models) / LITE0
        for d in src.values():
            if not (d / "model.json").is_file():
                raise UserError(f"{d} is no prepared model", "stash the device bundle (device_trt.sh e2e-stash) or "
                                "pack the model (trtfuse bench ab pack --models ...)")
        return src

    def build_engines(s: str, keys: list[str]) -> list[str]:
        """``s``'s engines of ``keys`` not built yet, by its own code (one builder process); returns those left for
        the deadline."""
        side, built, left = sides[s], data.setdefault("engines", {}), []
        for name, d in models().items():  # the side's own copy: its rewrite keeps the rewritten graph there
            if not (side.models / name / "model.json").is_file():
                shutil.copytree(d, side.models / name, dirs_exist_ok=True)
        if s == "after" and args.share_timing_cache:
            # AFTER's cache is a subset of BEFORE's (the same graphs, built after): TensorRT's own layers get the
            # same tactics on both sides, so that a tactic timed differently twice is no difference between them
            (side.home / "engines").mkdir(parents=True, exist_ok=True)
            for t in (sides["before"].home / "engines").glob("timing-*.cache"):
                shutil.copy2(t, side.home / "engines" / t.name)
            data["timing_cache"] = "before's, copied into after's before its builds"
        proc = None
        try:
            for key in keys:
                have = built.get(key, {}).get(s)
                if have and Path(have["path"]).is_file():
                    continue
                if not deadline.allows(args.build_estimate_s):
                    left.append(f"{s} {key}")
                    continue
                if proc is None:
                    proc = Proc(side.cmd(sys.executable, "-c", BUILDER), side.env(base), side.tree,
                                logs / f"ab-engines-{s}.log", MARK)
                model, batch, mode = split_key(key)
                log(f"{s}: building {key}")
                r = proc.ask({"model_dir": str(side.models / model), "batch": batch, "plugins": mode},
                             max(deadline.left(), 60))
                if not r["ok"]:
                    raise RuntimeError(f"{s} {key}: {r['error']} (log {logs / f'ab-engines-{s}.log'})")
                p = Path(r["engine"])
                built.setdefault(key, {})[s] = {"path": str(p), "bytes": p.stat().st_size, "build_s": r["seconds"]}
                save()
        finally:
            if proc:
                proc.close()
        return left

    def libs():
        bt = sides["before"].tree
        if not (bt / "tools" / "dev_env.sh").is_file():
            shutil.rmtree(bt, ignore_errors=True)
            bt.mkdir(parents=True)
            with tarfile.open(args.pack / "before.tar.gz") as tar:
                tar.extractall(bt)
        root = base.get("TENSORRT_ROOT")
        if not root:
            raise UserError("TENSORRT_ROOT is not set", "source /opt/trt85/env.sh (tools/device_trt.sh does)")
        procs, ended = {}, {}
        for s, side in sides.items():  # both at once: each build's longest source bounds it, not the cores
            side.build_dir.mkdir(parents=True, exist_ok=True)
            with open(logs / f"ab-lib-{s}.log", "w") as f:
                p = subprocess.Popen(side.cmd(sys.executable, *PLUGIN_BUILD, "--tensorrt-root", root, "--archs", "90a"),
                                     cwd=side.tree, env=side.env(base), stdout=f, stderr=subprocess.STDOUT)
            procs[s] = (time.time(), p)
            threading.Thread(target=lambda s=s, p=p: ended.__setitem__(s, (p.wait(), time.time())), daemon=True).start()
        # Meanwhile the GPU would idle: BEFORE's plugins-off engines need no plugin library.
        try:
            build_engines("before", [k for k in data["engine_keys"] if split_key(k)[2] == "off"])
        except Exception as e:  # noqa: BLE001 - the engines stage builds them again; the libraries come first
            data["errors"]["engines-during-libs"] = f"{type(e).__name__}: {e}"
            log(f"plugins-off engines while the libraries build: {data['errors']['engines-during-libs']}")
        for s, (t0, p) in procs.items():
            p.wait()
            while s not in ended:   # its waiter thread notes the time it ended
                time.sleep(0.05)
            rc, t1 = ended[s]
            if rc or not sides[s].lib.is_file():
                raise RuntimeError(f"{s}'s plugin build failed (rc {rc}): {logs / f'ab-lib-{s}.log'}")
            data.setdefault("libs", {})[s] = {"path": str(sides[s].lib), "bytes": sides[s].lib.stat().st_size,
                                              "sha256": sha256(sides[s].lib), "build_s": round(t1 - t0, 1),
                                              "tuning_sha256": sha256(sides[s].tuning)}

    def engines():
        data["errors"].pop("engines-during-libs", None)
        left = [k for s in SIDES for k in build_engines(s, data["engine_keys"])]
        graphs = {}
        for name in models():
            rewritten = {s: sides[s].models / name / "model.int8.plugins-all.onnx" for s in SIDES}
            graphs[name] = {s: sha256(p) if p.is_file() else None for s, p in rewritten.items()}
            graphs[name]["identical"] = len({graphs[name][s] for s in SIDES}) == 1 and graphs[name]["after"] is not None
        data["rewritten_graphs"] = graphs
        data.setdefault("incomplete", {})["engines"] = left or None
        if left:
            log(f"engines left for the next call: {left}")

    def measure():
        import onnx

        keys = [k for k in data["engine_keys"] if all(s in data.get("engines", {}).get(k, {}) for s in SIDES)]
        if not keys:
            raise RuntimeError("no engine built on both sides yet (stage engines)")
        if not deadline.allows(args.time_estimate_s):   # loading, two rounds and the profiles
            data.setdefault("incomplete", {})["time"] = "not started: too little time left before the deadline"
            return
        families = {}
        for key in keys:
            model, _, mode = split_key(key)
            if mode == "all":
                families[key] = {s: families_of(onnx.load(str(sides[s].models / model / "model.int8.plugins-all.onnx")))
                                 for s in SIDES}
        data["families"] = families
        shutil.copy2(TIMER, work / "ab_timer.py")   # one file, outside both trees, for both workers
        workers = {}
        for s in SIDES:
            env = sides[s].env(base)
            env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p)
            workers[s] = Proc([sys.executable, str(work / "ab_timer.py")], env, str(work), logs / f"ab-timer-{s}.log")
        try:
            for s in SIDES:
                r = workers[s].ask({"cmd": "load", "lib": str(sides[s].lib),
                                    "engines": {k: {"path": data["engines"][k][s]["path"], "batch": split_key(k)[1]}
                                                for k in keys}}, min(300, max(deadline.left(), 60)))
                if not r["ok"]:
                    raise RuntimeError(f"{s} timer: {r['error']}")
                data.setdefault("timer", {})[s] = {"gpu": r["gpu"], "trt": r["trt"]}
            data["trt_version"] = data["timer"]["after"]["trt"]

            def ask(s, req):
                r = workers[s].ask(req, 120)
                if not r["ok"]:
                    raise RuntimeError(f"{s} timer, {req}: {r['error']}")
                return r

            iters = {k: max(2, math.ceil(args.target_ms / ask("before", {"cmd": "time", "key": k, "iters": 2,
                                                                        "reps": 1})["ms"][0])) for k in keys}
            data["iters"] = iters
            rounds = {k: {s: [] for s in SIDES} for k in keys}
            telemetry = [{"at": "start", **nvidia_smi()}]
            t_round = None
            for r in range(args.rounds):
                if r >= 2 and t_round and not deadline.allows(t_round + args.profile_estimate_s):
                    log(f"deadline: {r} rounds of {args.rounds}")
                    break
                t0 = time.time()
                for i, k in enumerate(keys):
                    for s in order(r, i):
                        ms = ask(s, {"cmd": "time", "key": k, "iters": iters[k], "reps": args.reps})["ms"]
                        rounds[k][s].append(statistics.median(ms))
                telemetry.append({"at": f"round {r}", **nvidia_smi()})
                t_round = time.time() - t0
                log(f"round {r}: {t_round:.1f} s; " + ", ".join(
                    f"{k} {rounds[k]['before'][-1]:.3f}/{rounds[k]['after'][-1]:.3f} ms" for k in keys))
            data["rounds"] = rounds
            profiles = {k: {s: [] for s in SIDES} for k in families}
            for r in range(args.profile_rounds):
                for i, k in enumerate(families):
                    for s in order(r, i):
                        profiles[k][s].append(ask(s, {"cmd": "profile", "key": k, "runs": args.profile_runs})["layers"])
            data["profiles"] = profiles
            telemetry.append({"at": "end", **nvidia_smi()})
            data["telemetry"] = telemetry
        finally:
            for w in workers.values():
                try:
                    w.ask({"cmd": "quit"}, 10)
                except (RuntimeError, OSError, ValueError):
                    pass
                w.close()
        missing = [k for k in data["engine_keys"] if k not in keys]
        data.setdefault("incomplete", {})["time"] = missing or None

    def tests():
        env = {**base}
        wheels = sorted((args.pack / "wheels").glob("*.whl")) if (args.pack / "wheels").is_dir() else []
        if wheels:  # onnxruntime (cp310) and the like, for AFTER's tests only
            site = work / "py310"
            for w in wheels:
                stamp = site / f".{w.name}.done"
                if not stamp.exists():
                    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(w), str(site)], check=True)
                    stamp.touch()
            env["PYTHONPATH"] = f"{site}{os.pathsep}{env.get('PYTHONPATH', '')}"
        results = data.setdefault("tests", {})
        left = []
        for name, marks, files, est in TESTS:
            if results.get(name, {}).get("rc") in (0, 5):
                continue
            if not deadline.allows(est):
                left.append(name)
                continue
            argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-m", marks, "-p", "no:cacheprovider", *files]
            t0 = time.time()
            try:
                p = subprocess.run(argv, cwd=REPO, env=tests_env(name, env), capture_output=True, text=True,
                                   check=False, timeout=max(deadline.left(), 30))
                stdout, rc = p.stdout, p.returncode
                (logs / f"ab-{name}.log").write_text(p.stdout + p.stderr)
            except subprocess.TimeoutExpired as e:   # killed at the deadline: run it again in the next call
                partial = e.stdout or ""
                partial = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
                stdout, rc = partial + "\n(stopped at the deadline)", "timeout"
                left.append(name)
            results[name] = parse_pytest(stdout, rc, time.time() - t0, argv[1:])
            log(f"{name}: rc {rc}, {results[name]['summary']}")
            save()
        probe = ("import importlib, json\nv = {}\nfor m in ('pytest', 'onnxruntime', 'tritonclient'):\n    try:\n"
                 "        v[m] = getattr(importlib.import_module(m), '__version__', 'yes')\n    except Exception as e:\n"
                 "        v[m] = None\nprint(json.dumps(v))")
        found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
        data["test_python"] = {"python": sys.version.split()[0], "carried_wheels": [w.name for w in wheels],
                               **(json.loads(found.stdout) if found.returncode == 0 else {"probe": found.stderr[-300:]})}
        data.setdefault("incomplete", {})["tests"] = left or None
        # pytest's 5: nothing selected (gpu-test without tritonclient: its Triton files skip, its lanes tests are CPU)
        failing = [n for n, r in results.items() if r.get("rc") not in (0, 5, "timeout")]
        if failing:
            raise RuntimeError("failing tests: " + ", ".join(failing))

    for name, fn in (("libs", libs), ("engines", engines), ("time", measure), ("tests", tests)):
        stage(name, fn)
    save()
    b = data["bars"]
    log(f"wrote {out}: bars {'met' if b['met'] else 'NOT met' if b['complete'] else 'incomplete'}"
        f"{'; ' + '; '.join(b['failures']) if b['failures'] else ''}; errors: {data['errors'] or 'none'}"
        f"; left for another call: {({k: v for k, v in data.get('incomplete', {}).items() if v}) or 'nothing'}")
    return 0 if not data["errors"] else 1


def parse_pytest(stdout: str, rc: int, seconds: float, argv: list[str]) -> dict:
    """pytest -rA's short summary: every test's outcome by name, and its last line."""
    outcomes = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"):
            outcomes.setdefault(word.lower(), []).append(rest.strip())
    tail = [line for line in stdout.splitlines() if line.strip()]
    return {"rc": rc, "summary": tail[-1].strip("= ") if tail else "", "seconds": round(seconds, 1),
            "command": "python3.10 " + " ".join(argv), **outcomes}


# ============================================================================= CLI
def _batches(text: str) -> list[int]:
    try:
        out = [int(b) for b in text.split(",") if b]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise UserError(f"--batches '{text}' is no list of batch sizes", "give comma-separated integers, e.g. 256,2048")
    return out


def _stages(text: str | None) -> list[str] | None:
    if text is None:
        return None
    out = [s for s in text.split(",") if s]
    bad = [s for s in out if s not in STAGES]
    if bad or not out:
        raise UserError(f"unknown stage(s) {','.join(bad) or repr(text)}", f"choose --stages from {','.join(STAGES)}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("pack", help="CPU: BEFORE's files, the models the bundle lacks and wheels, into --out")
    k.add_argument("--before", default=DEFAULT_BEFORE, help="the commit to compare with (default: %(default)s)")
    k.add_argument("--out", type=Path, default=PACK)
    k.add_argument("--models-dir", type=Path, default=REPO / ".devcache" / "e2e" / "models",
                   help="prepared model folders (trtfuse bench bundle prepare's models/)")
    k.add_argument("--models", default=LITE0, help="those to pack (the device bundle carries resnet50)")
    k.add_argument("--wheel", type=Path, action="append", default=[],
                   help="a cp310/py3 wheel the tests need and the staging lacks (onnxruntime); repeatable")
    r = sub.add_parser("run", help="GPU machine: build both sides, time them, run AFTER's GPU tests")
    r.add_argument("--pack", type=Path, default=PACK, help="what `pack` wrote (carried: .devcache/ab)")
    r.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-results/redesign_ab.json"),
                   help="the record, merged over calls; logs beside it in logs/")
    r.add_argument("--work", type=Path, default=WORK, help="built libraries, engines, model copies (kept)")
    r.add_argument("--bundle-models", type=Path, default=BUNDLE_MODELS, help="where ResNet-50 is (the device bundle)")
    r.add_argument("--stages", default=None,
                   help=f"of {','.join(STAGES)} (default: those not done yet in --out)")
    r.add_argument("--batches", default="256,2048", help="ResNet-50's (default: %(default)s)")
    r.add_argument("--rounds", type=int, default=8, help="timing rounds, sides alternating")
    r.add_argument("--reps", type=int, default=5, help="repetitions per engine, side and round (their median)")
    r.add_argument("--target-ms", type=float, default=100.0, help="length of one repetition")
    r.add_argument("--profile-rounds", type=int, default=3, help="layer-profile rounds, sides alternating")
    r.add_argument("--profile-runs", type=int, default=10, help="profiled inferences per engine, side and round")
    r.add_argument("--share-timing-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="AFTER builds with BEFORE's TensorRT timing cache (the same tactics for the same layers)")
    r.add_argument("--deadline-s", type=float, default=540.0,
                   help="start no work that would not end within this many seconds")
    r.add_argument("--build-estimate-s", type=float, default=100.0, help="what one engine build may take")
    r.add_argument("--profile-estimate-s", type=float, default=40.0, help="what the layer profiles take")
    r.add_argument("--time-estimate-s", type=float, default=120.0, help="the least time the time stage starts with")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.cmd == "pack":
        models = [m for m in args.models.split(",") if m]
        m = pack(args.before, args.out, args.models_dir, models, args.wheel)
        print(f"packed {m['before'][:12]} ({m['layout']} layout, {m['files_archived']} files), models {models}, "
              f"wheels {m['wheels']}: {m['bytes'] / 1e6:.1f} MB in {args.out}")
        return 0
    args.stages, args.batches = _stages(args.stages), _batches(args.batches)
    for name in ("rounds", "reps", "profile_rounds", "profile_runs"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)} is less than 1", "give 1 or more")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
