"""`trtfuse submission`: an MLPerf submission tree from real (short) LoadGen runs, MLCommons' own
accuracy scorer against trtfuse's top-1, the refusals a submitter expects, and the machine's
description (src/trtfuse/sysinfo.py) on this CPU machine."""

import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest_harness import MLPERF_DIR, ScriptedBackend, SyntheticDataset, needs_mlperf, tiny_model
from trtfuse import accuracy, config, session, submission, sysinfo
from trtfuse.backends import create_backend
from trtfuse.errors import UserError

SYSTEM = "1xCPU_trtfuse"
# MLPerf's implementation description fields (the checker's SYSTEM_IMP_REQUIRED_FILES).
IMPLEMENTATION_FIELDS = ("input_data_types", "retraining", "starting_weights_filename",
                         "weight_data_types", "weight_transformations")


# -- real LoadGen runs, made once for the module --------------------------------------------------

def _settings(out: Path, **overrides):
    base = {"run.output_dir": str(out), "run.batch_size": 16, "run.warmup_batches": 1,
            "run.watchdog_s": 30.0, "offline.min_duration_ms": 300, "offline.min_query_count": 1,
            "offline.target_qps": 20000.0, "server.min_duration_ms": 1000, "server.min_query_count": 700,
            "server.target_qps": 700.0, "server.target_latency_ms": 1000.0}
    return config.load(overrides={**base, **overrides})


def _run(out, model, dataset, backend, command=None, **overrides):
    s = _settings(out, **overrides)
    backend.load(model, s["run"]["batch_size"])
    kwargs = {"command": command} if command else {}
    report = session.run(s, progress=False, model=model, dataset=dataset, backend=backend, **kwargs)
    return Path(report["run_dir"]), report


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    model = tiny_model(base)
    made = {}
    # Offline performance, VALID: at most 16 samples per 2 ms, below the 20000/s LoadGen expects, so
    # its one query outlasts the min duration whatever the machine (as in test_loadgen_runs).
    made["offline_perf"], r = _run(
        base, model, SyntheticDataset(64), ScriptedBackend(create_backend("null"), delay_s=0.002),
        command=["trtfuse", "run", "--model", "tiny", "--scenario", "offline", "--min-duration-s", "0.3"])
    assert r["loadgen"]["valid"], r["loadgen"]
    # Offline accuracy: 40 samples, 20 right at top-1 -> 50 %.
    made["offline_acc"], r = _run(base, model, SyntheticDataset(40, rank=[0, 0, 2, 7] * 10),
                                  create_backend("onnxruntime"), **{"run.mode": "accuracy", "run.batch_size": 8})
    assert r["accuracy"]["top1"] == 0.5
    # Server performance, VALID whatever the machine: a bound (60 s) no query of a 1 s run can miss.
    made["server_perf"], r = _run(base, model, SyntheticDataset(64), create_backend("null"),
                                  **{"run.scenario": "server", "run.batch_size": 8,
                                     "server.target_latency_ms": 60000.0})
    assert r["loadgen"]["valid"], r["loadgen"]
    # Offline performance, INVALID whatever the machine: 33 samples answered at once, a 60 s minimum.
    made["offline_invalid"], r = _run(base, model, SyntheticDataset(64), create_backend("null"),
                                      **{"offline.target_qps": 0.5, "offline.min_duration_ms": 60000})
    assert not r["loadgen"]["valid"], r["loadgen"]
    # Accuracy with random weights.
    made["random_acc"], r = _run(base, replace(model, random_weights=True), SyntheticDataset(8),
                                 create_backend("onnxruntime"), **{"run.mode": "accuracy", "run.batch_size": 8})
    assert r["random_weights"]
    return made


