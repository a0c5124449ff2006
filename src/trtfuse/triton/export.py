"""``trtfuse triton export``: a model repository that NVIDIA Triton's TensorRT backend loads, from an
engine ``trtfuse build`` made.

    trtfuse triton export MODEL --engine ENGINE --out REPO [--name NAME] [--gpus 0,1]
        [--instances-per-gpu N] [--preferred-batch-sizes 128,256] [--max-queue-delay-us 100]
        [--plugin-lib PATH] [--force]

It writes ``REPO/<name>/``: ``config.pbtxt`` (model_io's Triton model on platform ``tensorrt_plan``:
the engine's input and outputs, its profile's max batch, dynamic batching, one instance group per GPU
with each instance on its own optimization profile), ``1/model.plan`` (the engine, copied),
``plugins/libtrtfuse_plugins.so`` when the engine uses trtfuse's plugins (Triton skips a model
folder's non-numeric sub-folders), and ``tritonserver.txt``: the command line that loads it, which
is also printed.

What the engine takes and gives is read by TensorRT itself where it can run here (TensorRT imports
and a GPU is visible): that is authoritative. Elsewhere it comes from the sidecar ``ENGINE.json``
that build_engine wrote beside the engine, plus the prepared model. Where both exist and disagree,
the engine wins and a note says so. The written config.pbtxt is parsed back and compared with the
model meant. The model folder is built in a temporary folder beside REPO and renamed into place, so
a failure leaves no half-written ``REPO/<name>``; other models in REPO are never touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from trtfuse.config import plugin_mode
from trtfuse.errors import UserError
from trtfuse.files import swap_into_place
from trtfuse.triton import model_io
from trtfuse.triton.model_io import COMMAND_FILE, PLUGIN_DIR

PLATFORM = "tensorrt_plan"
PLAN_FILE = "model.plan"        # the file name Triton's TensorRT backend looks for in a version folder
VERSION = "1"
PLUGIN_FILE = "libtrtfuse_plugins.so"
DEFAULT_QUEUE_DELAY_US = 100


@dataclasses.dataclass(frozen=True)
class EngineIO:
    """What a TensorRT engine takes and gives, in Triton's type names, and how it was built."""

    input_name: str
    input_dtype: str                  # INT8 or FP32
    input_dims: tuple[int, ...]       # C, H, W (no batch)
    scores_name: str
    scores_dtype: str
    num_classes: int
    top_k: int                        # classes of the top_classes output (0: the engine has none)
    max_batch: int                    # the largest batch every optimization profile takes
    profiles: int                     # optimization profiles
    plugins: bool | None              # uses trtfuse's plugins (None: could not tell)
    tensorrt: str = ""                # the TensorRT version it was built with ("" where unknown)
    gpu: str = ""                     # the GPU it was built on ("" where unknown)

    # Fields both readers give; where they differ the engine's reading is taken.
    COMPARED = ("input_name", "input_dtype", "input_dims", "scores_name", "scores_dtype", "num_classes",
                "top_k", "max_batch", "profiles", "plugins")


# ----------------------------------------------------------------------------- what the engine is
def sidecar_path(engine: Path) -> Path:
    """Where build_engine writes the engine's description: ENGINE.json beside ENGINE.engine."""
    return engine.with_suffix(".json")


def read_sidecar(engine: Path) -> dict | None:
    """The engine's ENGINE.json as build_engine wrote it, or None where there is none."""
    path = sidecar_path(engine)
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        missing = [key for key in ("batch", "profiles", "input_format", "top_k", "plugins")
                   if key not in meta["config"]]
        if missing:
            raise KeyError(f"config has no {', '.join(missing)}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not the description trtfuse build writes beside an engine ({e})",
                        "rebuild the engine with `trtfuse build` (it writes ENGINE.json), or delete the file "
                        "and export where TensorRT can read the engine") from None
    return meta


