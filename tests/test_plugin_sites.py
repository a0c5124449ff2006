"""Keeping a fusion only where it wins at the engine's batch: the site ids of the rewrite
(residual_conv_rewrite.site_id), the exclusion (tensorrt.plugin_exclude) honoured by the rewrite, and trtfuse.plugin_sites' mapping of TensorRT's
per-layer profiles onto the sites and its choice of the sites that lose (on fake profiles: no GPU)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from test_any_resnet import _check_reference
from test_fusions import _export
from trtfuse import config, plugin_sites
from trtfuse.build_config import BuildConfig
from trtfuse.errors import UserError
from trtfuse.passes import fusions
from trtfuse.passes import residual_conv_rewrite as rcr
from trtfuse.passes.bn_fold import fold_pad_into_conv
from trtfuse.passes.quantize import calibrate, quantize

ALL_COUNTS = {"tail": 14, "proj": 1, "fused": 2, "conv3x3": 3, "stem": 1, "next": 4, "pool": 1}


@pytest.fixture(scope="module")
def resnet50_qdq():
    """Our ResNet-50 export (random weights, 64 x 64), quantized as `trtfuse build` does, and a batch of two."""
    model, shape = _export("resnet50")
    model, _ = fold_pad_into_conv(model)
    x = np.random.default_rng(0).normal(size=(2, *shape)).astype(np.float32)
    return quantize(model, calibrate(model, [x], progress=False), "max").model, x


# ----------------------------------------------------------------------------- site ids and the exclusion
def test_every_plugin_node_lists_its_sites_and_what_it_replaced(resnet50_qdq):
    qdq, _ = resnet50_qdq
    r = fusions.rewrite(qdq, "all")
    assert r.counts == ALL_COUNTS
    plugin_nodes = [n.name for n in r.model.graph.node if n.domain == "trtfuse"]
    assert sorted(s["node"] for s in r.report.sites) == sorted(plugin_nodes)
    ids = [i for s in r.report.sites for i in s["sites"]]
    assert len(ids) == len(set(ids))
    kinds = [i.partition(":")[0] for i in ids]
    # one id per node of its kind, and one per chained conv1 (on the node that computes it)
    assert {k: kinds.count(k) for k in ALL_COUNTS} == ALL_COUNTS
    by = {s["node"]: s for s in r.report.sites}
    stem = next(s for s in r.report.sites if s["kind"] == "stem")
    assert stem["sites"] == ["stem:/conv1/Conv", "next:/layer1/layer1.0/conv1/Conv"]
    assert "/maxpool/MaxPool" in stem["replaced"] and "/layer1/layer1.0/conv1/Conv" in stem["replaced"]
    assert by["TrtfuseAvgPool_0"]["sites"] == ["pool:/avgpool/GlobalAveragePool"]
    # the replaced nodes are gone from the rewritten graph; the graph before had them
    before = {rcr.node_name(n) for n in qdq.graph.node}
    after = {rcr.node_name(n) for n in r.model.graph.node}
    for s in r.report.sites:
        assert set(s["replaced"]) <= before and not set(s["replaced"]) & after, s["node"]
    # ids name the Q/DQ graph's nodes, whatever the rewrite numbers its plugin nodes
    assert all(i.partition(":")[2] in before for i in ids)


# (exclusion, the counts that drop) on ResNet-50 under --plugins all
EXCLUSIONS = [
    (["tail:/layer4/layer4.2/Add"], {"tail": 13}),
    (["tail:/layer1/layer1.1/Add"], {"tail": 13, "next": 3}),       # its chained conv1 goes with it
    (["next:/layer1/layer1.2/conv1/Conv"], {"next": 3}),             # the tail stays, without the conv1
    (["fused:/layer2/layer2.0/Add"], {"fused": 1, "proj": 2, "tail": 15}),   # the pair as two nodes
    (["proj:/layer2/layer2.0/downsample/downsample.0/Conv"], {"fused": 1, "tail": 15}),   # the tail alone
    (["conv3x3:/layer1/layer1.0/conv2/Conv", "pool:/avgpool/GlobalAveragePool"], {"conv3x3": 2, "pool": 0}),
    (["stem:/conv1/Conv"], {"stem": 0, "next": 3}),
    (["tail:/layer1/layer1.1/Add", "next:/layer1/layer1.2/conv1/Conv"], {"tail": 13, "next": 3}),
]


@pytest.mark.parametrize("exclude,drop", EXCLUSIONS, ids=[",".join(e) for e, _ in EXCLUSIONS])
def test_the_rewrite_leaves_the_excluded_sites_to_tensorrt(resnet50_qdq, exclude, drop):
    qdq, x = resnet50_qdq
    r = fusions.rewrite(qdq, "all", exclude=tuple(exclude))
    assert r.counts == {**ALL_COUNTS, **drop}
    ids = {i for s in r.report.sites for i in s["sites"]}
    assert not ids & set(exclude)
    # an exclusion is counted as a refusal of its kind (a conv1 whose tail is excluded too is no candidate left)
    rows = {row["kind"]: row for row in r.report.rows()}
    before = {row["kind"]: row for row in fusions.rewrite(qdq, "all").report.rows()}
    for e in exclude[:1]:
        kind = e.partition(":")[0]
        assert rows[kind]["refused"] == before[kind]["refused"] + 1 and rows[kind]["found"] == before[kind]["found"]
    # the graph computes the same network: the CPU reference against ONNX Runtime on the Q/DQ graph
    _check_reference(qdq, r.model, {qdq.graph.input[0].name: x})


def test_no_exclusion_is_the_rewrite_as_it_was(resnet50_qdq):
    qdq, _ = resnet50_qdq
    a = fusions.rewrite(qdq, "all")
    b = fusions.rewrite(qdq, "all", exclude=())
    assert a.model.SerializeToString() == b.model.SerializeToString()


def test_an_exclusion_that_names_no_candidate_is_refused(resnet50_qdq):
    qdq, _ = resnet50_qdq
    with pytest.raises(UserError, match="tail:/layer9/Add"):
        fusions.rewrite(qdq, "all", exclude=("tail:/layer9/Add",))
    # a kind the mode does not make is not looked for: tails only, a projection's id is no error
    r = fusions.rewrite(qdq, "tails", exclude=("proj:/layer2/layer2.0/downsample/downsample.0/Conv",))
    assert r.counts["tail"] == 16


def test_plugin_exclude_is_normalized_once_as_settings_load():
    assert config.plugin_exclude("tail:/a/Add, next:/b/Conv,,tail:/a/Add") == ("next:/b/Conv", "tail:/a/Add")
    assert config.plugin_exclude(["pool:/p"]) == ("pool:/p",) and config.plugin_exclude([]) == ()
    for bad in ("/a/Add", "layernorm:/x", "tail:", ["tail"]):
        with pytest.raises(UserError, match="plugin_exclude"):
            config.plugin_exclude(bad)
    s = config.load(None, {"tensorrt.plugin_exclude": "tail:/b/Add,tail:/a/Add"})
    assert s["tensorrt"]["plugin_exclude"] == ["tail:/a/Add", "tail:/b/Add"]
    assert config.load()["tensorrt"]["plugin_exclude"] == []
    with pytest.raises(UserError):
        config.load(None, {"tensorrt.plugin_exclude": ["nothing"]})


def test_the_engine_key_changes_only_with_an_exclusion():
    plain = BuildConfig(plugins="all")
    assert "plugin_exclude" not in plain.key()   # the key every engine built before the field had
    excl = BuildConfig(plugins="all", plugin_exclude=["tail:/b", "tail:/a"])
    assert excl.plugin_exclude == ("tail:/a", "tail:/b") and excl.key()["plugin_exclude"] == ["tail:/a", "tail:/b"]
    assert BuildConfig(plugins="off", plugin_exclude=["tail:/a"]).key() == BuildConfig(plugins="off").key()
    json.dumps(excl.key())


# ----------------------------------------------------------------------------- profiles -> sites (fake profiles)
NODES = [
    {"node": "TrtfuseResidualConv_1", "kind": "tail", "sites": ["tail:/l1.1/Add", "next:/l1.2/conv1/Conv"],
     "replaced": ["/l1.1/conv3/Conv", "/l1.1/Add", "/l1.1/relu_2/Relu", "/l1.1/relu_2/Relu_output_0_QuantizeLinear",
                  "/l1.2/conv1/Conv", "/l1.2/relu/Relu", "/l1.2/relu/Relu_output_0_QuantizeLinear"]},
    {"node": "TrtfuseResidualConv_fused3", "kind": "fused", "sites": ["fused:/l2.0/Add"],
     "replaced": ["/l2.0/conv3/Conv", "/l2.0/Add", "/l2.0/ds/Conv", "/l2.0/ds/Q_QuantizeLinear"]},
    {"node": "TrtfuseResidualConv_15", "kind": "tail", "sites": ["tail:/l4.2/Add"],
     "replaced": ["/l4.2/conv3/Conv", "/l4.2/Add", "/l4.2/relu_2/Relu", "/l4.2/relu_2/Relu_output_0_QuantizeLinear"]},
    {"node": "TrtfuseResidualConv_stem0", "kind": "stem", "sites": ["stem:/conv1/Conv"],
     "replaced": ["/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool", "/maxpool/MaxPool_output_0_QuantizeLinear"]},
    {"node": "TrtfuseAvgPool_0", "kind": "pool", "sites": ["pool:/avgpool/GlobalAveragePool"],
     "replaced": ["/l4.2/relu_2/Relu_output_0_DequantizeLinear", "/avgpool/GlobalAveragePool"],
     "written": ["TrtfuseAvgPool_0_DequantizeLinear_hi", "TrtfuseAvgPool_0_DequantizeLinear_lo",
                 "TrtfuseAvgPool_0_Add"]},
]
GRAPH = frozenset(n for node in NODES for n in node["replaced"]) | {"/l4.2/conv1/Conv", "/fc/Gemm", "/l1.2/conv2/Conv"}
OFF = {  # TensorRT's names: nodes joined by " + ", reformatting layers named after what they feed
    "/l1.1/conv3/Conv + /l1.1/Add + /l1.1/relu_2/Relu": 0.010,
    "/l1.2/conv1/Conv + /l1.2/relu/Relu": 0.006,
    "/l1.2/conv2/Conv + /l1.2/relu_1/Relu": 0.020,   # not replaced: the rest
    "/l2.0/ds/Conv": 0.004,
    "/l2.0/conv3/Conv + /l2.0/Add + /l2.0/relu_2/Relu": 0.008,
    "Reformatting CopyNode for Input Tensor 0 to /l4.2/conv3/Conv + /l4.2/Add": 0.001,
    "/l4.2/conv3/Conv + /l4.2/Add + /l4.2/relu_2/Relu": 0.009,
    "/conv1/Conv + /relu/Relu": 0.015, "/maxpool/MaxPool": 0.005,
    # a QuantizeLinear folded into the next conv (a neighbour, not replaced): stays with the rest
    "/l4.2/relu_2/Relu_output_0_QuantizeLinear + /l4.2/conv1/Conv": 0.007,
    "/l4.2/relu_2/Relu_output_0_DequantizeLinear": 0.012, "/avgpool/GlobalAveragePool": 0.003,
    "/fc/Gemm": 0.030,
}
ON = {
    "TrtfuseResidualConv_1": 0.013,            # 0.016 for TensorRT's two layers: wins
    "TrtfuseResidualConv_fused3": 0.014,       # 0.012: loses
    "Reformatting CopyNode for Input Tensor 0 to TrtfuseResidualConv_15": 0.002,
    "TrtfuseResidualConv_15": 0.009,           # 0.011 with its reformat against 0.010: loses
    "TrtfuseResidualConv_stem0": 0.019,        # 0.020: wins
    "TrtfuseAvgPool_0": 0.004, "TrtfuseAvgPool_0_DequantizeLinear_hi + TrtfuseAvgPool_0_DequantizeLinear_lo "
                               "+ TrtfuseAvgPool_0_Add": 0.002,   # 0.006 against 0.015: wins
    "/l1.2/conv2/Conv + /l1.2/relu_1/Relu": 0.020, "/fc/Gemm": 0.030,
}


def test_profiles_map_onto_the_plugin_nodes_and_the_losers_are_chosen():
    result = plugin_sites.compare(OFF, ON, NODES, graph_nodes=GRAPH)
    rows = {r["node"]: r for r in result["rows"]}
    want = {"TrtfuseResidualConv_1": (0.013, 0.016, "wins"), "TrtfuseResidualConv_fused3": (0.014, 0.012, "loses"),
            "TrtfuseResidualConv_15": (0.011, 0.010, "loses"), "TrtfuseResidualConv_stem0": (0.019, 0.020, "wins"),
            "TrtfuseAvgPool_0": (0.006, 0.015, "wins")}
    for node, (ours, trt, verdict) in want.items():
        assert rows[node]["ours_ms"] == pytest.approx(ours) and rows[node]["tensorrt_ms"] == pytest.approx(trt), node
        assert rows[node]["verdict"] == verdict, node
    assert result["rest_off_ms"] == pytest.approx(0.020 + 0.007 + 0.030)
    assert result["rest_on_ms"] == pytest.approx(0.050)
    assert plugin_sites.losers(result["rows"]) == ["fused:/l2.0/Add", "tail:/l4.2/Add"]
    # within a 15 % margin the tail at 1.1x stays, the pair at 1.17x goes
    assert plugin_sites.losers(plugin_sites.compare(OFF, ON, NODES, 0.15, GRAPH)["rows"]) == ["fused:/l2.0/Add"]
    assert "loses" in plugin_sites.format_rows(result)


def test_a_chained_node_that_loses_gives_up_its_conv1_first_and_unmapped_nodes_stay():
    on = {**ON, "TrtfuseResidualConv_1": 0.030}
    off = {k: v for k, v in OFF.items() if "/conv1/Conv + /relu/Relu" not in k and "MaxPool" not in k}
    rows = {r["node"]: r for r in plugin_sites.compare(off, on, NODES, graph_nodes=GRAPH)["rows"]}
    assert rows["TrtfuseResidualConv_stem0"]["verdict"] == "unmapped"   # no TensorRT layer found: no decision
    assert plugin_sites.losers(list(rows.values())) == ["fused:/l2.0/Add", "next:/l1.2/conv1/Conv",
                                                        "tail:/l4.2/Add"]
    assert plugin_sites.select(list(rows.values()), ("tail:/l4.2/Add", "pool:/p")) == (
        "fused:/l2.0/Add", "next:/l1.2/conv1/Conv", "pool:/p", "tail:/l4.2/Add")


def test_a_layer_shared_by_two_nodes_is_split_between_them():
    groups = {"a": {"/x/Conv"}, "b": {"/y/Add"}}
    got, rest, held = plugin_sites.attribute({"/x/Conv + /y/Add": 0.01, "other": 1.0}, groups)
    assert got == {"a": 0.005, "b": 0.005} and rest == 1.0 and held == [("/x/Conv + /y/Add", ["a", "b"])]


def test_auto_rebuilds_without_the_losers_until_none_is_left(monkeypatch, tmp_path):
    """auto_exclude's rounds on fake builds and profiles: round 0 finds the pair and the chained tail slower; round 1
    (without them) finds the tail without its conv1 still slower; at most two rounds, each measured."""
    import trtfuse.engine

    built = []
    monkeypatch.setattr(trtfuse.engine, "build_engine",
                        lambda d, cfg, lib=None: built.append((cfg.plugins, cfg.plugin_exclude)) or tmp_path / "e")

    def sites_of(model_dir, cfg):   # a node without its excluded sites; one with none left is gone
        nodes = [{**n, "sites": [s for s in n["sites"] if s not in cfg.plugin_exclude]} for n in NODES]
        return [n for n in nodes if n["sites"]], GRAPH

    monkeypatch.setattr(plugin_sites, "sites_of", sites_of)
    verdicts = [{"TrtfuseResidualConv_1": "loses", "TrtfuseResidualConv_fused3": "loses"},
                {"TrtfuseResidualConv_1": "loses"}, {}]

    def profile_pair(off, on, sites, batch, runs, lib, margin):
        v = verdicts[len(built) - 2]
        rows = [{"node": n["node"], "sites": n["sites"], "verdict": v.get(n["node"], "wins"), "ours_ms": 1.0,
                 "tensorrt_ms": 1.0, "ratio": 1.0} for n in sites[0]]
        return {"rows": rows, "ours_ms": 1.0, "tensorrt_ms": 1.0, "rest_on_ms": 0.0, "rest_off_ms": 0.0}

    monkeypatch.setattr(plugin_sites, "profile_pair", profile_pair)
    cfg = BuildConfig(plugins="all", batch=1)
    exclude, records = plugin_sites.auto_exclude(tmp_path, cfg)
    assert exclude == ("fused:/l2.0/Add", "next:/l1.2/conv1/Conv", "tail:/l1.1/Add")
    assert [r["exclude"] for r in records] == [[], ["fused:/l2.0/Add", "next:/l1.2/conv1/Conv"]]
    assert built[0] == ("off", ()) and built[1] == ("all", ()) and len(built) == 3
    assert dataclasses.replace(cfg, plugin_exclude=exclude).plugin_exclude == exclude


# ----------------------------------------------------------------------------- bench edge latency-profile (fakes)
def test_edge_latency_profile_records_ours_against_tensorrt_per_node_at_each_batch(monkeypatch, tmp_path):
    """The unit builds the engines the latency unit runs (same settings: batch 1 and 8, one stream, int8 input),
    compares them per plugin node over rounds (a round without the last round's losers) and records the sites that
    lose; latency's "auto" takes them from the record."""
    from types import SimpleNamespace

    import trtfuse.engine
    from trtfuse.bench import edge

    built = []

    def build_engine(model_dir, cfg, lib=None):
        built.append((cfg.batch, cfg.plugins, cfg.input_format, cfg.profiles, cfg.plugin_exclude))
        return tmp_path / f"{cfg.plugins}-b{cfg.batch}-x{len(cfg.plugin_exclude)}.engine"

    def sites_of(model_dir, cfg):   # a node without its excluded sites; one with none left is gone
        nodes = [{**n, "sites": [s for s in n["sites"] if s not in cfg.plugin_exclude]} for n in NODES]
        return [n for n in nodes if n["sites"]], GRAPH

    monkeypatch.setattr(trtfuse.engine, "build_engine", build_engine)
    monkeypatch.setattr(plugin_sites, "sites_of", sites_of)
    monkeypatch.setattr(plugin_sites, "profile_pair", lambda off, on, sites, batch, runs, lib, margin: {
        **plugin_sites.compare(OFF, ON, sites[0], graph_nodes=sites[1]), "batch": batch, "runs": runs, "gpu": "fake",
        "off_engine": str(off), "on_engine": str(on)})
    monkeypatch.setattr(edge.Edge, "model", lambda self: SimpleNamespace(dir=tmp_path))
    out = tmp_path / "out"
    assert edge.main(["latency-profile", "--out", str(out), "--mlperf-dir", str(tmp_path)]) == 0
    losers = ("fused:/l2.0/Add", "tail:/l4.2/Add")
    assert built == [(b, *mode, "int8", 1, x) for b in (1, 8) for mode, x in ((("off",), ()), (("all",), ()),
                                                                               (("all",), losers))]
    record = json.loads((out / "edge_submission.json").read_text())
    for scenario, batch in (("singlestream", 1), ("multistream", 8)):
        r = record["latency_profile"][scenario]
        assert r["batch"] == batch and r["exclude"] == list(losers)
        assert [x["excluded_before"] for x in r["rounds"]] == [[], list(losers)]
        assert {row["node"]: row["verdict"] for row in r["rounds"][0]["rows"]}["TrtfuseResidualConv_15"] == "loses"
        assert "TrtfuseResidualConv_15" not in {row["node"] for row in r["rounds"][1]["rows"]}
        full = json.loads(Path(r["file"]).read_text())
        assert full["rounds"][-1]["on_engine"].endswith(f"all-b{batch}-x2.engine") and full["exclude"] == r["exclude"]
    assert "gpu" in record and "cpu_model" in record
    e = edge.Edge(SimpleNamespace(out=out))
    assert e.excluded("multistream") == list(losers)
    # --plugins auto: the official units of SingleStream and MultiStream leave those sites to TensorRT; Offline
    # (batch 2048, where the kernels were tuned) keeps all
    args = SimpleNamespace(out=out, plugins="auto", offline_batch=2048, dataset=None, mlperf_dir=tmp_path,
                           expected_latency_ms={}, latency_scenarios=["singlestream", "multistream"], sut="python")
    e = edge.Edge(args)
    for scenario, want in (("singlestream", list(losers)), ("multistream", list(losers)), ("offline", [])):
        t = e.unit_settings(scenario)["tensorrt"]
        assert (t["plugins"], list(t["plugin_exclude"])) == ("all", want), scenario
    args.plugins = "all"
    assert list(e.unit_settings("singlestream")["tensorrt"]["plugin_exclude"]) == []
    args.sut = "native"   # --sut native: every unit on the C++ SUT
    assert e.unit_settings("multistream")["run"]["sut"] == "native"


def test_build_plugins_auto_builds_all_without_the_sites_that_lose(monkeypatch, tmp_path, capsys):
    """`trtfuse build --plugins auto`: --plugins all at --batch, less auto_exclude's sites; the rounds beside the
    engine; --plugin-exclude given by hand is where auto starts."""
    from test_bn_fold import toy_resnet
    from test_fusions import _prepared
    from trtfuse import build_command, engine

    built = []
    monkeypatch.setattr(engine, "import_tensorrt", lambda: None)
    monkeypatch.setattr(engine, "build_engine", lambda d, cfg, lib=None, rebuild=False: built.append(cfg)
                        or tmp_path / "x.engine")
    monkeypatch.setattr(plugin_sites, "auto_exclude", lambda d, cfg, lib=None: (
        tuple(sorted({*cfg.plugin_exclude, "tail:/b/Add"})), [{"round": 0, "exclude": list(cfg.plugin_exclude)}]))
    folder = _prepared(tmp_path, toy_resnet(), (3, 16, 16))
    assert build_command.cli_main([str(folder), "--plugins", "auto", "--batch", "1", "--plugin-exclude", "pool:/p"]) == 0
    assert [(c.plugins, c.batch, c.plugin_exclude) for c in built] == [("all", 1, ("pool:/p", "tail:/b/Add"))]
    assert 'tensorrt.plugin_exclude = ["pool:/p", "tail:/b/Add"]' in capsys.readouterr().err
    sites = json.loads((tmp_path / "x.engine.sites.json").read_text())
    assert sites["exclude"] == ["pool:/p", "tail:/b/Add"] and sites["rounds"][0]["exclude"] == ["pool:/p"]
    built.clear()
    assert build_command.cli_main([str(folder), "--plugins", "all", "--plugin-exclude", "tail:/a/Add,tail:/a/Add"]) == 0
    assert built[0].plugin_exclude == ("tail:/a/Add",)