def fake_compliance(base: Path, test="TEST01", scenario="offline", passed=True, model="tiny",
                    audited: Path | None = None) -> Path:
    """A folder as `trtfuse compliance` writes it: TEST/ as run_verification.py leaves it + compliance.json
    (with the command line; without it, and with an audited/ run folder, when ``audited`` is given)."""
    c = base / f"compliance-{test}-{scenario}-{'pass' if passed else 'fail'}"
    verdict = "TEST PASS" if passed else "TEST FAIL"
    (c / test / "performance" / "run_1").mkdir(parents=True)
    (c / test / "performance" / "run_1" / "mlperf_log_summary.txt").write_text("Result is : VALID\n")
    (c / test / "verify_performance.txt").write_text(verdict + "\n")
    if test == "TEST01":
        (c / test / "accuracy").mkdir()
        (c / test / "accuracy" / "mlperf_log_accuracy.json").write_text("[]\n")
        (c / test / "verify_accuracy.txt").write_text(verdict + "\n")
    info = {"test": test, "scenario": scenario, "passed": passed, "model": model}
    if audited is None:
        info["command"] = ["trtfuse", "compliance", test, "--scenario", scenario, "--out", str(c)]
    else:
        shutil.copytree(audited, c / "audited")
        report = json.loads((c / "audited" / "report.json").read_text())
        report.update(audit_config=f"compliance/{test}/audit.config", command=None)
        (c / "audited" / "report.json").write_text(json.dumps(report))
    (c / "compliance.json").write_text(json.dumps(info))
    return c


def submit(out: Path, *inputs, system=SYSTEM, extra=(), mlperf_dir=MLPERF_DIR, partial=True) -> int:
    """`trtfuse submission`; ``partial``: these trees hold fewer scenarios than a round requires."""
    parser = argparse.ArgumentParser(prog="trtfuse")
    submission.add_parser(parser.add_subparsers(dest="command"))
    argv = ["submission", str(out), *map(str, inputs), "--system", system, *extra, *(["--partial"] if partial else [])]
    if mlperf_dir is not None:
        argv += ["--mlperf-dir", str(mlperf_dir)]
    return submission.main(parser.parse_args(argv))


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name + "."))


def mlcommons_scorer(run_dir: Path, work: Path) -> str:
    """MLCommons' accuracy-imagenet.py run here directly, on a val_map made independently."""
    qsl = json.loads((run_dir / "qsl.json").read_text())
    val_map = work / "val_map.txt"
    val_map.write_text("".join(f"{n} {lab}\n" for n, lab in zip(qsl["names"], qsl["labels"])))
    return subprocess.run([sys.executable, str(MLPERF_DIR / "tools" / "accuracy-imagenet.py"),
                           "--mlperf-accuracy-file", str(run_dir / "mlperf_log_accuracy.json"),
                           "--imagenet-val-file", str(val_map), "--dtype", "int32"],
                          capture_output=True, text=True, check=True).stdout


# -- the tree ------------------------------------------------------------------------------------