def engine_io_from_sidecar(sidecar: dict, prepared) -> EngineIO:
    """EngineIO from build_engine's ENGINE.json and the prepared model the engine was built from."""
    cfg = sidecar["config"]
    return EngineIO(
        input_name=prepared.input_name,
        input_dtype="INT8" if cfg["input_format"] == "int8" else "FP32",
        input_dims=tuple(int(d) for d in prepared.input_shape),
        # build_engine leaves the network's output types alone: the ONNX model's float32 scores.
        scores_name=prepared.output_name, scores_dtype="FP32", num_classes=int(prepared.num_classes),
        top_k=int(cfg["top_k"]), max_batch=int(cfg["batch"]),
        profiles=max(int(cfg["profiles"]), 1),  # as build_engine: at least one profile
        # "off" / "tails" / "all" (sidecars of older builds: true / false)
        plugins=plugin_mode(cfg["plugins"]) != "off", tensorrt=str(sidecar.get("tensorrt", "")),
        gpu=str(sidecar.get("gpu", "")))


def usable_tensorrt():
    """TensorRT's module where it can read an engine here (it imports and a GPU is visible), else None."""
    try:
        from trtfuse import cuda_runtime
        from trtfuse.engine import import_tensorrt

        trt = import_tensorrt()
        return trt if cuda_runtime.device_count() > 0 else None
    except (UserError, ImportError, OSError):
        return None


