"""`trtfuse bench`: the suites it lists, the one-line errors for a bad suite, kind, layer or option, every suite's
--help, and the device runbook and benchmarks/README.md against the suites (no GPU: nothing here measures)."""

import json
import re
from pathlib import Path

import pytest

from trtfuse import bench
from trtfuse.bench import layers
from trtfuse.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_bench_help_lists_every_suite(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\S+)  ", out, flags=re.M)
    assert listed == list(bench.SUITES)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "bench" in capsys.readouterr().out


@pytest.mark.parametrize("argv,says", [
    (["bench", "nope"], "unknown bench suite 'nope': choose from layers,"),
    (["bench", "layers", "--kind", "nope"], "unknown layer kind 'nope': choose --kind from residual, conv3x3, stem, next"),
    (["bench", "layers", "--kind", "stem", "--qdq"], "--qdq does not apply to --kind stem"),
    (["bench", "layers", "--kind", "residual", "--no-trt"], "--no-trt does not apply to --kind residual"),
    (["bench", "layers", "--kind", "conv3x3", "--layers", "layer1.conv2,layer9"],
     "unknown conv3x3 layer(s) layer9: choose --layers from layer1.conv2,"),
    (["bench", "layers", "--kind", "next", "--batches", "2,x"], "--batches '2,x': give comma-separated integers"),
])
def test_a_bad_suite_kind_layer_or_option_is_one_line(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("suite", list(bench.SUITES))
def test_every_suite_answers_help(suite, capsys):
    """Each suite's module imports and parses; where this Python lacks what it needs, the one-line UserError."""
    try:
        with pytest.raises(SystemExit) as e:
            main(["bench", suite, "--help"])
    except pytest.fail.Exception:
        err = capsys.readouterr().err
        assert "needs" in err and err.count("\n") == 1, err
        pytest.skip(err.strip())
    assert e.value.code == 0
    assert f"usage: trtfuse bench {suite}" in capsys.readouterr().out


def test_the_layer_kinds_table():
    for name, kind in layers.KINDS.items():
        names = kind.names()
        assert names and set(kind.default) <= set(names), name
        assert (Path(layers.__file__).parent / f"{kind.module}.py").is_file(), name
        assert kind.options <= {"qdq", "config", "no_trt", "peak_tops"}, name
    _, args = layers.resolve(["--kind", "residual", "--stages", "fused1,res2", "--batches", "2"])
    assert args.layers == ["fused1", "res2"] and args.batches == [2] and args.reps == 100
    assert args.out == str(bench.RESULTS / "residual_conv_h100.json")
    _, args = layers.resolve(["--kind", "next", "--pairs", layers.STEM_PAIR, "--out", "x.json"])
    assert args.layers == [layers.STEM_PAIR] and args.reps == 30 and args.out == "x.json"
    _, args = layers.resolve(["--kind", "conv3x3"])
    assert args.layers == list(layers.CONV3X3_LAYERS) and args.peak_tops == 1979.0


def test_the_device_runbook_calls_suites_that_exist():
    text = (REPO / "tools" / "device_trt.sh").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    suites = re.findall(r"-m trtfuse bench (\S+)", code)
    assert suites and set(suites) <= set(bench.SUITES), suites
    assert set(re.findall(r"--kind (\S+)", code)) == set(layers.KINDS)
    # no step runs a script out of benchmarks/ other than the device runbooks and the experiments
    scripts = re.findall(r"benchmarks/(\S+\.py)", code)
    assert all(s.startswith("experiments/") for s in scripts), scripts
    for runbook in (REPO / "benchmarks").glob("*.sh"):
        for module in re.findall(r"-m (trtfuse\.bench\.\w+)", runbook.read_text()):
            assert (REPO / "src" / (module.replace(".", "/") + ".py")).is_file(), (runbook.name, module)


def test_benchmarks_top_level_and_the_records_the_readme_cites():
    top = [p.name for p in (REPO / "benchmarks").iterdir() if p.name not in ("experiments", "results")]
    assert len(top) <= 8, top
    readme = (REPO / "benchmarks" / "README.md").read_text()
    for suite in bench.SUITES:
        assert f"`{suite}`" in readme, suite
    cited = set(re.findall(r"`([\w.\-]+\.(?:json|txt|log))`", readme))
    missing = [name for name in cited if not (REPO / "benchmarks" / "results" / name).exists()
               and not name.startswith(("multigpu_h100", "any_resnet_", "edge_submission", "offline_gap",
                                                   "redesign_ab"))]
    assert not missing, missing


def test_a_layer_record_keeps_every_row_that_ran(tmp_path):
    """measure() rewrites the record after each row: a case that fails leaves the rows before it on disk."""
    _, args = layers.resolve(["--kind", "conv3x3", "--layers", "layer1.conv2,layer2.conv2", "--batches", "2,4",
                              "--out", str(tmp_path / "r.json")])
    ran = []

    def case(name, n):
        if len(ran) == 3:
            raise RuntimeError("the fourth row fails")
        ran.append((name, n))
        return {"layer": name, "batch": n}

    with pytest.raises(RuntimeError):
        layers.measure(args, {"gpu": "x", "layers": []}, "layers", case)
    record = json.loads((tmp_path / "r.json").read_text())
    assert [(r["layer"], r["batch"]) for r in record["layers"]] == ran == [
        ("layer1.conv2", 2), ("layer1.conv2", 4), ("layer2.conv2", 2)]