@needs_mlperf
def test_tree_from_runs_and_compliance(runs, tmp_path, capsys):
    comp = fake_compliance(tmp_path)
    out = tmp_path / "closed" / "trtfuse-org"
    assert submit(out, runs["offline_perf"], runs["offline_acc"], runs["server_perf"], comp,
                  extra=["--submitter", "TestOrg", "--division", "open"]) == 0
    table = capsys.readouterr().out

    # LoadGen 6.0.17 carries round v6.1's seeds: the v6 layout, measurements beside the results.
    res = meas = out / "results" / SYSTEM / "resnet50"
    for f in ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json"):
        assert (res / "Offline" / "performance" / "run_1" / f).read_bytes() == (runs["offline_perf"] / f).read_bytes()
        assert (res / "Server" / "performance" / "run_1" / f).read_bytes() == (runs["server_perf"] / f).read_bytes()
        assert (res / "Offline" / "accuracy" / f).read_bytes() == (runs["offline_acc"] / f).read_bytes()
    assert not (res / "Server" / "accuracy").exists()

    # accuracy.txt is MLCommons' scorer's output, and it agrees with trtfuse's own top-1.
    # MLCommons' truncate_accuracy_log.py then appended the full log's sha256.
    text = (res / "Offline" / "accuracy" / "accuracy.txt").read_text()
    full_log = (runs["offline_acc"] / "mlperf_log_accuracy.json").read_bytes()
    assert text == mlcommons_scorer(runs["offline_acc"], tmp_path) + f"\nhash={hashlib.sha256(full_log).hexdigest()}\n"
    assert text.startswith("accuracy=50.000%, good=20, total=40")
    ours = accuracy.evaluate(runs["offline_acc"])
    assert ours["top1"] == 20 / 40 and ours["n"] == 40

    # measurements: user.conf (the run's own), README with the commands, the implementation JSON.
    for scenario in ("Offline", "Server"):
        assert (meas / scenario / "README.md").is_file()
        impl = json.loads((meas / scenario / "measurements.json").read_text())
        assert all(impl.get(k) for k in IMPLEMENTATION_FIELDS), impl
        assert impl["weight_data_types"] == "fp32" and impl["plugins"] == []
    assert (meas / "Offline" / "user.conf").read_text() == (runs["offline_perf"] / "user.conf").read_text()
    assert "resnet50.Server.target_qps = 700" in (meas / "Server" / "user.conf").read_text()
    readme = (meas / "Offline" / "README.md").read_text()
    assert "trtfuse run --model tiny --scenario offline --min-duration-s 0.3" in readme  # recorded
    assert "--mode accuracy" in readme and "Rebuilt from the run's report.json" in readme  # rebuilt
    assert "tools/accuracy-imagenet.py" in readme and "trtfuse compliance TEST01" in readme

    # compliance copied as run_verification.py left it.
    test01 = res / "Offline" / "TEST01"
    assert (test01 / "verify_accuracy.txt").read_text() == "TEST PASS\n"
    assert (test01 / "performance" / "run_1" / "mlperf_log_summary.txt").is_file()

    # The system description, filled from this machine.
    desc = json.loads((out / "systems" / f"{SYSTEM}.json").read_text())
    assert all(k in desc for k in sysinfo.REQUIRED_FIELDS)
    assert desc["system_name"] == SYSTEM and desc["submitter"] == "TestOrg" and desc["division"] == "open"
    assert desc["host_processor_core_count"] >= 1 and desc["number_of_nodes"] == 1
    assert desc["host_memory_capacity"].endswith(("GB", "TB")) or desc["host_memory_capacity"] == "unknown"
    assert "ONNX Runtime" in desc["framework"]

    # submission.json and the table: what went where, and what is missing.
    summary = json.loads((out / "submission.json").read_text())
    entries = {(e["scenario"], e["entry"]): e for e in summary["entries"]}
    assert set(entries) == {("Offline", "performance"), ("Offline", "accuracy"), ("Server", "performance"),
                            ("Offline", "TEST01")}
    assert entries[("Offline", "performance")]["verdict"] == "VALID"
    assert entries[("Offline", "accuracy")]["accuracy"]["scorer"] == {"accuracy_percent": 50.0, "good": 20,
                                                                      "total": 40}
    assert entries[("Offline", "TEST01")]["verdict"] == "PASS"
    assert "Server accuracy" in summary["missing"] and "Offline TEST04" in summary["missing"]
    for word in ("samples/s", "completed samples/s", "VALID", "PASS", "missing", "top-1 50.000 %"):
        assert word in table, word
    assert leftovers(out) == []


def test_user_conf_and_command_rebuilt_for_older_runs(runs, tmp_path):
    old = tmp_path / "old-run"
    shutil.copytree(runs["offline_perf"], old)
    (old / "user.conf").unlink()
    report = json.loads((old / "report.json").read_text())
    for key in ("command", "official", "audit_config"):
        report.pop(key, None)
    (old / "report.json").write_text(json.dumps(report))
    out = tmp_path / "sub"
    assert submit(out, old, mlperf_dir=None) == 0  # performance only: no scorer needed
    meas = out / "results" / SYSTEM / "resnet50" / "Offline"
    conf = (meas / "user.conf").read_text()
    assert "resnet50.Offline.target_qps = 20000" in conf and "resnet50.Offline.min_duration = 300" in conf
    readme = (meas / "README.md").read_text()
    assert "trtfuse run --model tiny" in readme and "--min-duration-s 0.3" in readme and "Rebuilt" in readme