def read_engine_with_tensorrt(engine: str | os.PathLike, plugin_lib: str | os.PathLike | None = None,
                              trt=None) -> EngineIO:
    """EngineIO as TensorRT reads the serialized engine (needs TensorRT and a GPU). ``plugin_lib`` is
    loaded first: an engine with trtfuse's plugins deserializes only once their creators are registered."""
    from trtfuse.engine import import_tensorrt
    from trtfuse.trt_graph import TOP_CLASSES, load_plugin_library
    from trtfuse.engine_inspect import is_ours

    trt = trt or import_tensorrt()
    path = Path(engine)
    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    if plugin_lib is not None:
        load_plugin_library(str(plugin_lib))
    runtime = trt.Runtime(logger)
    eng = runtime.deserialize_cuda_engine(path.read_bytes())
    if eng is None:
        raise UserError(f"TensorRT {trt.__version__} could not deserialize {path} (see its log above)",
                        "check it is an engine built with this TensorRT version; an engine with trtfuse's "
                        "plugins also needs the plugin library (`trtfuse plugins build`, or --plugin-lib)")
    names = [eng.get_tensor_name(i) for i in range(eng.num_io_tensors)]
    inputs = [n for n in names if eng.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if eng.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    scores = [n for n in outputs if n != TOP_CLASSES]
    if len(inputs) != 1 or len(scores) != 1:
        raise UserError(f"{path} has inputs {inputs} and outputs {outputs}; a trtfuse engine has one input, "
                        f"the scores and {TOP_CLASSES!r}", "export an engine built by `trtfuse build`")

    def triton_dtype(name: str) -> str:
        dtype = eng.get_tensor_dtype(name).name
        if dtype not in model_io.TENSORRT_DTYPE:
            raise UserError(f"tensor {name!r} of {path} is {dtype}, a type trtfuse's Triton model does not use",
                            "export an engine built by `trtfuse build`")
        return model_io.TENSORRT_DTYPE[dtype]

    def dims(shape) -> tuple[int, ...]:
        return tuple(int(d) for d in shape)

    in_name, scores_name = inputs[0], scores[0]
    profiles = int(eng.num_optimization_profiles)
    largest = [dims(eng.get_tensor_profile_shape(in_name, p)[2]) for p in range(profiles)]
    top_k = dims(eng.get_tensor_shape(TOP_CLASSES))[-1] if TOP_CLASSES in outputs else 0
    plugins = None
    if hasattr(eng, "create_engine_inspector"):
        # Layer names (TensorRT names a plugin layer after its ONNX node, which trtfuse's rewrites name
        # after the plugin); an engine built without layer information lists none: then unknown.
        info = json.loads(eng.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
        layers = [layer if isinstance(layer, str) else layer.get("Name", "") for layer in info.get("Layers", [])]
        plugins = any(is_ours(layer) for layer in layers) if layers else None
    return EngineIO(
        input_name=in_name, input_dtype=triton_dtype(in_name), input_dims=largest[0][1:],
        scores_name=scores_name, scores_dtype=triton_dtype(scores_name),
        num_classes=dims(eng.get_tensor_shape(scores_name))[-1], top_k=top_k,
        max_batch=min(shape[0] for shape in largest), profiles=profiles, plugins=plugins,
        tensorrt=str(trt.__version__))


def describe_engine(engine: Path, prepared, plugin_lib: str | os.PathLike | None = None) -> tuple[EngineIO, list[str]]:
    """The engine's EngineIO (TensorRT's reading where it can run here, else the sidecar's) and notes."""
    sidecar = read_sidecar(engine)
    if sidecar is not None and sidecar.get("model") != prepared.name:
        raise UserError(f"{engine} was built from model {sidecar.get('model')!r}, not {prepared.name!r} "
                        f"(per {sidecar_path(engine).name})", f"pass the model it was built from: "
                        f"trtfuse triton export {sidecar.get('model')} --engine {engine} ...")
    from_sidecar = engine_io_from_sidecar(sidecar, prepared) if sidecar is not None else None
    trt = usable_tensorrt()
    if trt is None:
        if from_sidecar is None:
            raise UserError(f"cannot tell what {engine} takes and gives: {sidecar_path(engine).name} is not beside "
                            "it and TensorRT cannot read it here (not installed, or no GPU)",
                            "keep the ENGINE.json `trtfuse build` wrote beside the engine, or export on a machine "
                            "with TensorRT and a GPU")
        return from_sidecar, []

    if from_sidecar is not None and from_sidecar.plugins:
        lib = plugin_library(plugin_lib)
    else:  # loaded where it exists, in case the engine needs it
        try:
            lib = plugin_library(plugin_lib)
        except UserError:
            lib = None
    from_engine = read_engine_with_tensorrt(engine, lib, trt)
    if from_sidecar is None:
        return from_engine, []
    if from_engine.plugins is None:
        from_engine = dataclasses.replace(from_engine, plugins=from_sidecar.plugins)
    from_engine = dataclasses.replace(from_engine, tensorrt=from_sidecar.tensorrt or from_engine.tensorrt,
                                      gpu=from_sidecar.gpu)
    notes = [f"the engine's {field} is {getattr(from_engine, field)!r}, {sidecar_path(engine).name} and the "
             f"prepared model say {getattr(from_sidecar, field)!r}: the engine's is used"
             for field in EngineIO.COMPARED if getattr(from_engine, field) != getattr(from_sidecar, field)]
    return from_engine, notes


def plugin_library(path: str | os.PathLike | None = None) -> Path:
    """The plugin library to ship: ``path``, else the one trtfuse.trt_graph.load_plugin_library would load
    ($TRTFUSE_PLUGIN_LIB, else the build folder), found without loading it."""
    from trtfuse.plugin_build import library_path

    if path is None:
        try:
            return library_path("plugins").resolve()
        except UserError as e:
            raise UserError(f"the engine needs trtfuse's plugins, but {e.problem}",
                            f"{e.fix}, or pass --plugin-lib PATH") from None
    lib = Path(path).expanduser()
    if not lib.is_file():
        raise UserError(f"the TensorRT plugin library {lib} does not exist",
                        "build it with `trtfuse plugins build --tensorrt-root $TENSORRT_ROOT` "
                        "(against the TensorRT of the Triton that will load it), or fix --plugin-lib")
    return lib.resolve()


# ----------------------------------------------------------------------------- what is written
def find_prepared(spec: str):
    """The prepared model ``spec`` names: a prepared folder, a model name prepared under $TRTFUSE_HOME,
    or an .onnx file. A named model is never prepared here: the engine was built from a prepared one,
    and preparing anew could describe another model."""
    from trtfuse import models
    from trtfuse.models.prepared import META_FILE

    path = Path(spec).expanduser()
    if path.is_dir():
        return models.load_prepared(path)
    if spec.endswith(".onnx"):
        from trtfuse.session import resolve_model

        return resolve_model(spec)  # imports the file (prepare's cache): nothing is downloaded
    folder = models.default_model_dir(spec)
    if not (folder / META_FILE).is_file():
        raise UserError(f"model {spec!r} is not prepared ({folder} holds no model.json)",
                        f"prepare it first with `trtfuse prepare {spec}` (as for `trtfuse build`), or pass the "
                        "prepared folder the engine was built from")
    return models.load_prepared(folder)


def parse_index_list(text: str, what: str, example: str) -> list[int]:
    """"0,1" -> [0, 1]: comma-separated non-negative integers, each once."""
    try:
        values = [int(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 0 or len(set(values)) != len(values):
        raise UserError(f"{what} {text!r} is not a comma-separated list of distinct numbers",
                        f"e.g. {what} {example}")
    return values


def tritonserver_text(repo: Path, folder: Path, io: EngineIO, plugin: Path | None) -> str:
    """The command line that loads the model in ``repo`` (absolute paths) and the rules it depends on."""
    repo_arg = shlex.quote(f"--model-repository={repo}")
    version = io.tensorrt or "(not recorded)"
    gpu = io.gpu or "(not recorded: there was no ENGINE.json beside the engine)"
    lines = [f"# Load {folder.name} in NVIDIA Triton Inference Server (written by `trtfuse triton export`):"]
    if plugin is not None:
        lines += [f"tritonserver {repo_arg} {shlex.quote(f'--backend-config=tensorrt,plugins={plugin}')}",
                  "# or, with the plugin library preloaded into the server process:",
                  f"LD_PRELOAD={shlex.quote(str(plugin))} tritonserver {repo_arg}",
                  "",
                  f"- TensorRT: the engine was built with TensorRT {version}. Triton's TensorRT must be that same "
                  f"version, and the plugin library must be built against it too (`trtfuse plugins build "
                  f"--tensorrt-root DIR`): use the Triton release whose TensorRT is {version}, per Triton's "
                  "release notes."]
    else:
        lines += [f"tritonserver {repo_arg}",
                  "",
                  f"- TensorRT: the engine was built with TensorRT {version}. Triton's TensorRT must be that same "
                  f"version: use the Triton release whose TensorRT is {version}, per Triton's release notes."]
    lines += [f"- GPU: an engine runs only on the GPU model it was built for: {gpu}.",
              "- Paths are this machine's; where Triton runs in a container, use the repository's path there."]
    return "\n".join(lines) + "\n"


def export_repository(prepared, engine: str | os.PathLike, repo: str | os.PathLike, *, name: str | None = None,
                      gpus: list[int] | tuple[int, ...] = (0,), instances_per_gpu: int | None = None,
                      preferred_batch_sizes: list[int] | None = None,
                      max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
                      plugin_lib: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Write ``repo/<name>/`` for Triton's TensorRT backend from ``engine`` (built from ``prepared``,
    a ``trtfuse.models.PreparedModel``); returns the model folder. ``instances_per_gpu`` defaults to
    the engine's number of optimization profiles, ``preferred_batch_sizes`` to its max batch."""
    engine = Path(engine).expanduser().absolute()
    repo = Path(repo).expanduser().absolute()
    name = name or prepared.name
    gpus = list(gpus)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise UserError(f"{name!r} cannot be a Triton model name (it names a folder in the repository)",
                        "use letters, digits and . _ - (--name)")
    if not gpus or min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise UserError(f"GPUs {gpus} are not distinct GPU indices", "e.g. --gpus 0 or --gpus 0,1")
    if instances_per_gpu is not None and instances_per_gpu < 1:
        raise UserError(f"--instances-per-gpu {instances_per_gpu} is impossible", "use 1 or more")
    if max_queue_delay_us < 0:
        raise UserError(f"--max-queue-delay-us {max_queue_delay_us} is negative", "use 0 or more microseconds")
    if not engine.is_file() or engine.stat().st_size == 0:
        raise UserError(f"engine file {engine} " + ("is empty" if engine.is_file() else "does not exist"),
                        "pass the .engine file `trtfuse build` printed")
    if repo.exists() and not repo.is_dir():
        raise UserError(f"--out {repo} is a file, not a model repository folder", "choose a folder for --out")
    target = repo / name
    if (target.exists() or target.is_symlink()) and not force:
        raise UserError(f"{target} exists", "pass --force to replace it (other models in the repository stay "
                        "as they are), or choose another --name")

    io, notes = describe_engine(engine, prepared, plugin_lib)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    plugin = plugin_library(plugin_lib) if io.plugins else None
    if io.plugins is None:
        print("note: could not tell whether the engine uses trtfuse's plugins (no ENGINE.json, no layer names "
              "in the engine): no plugin library is shipped", file=sys.stderr)
    elif plugin_lib is not None and not io.plugins:
        print(f"note: the engine does not use trtfuse's plugins: --plugin-lib {plugin_lib} is not shipped",
              file=sys.stderr)
    instances = instances_per_gpu or io.profiles
    if instances > io.profiles:
        print(f"note: {instances} instances per GPU on {io.profiles} optimization profile(s): instances share "
              "profiles, which a TensorRT 8 profile allows one context at a time", file=sys.stderr)
    preferred = list(preferred_batch_sizes or [io.max_batch])
    if min(preferred) < 1 or max(preferred) > io.max_batch:
        raise UserError(f"preferred batch sizes {preferred} must lie between 1 and the engine's max batch "
                        f"{io.max_batch}", f"e.g. --preferred-batch-sizes {io.max_batch}")

    served = dataclasses.replace(prepared, input_name=io.input_name, input_shape=io.input_dims,
                                 output_name=io.scores_name, num_classes=io.num_classes)
    model = model_io.triton_model(served, io.input_dtype, io.max_batch, io.top_k, io.scores_dtype, name)
    cfg = model_io.model_config(model, platform=PLATFORM, gpus=gpus, instances_per_gpu=instances,
                                profiles=io.profiles, preferred_batch_sizes=preferred,
                                max_queue_delay_us=max_queue_delay_us)
    text = model_io.config_text(cfg)
    # What Triton will read must say what was meant: parse it back with the same schema.
    parsed = model_io.parse_config(text)
    if parsed != cfg or model_io.model_from_config(parsed) != model:
        raise RuntimeError(f"config.pbtxt written for {name} does not parse back to the model meant:\n"
                           f"meant {model}\nread  {model_io.model_from_config(parsed)}\n{text}")

    shipped_plugin = target / PLUGIN_DIR / PLUGIN_FILE if plugin else None
    command = tritonserver_text(repo, target, io, shipped_plugin)

    def fill(folder: Path) -> None:
        (folder / VERSION).mkdir(parents=True)
        (folder / "config.pbtxt").write_text(text)
        shutil.copyfile(engine, folder / VERSION / PLAN_FILE)
        if plugin is not None:
            (folder / PLUGIN_DIR).mkdir()
            shutil.copyfile(plugin, folder / PLUGIN_DIR / PLUGIN_FILE)
            os.chmod(folder / PLUGIN_DIR / PLUGIN_FILE, 0o755)
        (folder / COMMAND_FILE).write_text(command)

    _build_in_place(target, force, fill)
    return target


def _build_in_place(target: Path, force: bool, fill) -> None:
    """``fill(folder)`` in a temporary folder, then rename it to ``target`` (replacing it with ``force``).
    On any failure the temporary folder goes and ``target`` is as it was."""
    repo = target.parent
    # Beside the repository, so that Triton (polling the repository) never sees a half-written model; but
    # a rename cannot cross file systems: where the repository is a mount of its own, hidden inside it.
    scratch_parent = repo.parent
    if repo.is_dir() and os.stat(repo).st_dev != os.stat(repo.parent).st_dev:
        scratch_parent = repo
    scratch_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{repo.name}-{target.name}.tmp-", dir=scratch_parent))
    try:
        built = scratch / target.name
        built.mkdir(mode=0o755)
        fill(built)
        repo.mkdir(parents=True, exist_ok=True)
        if (target.exists() or target.is_symlink()) and not force:  # someone made it meanwhile
            raise UserError(f"{target} exists", "pass --force to replace it, or choose another --name")
        swap_into_place(built, target, old=scratch / "replaced")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("triton", help="NVIDIA Triton Inference Server: export a model repository, build "
                              "Triton's TensorRT backend, serve the repository with it",
                              description="NVIDIA Triton Inference Server and trtfuse's models.")
    sub = p.add_subparsers(dest="triton_command", required=True, metavar="COMMAND")
    e = sub.add_parser("export", help="a model repository for Triton's TensorRT backend from a built engine",
                       description=" ".join(__doc__.split("\n\n")[0].split()).replace("``", ""))
    e.add_argument("model", metavar="MODEL",
                   help="the prepared model the engine was built from (a name, a prepared folder, or an .onnx file)")
    e.add_argument("--engine", required=True, metavar="FILE", help="the engine `trtfuse build` printed")
    e.add_argument("--out", required=True, metavar="REPO", help="the model repository folder (made if missing)")
    e.add_argument("--name", help="the Triton model name (default: the model's name)")
    e.add_argument("--gpus", default="0", metavar="I,I", help="GPU indices, one instance group each (default %(default)s)")
    e.add_argument("--instances-per-gpu", type=int, metavar="N",
                   help="instances per GPU, each on its own optimization profile (default: the engine's profiles; "
                        "1 served LoadGen Server best on the H200: docs/triton_tensorrt_backend.md)")
    e.add_argument("--preferred-batch-sizes", metavar="N,N",
                   help="dynamic batching's preferred sizes (default: the engine's max batch)")
    e.add_argument("--max-queue-delay-us", type=int, default=DEFAULT_QUEUE_DELAY_US, metavar="US",
                   help="how long dynamic batching may hold a request to fill a batch (default %(default)s)")
    e.add_argument("--plugin-lib", metavar="PATH",
                   help="libtrtfuse_plugins.so to ship (default: the built one, or $TRTFUSE_PLUGIN_LIB)")
    e.add_argument("--force", action="store_true", help="replace REPO/NAME if it exists")
    from trtfuse.triton import backend_build, native

    backend_build.add_parser(sub)
    native.add_parser(sub)
    return p


def main(args: argparse.Namespace) -> int:
    """``trtfuse triton export``: write the repository, print where and the tritonserver command."""
    if args.triton_command in ("build-backend", "serve"):
        from trtfuse.triton import backend_build, native

        return (backend_build if args.triton_command == "build-backend" else native).main(args)
    if args.triton_command != "export":
        raise UserError(f"unknown triton command {args.triton_command!r}",
                        "use `trtfuse triton export`, `build-backend` or `serve`")
    gpus = parse_index_list(args.gpus, "--gpus", "0,1")
    preferred = None
    if args.preferred_batch_sizes is not None:
        preferred = parse_index_list(args.preferred_batch_sizes, "--preferred-batch-sizes", "128,256")
    folder = export_repository(find_prepared(args.model), args.engine, args.out, name=args.name, gpus=gpus,
                               instances_per_gpu=args.instances_per_gpu, preferred_batch_sizes=preferred,
                               max_queue_delay_us=args.max_queue_delay_us, plugin_lib=args.plugin_lib,
                               force=args.force)
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    print(f"trtfuse: wrote {folder} ({', '.join(files)})")
    print((folder / COMMAND_FILE).read_text(), end="")
    return 0
