"""`trtfuse bench ab` on the CPU: the pack (BEFORE's files, models, wheels; written whole, checked on read), the
arguments, the record's ratios and bars on made-up timings, the families of a rewritten graph's layers, the order
the sides take turns in, the child protocol, and the timer's command loop with a fake worker (no GPU: nothing here
measures)."""

import io
import os
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import onnx
import pytest
from onnx import helper

from trtfuse.bench import ab, ab_timer
from trtfuse.cli import main
from trtfuse.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def fake_model(root: Path, name: str = ab.LITE0) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.json").write_text(json.dumps({"name": name}))
    (d / "model.int8.onnx").write_bytes(b"\0" * 1000)
    return root


def test_pack_holds_before_files_models_and_wheels_and_is_checked_on_read(tmp_path):
    models = fake_model(tmp_path / "models")
    wheel = tmp_path / "onnxruntime-1.0-cp310-cp310-linux_x86_64.whl"
    wheel.write_bytes(b"PK wheel")
    out = tmp_path / "ab"
    m = ab.pack("HEAD", out, models, [ab.LITE0], [wheel], repo=REPO)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert m["before"] == head and m["layout"] == "src" and m["models"] == [ab.LITE0]
    assert set(m["files"]) == {"before.tar.gz", "models.tar.gz", f"wheels/{wheel.name}"}
    with tarfile.open(out / "before.tar.gz") as tar:
        names = tar.getnames()
    assert {"src/trtfuse/engine.py", "plugins/common/cuda_check.h", "tools/dev_env.sh", ab.TUNING} <= set(names)
    assert not [n for n in names if n.startswith(("docs", "tests", ".ci")) or
                (n.startswith("benchmarks/results/") and n != ab.TUNING)]
    with tarfile.open(out / "models.tar.gz") as tar:
        assert f"{ab.LITE0}/model.json" in tar.getnames()
    assert ab.read_pack(out)["before"] == head
    # packed again: the folder is replaced whole, nothing of the last pack stays
    ab.pack("HEAD", out, models, [], [], repo=REPO)
    assert sorted(p.name for p in out.iterdir()) == ["before.tar.gz", "manifest.json"]
    assert not list(tmp_path.glob("ab.*"))
    (out / "before.tar.gz").write_bytes(b"changed")
    with pytest.raises(UserError, match="differs from the pack's manifest"):
        ab.read_pack(out)