def test_compliance_command_rebuilt_from_its_audited_run(runs, tmp_path):
    comp = fake_compliance(tmp_path, "TEST04", audited=runs["offline_perf"])
    out = tmp_path / "sub"
    assert submit(out, runs["offline_perf"], comp, mlperf_dir=None) == 0
    readme = (out / "results" / SYSTEM / "resnet50" / "Offline" / "README.md").read_text()
    assert "trtfuse compliance TEST04 --model tiny --dataset demo --scenario offline --mode performance" in readme
    assert f"--out {comp}" in readme
    assert (out / "results" / SYSTEM / "resnet50" / "Offline" / "TEST04" / "verify_performance.txt").is_file()


def test_performance_only_tree_needs_no_mlperf_dir(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLPERF_INFERENCE_DIR", raising=False)
    out = tmp_path / "perf-only"
    assert submit(out, runs["server_perf"], mlperf_dir=None) == 0
    assert re.search(r"Offline +performance +- +- +missing", capsys.readouterr().out)
    with pytest.raises(UserError, match="MLPERF_INFERENCE_DIR"):
        submit(tmp_path / "with-acc", runs["offline_acc"], mlperf_dir=None)
    assert not (tmp_path / "with-acc").exists()


# -- refusals ------------------------------------------------------------------------------------

def test_refuses_a_missing_or_unknown_folder(runs, tmp_path):
    with pytest.raises(UserError, match=r"does not exist\. give run folders"):
        submit(tmp_path / "out", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="neither a run folder .no report.json. nor a compliance folder"):
        submit(tmp_path / "out", runs["offline_perf"], tmp_path / "empty")
    assert not (tmp_path / "out").exists()


def test_refuses_two_performance_runs_of_one_scenario(runs, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(runs["offline_perf"], twin)
    with pytest.raises(UserError, match="two performance runs for Offline.*give one performance run per scenario"):
        submit(tmp_path / "out", runs["offline_perf"], twin)


@needs_mlperf
def test_refuses_an_invalid_run_unless_allowed(runs, tmp_path, capsys):
    with pytest.raises(UserError, match=r"Offline performance run .* is INVALID \(min duration not met"
                                        r".*--allow-invalid"):
        submit(tmp_path / "out", runs["offline_invalid"])
    assert not (tmp_path / "out").exists()
    assert submit(tmp_path / "out", runs["offline_invalid"], extra=["--allow-invalid"]) == 0
    summary = json.loads((tmp_path / "out" / "submission.json").read_text())
    assert summary["entries"][0]["verdict"] == "INVALID"
    assert any("INVALID" in n and "--allow-invalid" in n for n in summary["notes"])
    fill = summary["system_description"]["fill_by_hand"]  # no --submitter: named once, like every field
    assert len(set(fill)) == len(fill)  # each field to fill by hand named once


def test_refuses_random_weights_for_accuracy(runs, tmp_path):
    with pytest.raises(UserError, match="used random weights: its accuracy would be meaningless.*real weights"):
        submit(tmp_path / "out", runs["offline_perf"], runs["random_acc"])


@needs_mlperf
def test_random_weights_accuracy_is_taken_for_allow_invalid(runs, tmp_path):
    # A performance-only tree of a random-weights model: its accuracy run is real and fails the target.
    assert submit(tmp_path / "out", runs["offline_perf"], runs["random_acc"], extra=["--allow-invalid"]) == 0
    summary = json.loads((tmp_path / "out" / "submission.json").read_text())
    assert any("random weights: taken for --allow-invalid" in n for n in summary["notes"])


def test_refuses_runs_of_different_models(runs, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(runs["server_perf"], other)
    report = json.loads((other / "report.json").read_text())
    report["model"] = "resnet50"
    (other / "report.json").write_text(json.dumps(report))
    with pytest.raises(UserError, match="different models: tiny .*resnet50 .*one model"):
        submit(tmp_path / "out", runs["offline_perf"], other)


def test_refuses_a_failed_compliance_test_or_a_compliance_run_given_as_a_result(runs, tmp_path):
    failed = fake_compliance(tmp_path, "TEST04", passed=False)
    with pytest.raises(UserError, match="compliance TEST04 for Offline failed"):
        submit(tmp_path / "out", runs["offline_perf"], failed)
    audited = tmp_path / "audited"
    shutil.copytree(runs["offline_perf"], audited)
    report = json.loads((audited / "report.json").read_text())
    report["audit_config"] = "compliance/TEST04/audit.config"
    (audited / "report.json").write_text(json.dumps(report))
    with pytest.raises(UserError, match="run of a compliance test .*compliance.json"):
        submit(tmp_path / "out", audited)
    assert not (tmp_path / "out").exists()


def test_refuses_an_existing_dir_unless_forced(runs, tmp_path):
    out = tmp_path / "sub"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(UserError, match="exists and is not empty.*--force"):
        submit(out, runs["server_perf"])
    assert (out / "old.txt").read_text() == "old"
    assert submit(out, runs["server_perf"], extra=["--force"]) == 0
    assert not (out / "old.txt").exists() and (out / "submission.json").is_file()
    assert leftovers(out) == []
    # --force never replaces a folder that holds an input.
    inner = out / "runs" / "r"
    shutil.copytree(runs["server_perf"], inner)
    with pytest.raises(UserError, match="lies inside .* would replace its own input"):
        submit(out, inner, extra=["--force"])


@needs_mlperf
def test_a_failure_midway_leaves_no_dir_behind(runs, tmp_path):
    # Sample 0 answered twice, the second time wrongly: MLCommons' scorer counts the first answer,
    # trtfuse the last, so the cross-check fails after the Offline performance run was copied.
    bad = tmp_path / "bad-acc"
    shutil.copytree(runs["offline_acc"], bad)
    log = json.loads((bad / "mlperf_log_accuracy.json").read_text())
    wrong = np.full(5, 9, dtype=np.int32).tobytes().hex().upper()
    log.append({"seq_id": 10**6, "qsl_idx": 0, "data": wrong})
    (bad / "mlperf_log_accuracy.json").write_text(json.dumps(log))
    out = tmp_path / "sub"
    with pytest.raises(UserError, match="MLCommons' scorer and trtfuse disagree .*20 of 40.*19 of 40"):
        submit(out, runs["offline_perf"], bad, runs["server_perf"])
    assert not out.exists() and leftovers(out) == []
    # With --force over an existing tree: that tree stays as it was.
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    with pytest.raises(UserError, match="disagree"):
        submit(out, runs["offline_perf"], bad, extra=["--force"])
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and leftovers(out) == []


def test_system_name_must_be_a_folder_name(runs, tmp_path):
    with pytest.raises(UserError, match="not a usable folder name"):
        submit(tmp_path / "out", runs["server_perf"], system="../escape")


# -- sysinfo -------------------------------------------------------------------------------------

def test_sysinfo_describes_this_cpu_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    info = sysinfo.probe()
    assert info["cpu_model"] and info["cpu_model"] != "unknown"
    assert info["cpu_logical"] == os.cpu_count() and info["cpu_cores_per_socket"] >= 1
    if Path("/proc/meminfo").is_file():
        assert isinstance(info["memory_bytes"], int) and info["memory_bytes"] > 2**27
    assert info["python"] == platform.python_version()
    assert info["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert info["loadgen"] == importlib.metadata.version("mlcommons-loadgen")
    assert (info["gpu_count"], info["gpu_names"], info["gpu_driver"]) == (0, [], "none")
    try:
        import tensorrt  # noqa: F401
    except Exception:
        assert info["tensorrt"] == "none"
    desc = sysinfo.system_description(info, system_name="box", submitter="me", division="closed",
                                      backends={"onnxruntime"})
    assert all(k in desc for k in sysinfo.REQUIRED_FIELDS + sysinfo.MORE_FIELDS)
    assert desc["accelerators_per_node"] == "0" and desc["accelerator_model_name"] == "none"
    assert desc["host_processor_model_name"] == info["cpu_model"]
    assert "cooling" in sysinfo.unknown_fields(desc)
    json.dumps(desc)  # plain JSON


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(0o755)


def test_sysinfo_reads_nvidia_smi(tmp_path, monkeypatch):
    _fake_tool(tmp_path / "bin", "nvidia-smi", """case "$*" in
  *--query-gpu=clocks*) echo "1980, 5, 16";;
  *--query-gpu=*) for i in 0 1; do echo "$i, GPU-0000000$i-aaaa, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"; done;;
  nvlink*) for i in 0 1 2; do echo "	 Link $i: 26.562 GB/s"; done;;
  *) echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |";;
esac""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    info = sysinfo.probe()
    assert info["gpu_count"] == 2 and info["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert info["gpu_memory_mib"] == [81559, 81559] and info["gpu_driver"] == "550.54.15"
    desc = sysinfo.system_description(info, system_name="b", submitter="s", division="closed",
                                      backends={"tensorrt"})
    assert desc["accelerators_per_node"] == 2 and desc["accelerator_model_name"] == "NVIDIA H100 80GB HBM3"
    assert desc["accelerator_memory_capacity"] == "80 GB" and desc["accelerator_memory_configuration"] == "HBM3"
    assert desc["accelerator_frequency"] == "1980 MHz (max SM clock)"
    assert desc["accelerator_host_interconnect"] == "PCIe Gen5 x16"
    assert desc["accelerator_interconnect"] == "NVLink (3 links per accelerator)"
    assert "driver 550.54.15" in desc["other_software_stack"] and "TensorRT" in desc["framework"]


@pytest.mark.parametrize("visible, count", [("1", 1), ("GPU-00000000", 1), ("0,1", 2), ("", 0), ("-1,0", 0)])
def test_sysinfo_counts_the_gpus_this_process_may_use(tmp_path, monkeypatch, visible, count):
    """A run on one GPU of a host (CUDA_VISIBLE_DEVICES) describes a system of one accelerator."""
    _fake_tool(tmp_path / "bin", "nvidia-smi", """case "$*" in
  *--query-gpu=index*) for i in 0 1; do echo "$i, GPU-0000000$i-aaaa, NVIDIA H200, 143771 MiB, 580.1"; done;;
  *) echo "CUDA Version: 13.0";;
esac""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    info = sysinfo.probe()
    assert info["gpu_count"] == count and info["gpu_names"] == ["NVIDIA H200"] * count


def test_sysinfo_probes_never_raise(tmp_path, monkeypatch):
    _fake_tool(tmp_path / "bin", "nvidia-smi", "echo broken >&2; exit 9")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))

    def unreadable(path):
        raise PermissionError(path)

    monkeypatch.setattr(sysinfo, "_read", unreadable)
    monkeypatch.setattr(sysinfo.shutil, "disk_usage", unreadable)
    monkeypatch.setattr(sysinfo.platform, "freedesktop_os_release", unreadable)
    info = sysinfo.probe()
    assert info["memory_bytes"] == "unknown" and info["disk_bytes"] == "unknown"
    assert info["gpu_count"] == 0 and info["gpu_driver"] == "unknown"  # there, but it failed
    assert info["os"] and info["cpu_logical"] == os.cpu_count()
    desc = sysinfo.system_description(info, system_name="b", submitter="s", division="open")
    assert desc["host_memory_capacity"] == "unknown" and desc["host_storage_capacity"] == "unknown"


@pytest.mark.parametrize("backend, devices, count", [("tensorrt", "", 1), ("tensorrt", "0,2", 2),
                                                     ("tensorrt", "all", 4), ("onnxruntime", "", 4)])
def test_the_system_has_the_gpus_the_run_used(backend, devices, count):
    """A TensorRT run on one GPU of a four-GPU host (tensorrt.devices "") is a system of one accelerator."""
    from trtfuse.submission import _gpus_used

    info = {"gpu_count": 4, "gpu_names": ["NVIDIA H200"] * 4, "gpu_memory_mib": [143771] * 4}
    used = _gpus_used(info, {"backend": backend, "settings": {"tensorrt": {"devices": devices}}})
    assert used["gpu_count"] == count and used["gpu_names"] == ["NVIDIA H200"] * count
    desc = sysinfo.system_description({**sysinfo.probe(), **used}, system_name="b", submitter="s",
                                      division="closed", system_type="edge")
    assert desc["accelerators_per_node"] == count