@pytest.mark.parametrize("argv,says", [
    (["pack", "--before", "no-such-commit"], "unknown commit 'no-such-commit'"),
    (["pack", "--before", "HEAD", "--models-dir", "/nonexistent"], "is no prepared model folder"),
    (["pack", "--before", "HEAD", "--models", "", "--wheel", "/nonexistent.whl"], "is not a wheel file"),
    (["run", "--stages", "libs,bogus"], "unknown stage(s) bogus. choose --stages from libs,engines,time,tests"),
    (["run", "--batches", "2,x"], "--batches '2,x' is no list of batch sizes"),
    (["run", "--rounds", "0"], "--rounds 0 is less than 1"),
    (["run", "--pack", "/nonexistent"], "/nonexistent/manifest.json does not exist"),
])
def test_bad_input_is_one_line(argv, says, capsys, tmp_path):
    if argv[0] == "pack":
        argv = [*argv, "--out", str(tmp_path / "ab")]
    assert main(["bench", "ab", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "ab").exists()


def fake_record(before_ms, after_ms, before_layers, after_layers):
    key = "resnet50/b2048/all"
    fams = {"TrtfuseResidualConv_0": "tail+next", "TrtfuseResidualConv_conv3x3_0": "conv3x3"}
    return {"engine_keys": ["resnet50/b2048/off", key],
            "rounds": {"resnet50/b2048/off": {"before": [30.0, 30.2, 29.8], "after": [30.1, 30.0, 29.9]},
                       key: {"before": before_ms, "after": after_ms}},
            "profiles": {key: {"before": before_layers, "after": after_layers}},
            "families": {key: {"before": fams, "after": fams}}}


def test_ratios_and_bars_on_made_up_timings(tmp_path):
    layers = [{"TrtfuseResidualConv_0": 1.0, "TrtfuseResidualConv_conv3x3_0": 0.5, "conv1 + relu": 2.0,
               "Reformatting CopyNode for Input Tensor 0 to TrtfuseResidualConv_0": 0.1}] * 3
    data = fake_record([24.0, 24.2, 23.8], [24.0, 24.1, 24.0], layers, layers)
    out = tmp_path / "r.json"
    ab.write(out, data)
    got = json.loads(out.read_text())
    row = got["engine_time"]["resnet50/b2048/all"]
    assert row["before_ms"] == 24.0 and row["after_ms"] == 24.0 and row["ratio"] == 1.0 and row["bar_met"]
    assert row["after_samples_per_s"] == round(2048 / 24.0 * 1e3, 1) and row["after_rounds"] == 3
    fams = got["layer_time"]["resnet50/b2048/all"]["families"]
    assert fams["tail+next"]["ratio"] == 1.0 and fams["tail+next"]["bar_met"] and fams["conv3x3"]["layers"] == 1
    assert fams["trt"]["after_ms"] == 2.0 and "bar_met" not in fams["trt"] and fams["reformat"]["after_ms"] == 0.1
    assert got["bars"] == {**got["bars"], "complete": True, "met": True, "failures": []}
    assert not list(tmp_path.glob("*.tmp"))

    # after 2 % slower in the engine and 5 % in the 3x3 family: both named; TensorRT's own layers are no bar
    slower = [{**layers[0], "TrtfuseResidualConv_conv3x3_0": 0.5 / 0.95, "conv1 + relu": 3.0}] * 3
    data = fake_record([24.0] * 3, [24.0 / 0.98] * 3, layers, slower)
    ab.summarize(data)
    assert data["engine_time"]["resnet50/b2048/all"]["ratio"] == 0.98
    assert data["bars"]["complete"] and not data["bars"]["met"]
    assert data["bars"]["failures"] == ["engine resnet50/b2048/all: 0.98", "layers resnet50/b2048/all conv3x3: 0.95"]
    assert data["layer_time"]["resnet50/b2048/all"]["under_bar"] == 1

    # layers that TensorRT named otherwise than the plugin nodes: no verdict, and said so
    data = fake_record([24.0] * 3, [24.0] * 3, layers, [{"layer_7": 1.0, "conv1 + relu": 2.0}] * 3)
    ab.summarize(data)
    assert not data["bars"]["complete"] and data["bars"]["failures"] == [
        "layers resnet50/b2048/all: no after layer named after a plugin node (e.g. layer_7)"]

    # a side without timings: no verdict
    data = fake_record([24.0] * 3, [], layers, layers)
    ab.summarize(data)
    assert data["engine_time"]["resnet50/b2048/all"]["ratio"] is None
    assert not data["bars"]["complete"] and not data["bars"]["met"]


def plugin(name, inputs, **attrs):
    return helper.make_node("TrtfuseResidualConv", inputs, [name + "_y"], name=name, domain="trtfuse", **attrs)


def test_the_layers_families_come_from_the_rewritten_graph():
    nodes = [plugin("t", ["x", "r"]), plugin("tn", ["x", "r"], next_weights=[1]), plugin("p", ["x"]),
             plugin("f", ["x"], proj_weights=[1]), plugin("c3", ["x"], kernel_size=3),
             plugin("st", ["x"], kernel_size=7, next_weights=[1]),
             helper.make_node("TrtfuseAvgPool", ["x"], ["h", "l"], name="pool", domain="trtfuse"),
             helper.make_node("Relu", ["x"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.INT8, [1])], [])
    fams = ab.families_of(helper.make_model(graph))
    assert fams == {"t": "tail", "tn": "tail+next", "p": "proj", "f": "fused", "c3": "conv3x3", "st": "stem+next",
                    "pool": "pool"}
    assert ab.layer_family("c3", fams) == "conv3x3"
    assert ab.layer_family("relu", fams) == "trt" and ab.layer_family("t2", fams) == "trt"
    assert ab.layer_family("Reformatting CopyNode for Input Tensor 0 to t", fams) == "reformat"
    assert ab.layer_family("pool + something", fams) == "pool"
    assert ab.layer_family("PWN(c3)", fams) == "conv3x3" and ab.layer_family("c3.1", fams) == "trt"


def test_the_sides_take_turns():
    firsts = {}
    for r in range(4):
        for i in range(3):
            o = ab.order(r, i)
            assert sorted(o) == sorted(ab.SIDES)
            firsts.setdefault(i, []).append(o[0])
    assert all(f.count("before") == f.count("after") == 2 for f in firsts.values())
    assert ab.engine_keys([256, 2048]) == ["resnet50/b256/off", "resnet50/b256/all", "resnet50/b2048/off",
                                           "resnet50/b2048/all", f"{ab.LITE0}/b256/off", f"{ab.LITE0}/b256/all"]
    assert ab.split_key("resnet50/b2048/all") == ("resnet50", 2048, "all")


def test_a_child_answers_by_its_mark_and_a_silent_one_times_out(tmp_path):
    script = ("import json, sys\nfor line in sys.stdin:\n    print('a line of its own', flush=True)\n"
              "    print('AB-RESULT ' + json.dumps({'ok': True, 'got': json.loads(line)}), flush=True)\n")
    p = ab.Proc([sys.executable, "-c", script], None, str(tmp_path), tmp_path / "child.log", ab.MARK)
    assert p.ask({"batch": 2}, 30) == {"ok": True, "got": {"batch": 2}}
    assert p.ask({"batch": 3}, 30)["got"] == {"batch": 3}
    p.close()
    assert (tmp_path / "child.log").read_text().count("a line of its own") == 2
    silent = ab.Proc([sys.executable, "-c", "import sys; sys.stdin.read()"], None, str(tmp_path),
                     tmp_path / "silent.log", ab.MARK)
    with pytest.raises(RuntimeError, match="no answer in 1 s"):
        silent.ask({"batch": 2}, 1)


class FakeWorker:
    def load(self, lib, engines):
        return {"gpu": "fake", "trt": "0", "engines": {k: {"io": []} for k in engines}}

    def time(self, key, iters, reps, warmup):
        return {"ms": [float(iters)] * reps}

    def profile(self, key, runs):
        return dict(zip(("layers", "total_ms"), ab_timer.layer_medians([{"a": 1.0, "b": 2.0}, {"a": 3.0}] * runs)))


def test_the_timer_command_loop():
    lines = [json.dumps(c) for c in (
        {"cmd": "load", "lib": "x.so", "engines": {"k": {"path": "e", "batch": 2}}},
        {"cmd": "time", "key": "k", "iters": 4, "reps": 2}, {"cmd": "profile", "key": "k", "runs": 1},
        {"cmd": "nope"}, {"cmd": "time", "key": "k"}, {"cmd": "quit"}, {"cmd": "time", "key": "k", "iters": 1,
                                                                      "reps": 1})]
    answers = []
    ab_timer.serve(io.StringIO("\n".join(lines) + "\n"), answers.append, FakeWorker())
    assert answers[0] == {"ok": True, "gpu": "fake", "trt": "0", "engines": {"k": {"io": []}}}
    assert answers[1] == {"ok": True, "ms": [4.0, 4.0]}
    assert answers[2] == {"ok": True, "layers": {"a": 2.0, "b": 2.0}, "total_ms": 3.0}
    assert answers[3] == {"ok": False, "error": "ValueError: unknown command 'nope'"}
    assert not answers[4]["ok"] and "KeyError" in answers[4]["error"]
    assert answers[5] == {"ok": True} and len(answers) == 6   # nothing after quit
    assert ab_timer.median([3, 1, 2]) == 2 and ab_timer.median([4, 1, 2, 3]) == 2.5


def test_the_timer_runs_as_a_file_and_answers_on_its_own_stdout():
    """Run as a file (as the driver runs it), its folder's cuda.py does not shadow cuda-python, and what else writes
    to fd 1 lands on stderr."""
    p = subprocess.run([sys.executable, str(ab.TIMER)], input=json.dumps({"cmd": "nope"}) + "\n" +
                       json.dumps({"cmd": "quit"}) + "\n", capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert [json.loads(x) for x in p.stdout.splitlines()] == [
        {"ok": False, "error": "ValueError: unknown command 'nope'"}, {"ok": True}]


FAKE_LIB = ("import os, pathlib; p = pathlib.Path(os.environ['TRTFUSE_PLUGIN_LIB']); "
            "p.parent.mkdir(parents=True, exist_ok=True); p.write_text(os.getcwd())")
# Builds nothing: an engine file naming the trtfuse that "built" it, and for plugins all the rewritten graph
FAKE_BUILDER = r"""
import json, os, sys
from pathlib import Path
import trtfuse
from onnx import helper, save
for line in sys.stdin:
    r = json.loads(line)
    model = Path(r["model_dir"])
    path = Path(os.environ["TRTFUSE_HOME"]) / "engines" / f"{model.name}-b{r['batch']}-{r['plugins']}.engine"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(trtfuse.__file__)
    if r["plugins"] == "all":
        node = helper.make_node("TrtfuseResidualConv", ["x", "r"], ["y"], name="TrtfuseResidualConv_0",
                                domain="trtfuse")
        save(helper.make_model(helper.make_graph([node], "g", [], [])), model / "model.int8.plugins-all.onnx")
    with open(os.environ["TRTFUSE_HOME"] + "/built.log", "a") as f:
        f.write(path.name + "\n")
    print("noise on stdout")
    print("AB-RESULT " + json.dumps({"ok": True, "engine": str(path), "seconds": 0.0}), flush=True)
"""
FAKE_TIMER = r"""
import json, os, sys
sys.path.insert(0, SRC)
from trtfuse.bench import ab_timer
side = "before" if "/before/" in os.environ["TRTFUSE_PLUGIN_LIB"] else "after"

class W:
    def load(self, lib, engines):
        assert side in lib and all(os.path.isfile(e["path"]) for e in engines.values())
        return {"gpu": "fake", "trt": "8.5.3.1", "engines": {}}

    def time(self, key, iters, reps, warmup):
        _, b, mode = key.split("/")
        return {"ms": [(30.0 if mode == "off" else 24.0) * int(b[1:]) / 2048 * (1.001 if side == "after" else 1)] * reps}

    def profile(self, key, runs):
        return {"layers": {"TrtfuseResidualConv_0": 1.0, "conv1": 2.0}, "total_ms": 3.0}

out = os.fdopen(os.dup(1), "w")
ab_timer.serve(sys.stdin, lambda a: (out.write(json.dumps(a) + "\n"), out.flush()), W())
"""


def test_a_run_with_fake_builds_and_timer_resumes_and_keeps_each_sides_code(tmp_path, monkeypatch, capsys):
    """The run's flow on the CPU, the GPU work faked: the libraries, each side's engines built by its own trtfuse,
    the timer's rounds, the tests stage; run again, nothing is done twice; past the deadline nothing starts."""
    fake_model(tmp_path / "models")
    bundle = fake_model(tmp_path / "bundle", "resnet50")
    pack_dir = tmp_path / "ab"
    ab.pack("HEAD", pack_dir, tmp_path / "models", [ab.LITE0], [], repo=REPO)
    timer = tmp_path / "timer.py"
    timer.write_text(FAKE_TIMER.replace("SRC", repr(str(REPO / "src"))))
    monkeypatch.setattr(ab, "PLUGIN_BUILD", ("-c", FAKE_LIB))
    monkeypatch.setattr(ab, "BUILDER", FAKE_BUILDER)
    monkeypatch.setattr(ab, "TIMER", timer)
    monkeypatch.setattr(ab, "TESTS", (("one", "not gpu", ("tests/test_bench_ab.py::test_the_sides_take_turns",), 5),))
    monkeypatch.setenv("TENSORRT_ROOT", str(tmp_path))
    monkeypatch.setenv("TRTFUSE_BUILD_DIR", str(tmp_path / "after-build"))
    monkeypatch.setenv("AB_AFTER_COMMIT", "cafe")
    out, work = tmp_path / "results" / "r.json", tmp_path / "work"
    argv = ["bench", "ab", "run", "--pack", str(pack_dir), "--out", str(out), "--work", str(work),
            "--bundle-models", str(bundle), "--rounds", "2", "--reps", "3", "--profile-rounds", "1",
            "--profile-runs", "2", "--target-ms", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["errors"] == {} and data["done"] == sorted(ab.STAGES)
    assert data["before"]["commit"] == ab.read_pack(pack_dir)["before"] and data["before"]["layout"] == "src"
    assert set(data["libs"]) == set(ab.SIDES) and Path(data["libs"]["after"]["path"]).parent == tmp_path / "after-build"
    assert Path(data["libs"]["before"]["path"]).read_text().startswith(str(work / "before" / "tree-"))
    assert set(data["engines"]) == set(data["engine_keys"]) and len(data["engine_keys"]) == 6
    for key, sides in data["engines"].items():
        built_by = {s: Path(sides[s]["path"]).read_text() for s in ab.SIDES}
        assert built_by["before"].startswith(str(work / "before")), (key, built_by)
        assert built_by["after"] == str(REPO / "src" / "trtfuse" / "__init__.py"), (key, built_by)
    assert data["rewritten_graphs"]["resnet50"]["identical"]
    assert all(len(r[s]) == 2 for r in data["rounds"].values() for s in ab.SIDES)
    row = data["engine_time"]["resnet50/b2048/all"]
    assert row["before_ms"] == 24.0 and row["ratio"] == round(1 / 1.001, 4)
    assert data["layer_time"]["resnet50/b256/all"]["families"]["tail"]["ratio"] == 1.0
    assert data["bars"]["complete"] and data["bars"]["met"]
    assert data["tests"]["one"]["rc"] == 0 and len(data["tests"]["one"]["passed"]) == 1
    assert data["test_python"]["pytest"] and data["test_python"]["carried_wheels"] == []
    assert data["after"]["commit"] in ("cafe", subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                                              capture_output=True, text=True, check=True).stdout.strip())

    built = (work / "before" / "home" / "built.log").read_text()
    assert main(argv) == 0
    again = json.loads(out.read_text())
    assert (work / "before" / "home" / "built.log").read_text() == built and len(again["calls"]) == 2
    assert again["calls"][0]["command"] == "trtfuse bench ab " + " ".join(argv[2:])
    assert again["rounds"] == data["rounds"]

    late = tmp_path / "late.json"
    assert main([*argv[:6], str(late), *argv[7:], "--deadline-s", "0"]) == 0
    data = json.loads(late.read_text())
    assert set(data["incomplete"]) == set(ab.STAGES) and "libs" not in data and not data["bars"]["complete"]


def test_the_timer_profiles_and_times_one_engine_with_one_optimization_profile():
    """TensorRT 8.5 gives an engine's one optimization profile to one live context: a second context has none and
    its enqueue fails (seen on the H200: "Assertion mOptimizationProfile >= 0 failed"). The worker times, profiles
    and times again on such an engine, with the profiler only on the profiled runs."""
    import gc
    import weakref

    import numpy as np

    class Context:
        def __init__(self, engine):
            self.engine, self.profiler = engine, None
            held = [c for c in (r() for r in engine.contexts) if c is not None]
            self.profile = -1 if held else 0
            engine.contexts.append(weakref.ref(self))

        def set_input_shape(self, name, shape):
            self.shape = shape

        def get_tensor_shape(self, name):
            return self.shape

        def set_tensor_address(self, name, ptr):
            pass

        def execute_async_v3(self, stream):
            if self.profile < 0:
                return False
            if self.profiler is not None:
                self.profiler.report_layer_time("conv", 1.0)
            self.engine.runs.append("profiled" if self.profiler is not None else "timed")
            return True

    class Engine:
        num_io_tensors, num_optimization_profiles = 1, 1

        def __init__(self):
            self.contexts, self.runs = [], []

        def create_execution_context(self):
            return Context(self)

        def get_tensor_name(self, i):
            return "input"

        def get_tensor_mode(self, name):
            return "in"

        def get_tensor_profile_shape(self, name, profile):
            assert profile == 0
            return [(1, 3), (2, 3), (4, 3)]

        def get_tensor_components_per_element(self, name):
            return 1

        def get_tensor_vectorized_dim(self, name):
            return -1

        def get_tensor_dtype(self, name):
            return "int8"

    class Trt:
        class TensorIOMode:
            INPUT = "in"

        class IProfiler:
            def __init__(self):
                pass

        @staticmethod
        def nptype(dtype):
            return np.int8

    class Rt:
        cudaMalloc = staticmethod(lambda n: (0, 1))
        cudaMemset = cudaStreamSynchronize = cudaEventRecord = cudaEventDestroy = staticmethod(lambda *a: (0,))
        cudaEventCreate = staticmethod(lambda: (0, object()))
        cudaEventElapsedTime = staticmethod(lambda a, b: (0, 2.0))

    class Cuda:
        rt = Rt

        def ck(self, result):
            return ab_timer._Cuda.ck(self, result)

    worker = ab_timer.Worker()
    worker.trt, worker.np, worker.cuda, worker.stream = Trt, np, Cuda(), 0
    engine = Engine()
    ctx, _ = worker._context(engine, 2)
    worker.engines["k"] = {"engine": engine, "batch": 2, "ctx": ctx, "profiled": False}
    del ctx
    gc.collect()
    assert worker.time("k", iters=1, reps=1, warmup=0) == {"ms": [2.0]}
    assert worker.profile("k", runs=2) == {"layers": {"conv": 1.0}, "total_ms": 1.0}
    assert worker.time("k", iters=1, reps=1, warmup=0) == {"ms": [2.0]}
    # the profiler stays off the timed runs; the profiled context's two warm-up runs carry none yet
    assert engine.runs == ["timed", "timed", "timed", "profiled", "profiled", "timed"]


def test_gpu_test_takes_the_triton_payloads_numpy_first(monkeypatch):
    env = {"PYTHONPATH": "/src", "X": "1"}
    monkeypatch.delenv("TRTFUSE_TRITON_NUMPY1", raising=False)
    assert ab.tests_env("gpu-test", env) == env
    monkeypatch.setenv("TRTFUSE_TRITON_NUMPY1", "/tmp/triton/numpy1")
    assert ab.tests_env("gpu-test", env) == {"PYTHONPATH": f"/tmp/triton/numpy1{os.pathsep}/src", "X": "1"}
    assert ab.tests_env("conv-test", env) == env
    assert ab.tests_env("gpu-test", {})["PYTHONPATH"] == "/tmp/triton/numpy1"
