"""trtfuse.tuning's cache file (CPU): entries of different families for the same shape are kept apart."""

import json

from trtfuse import tuning


def test_merge_replaces_an_entry_of_the_same_family_gpu_shape_and_batch_only(tmp_path):
    path = tmp_path / "cache.json"
    shape = {"gpu": "GPU A", "cin": 64, "cout": 64, "hw": 3136, "batch": 1}
    path.write_text(json.dumps({"version": 1, "entries": [
        {**shape, "config": "sm80_64x64x64_s3"},                                   # a 1x1 entry (no family)
        {**shape, "family": "conv3x3", "residual": 0, "config": "halo_64x256_s4_b2_wr"},
        {**shape, "batch": 8, "family": "conv3x3", "residual": 0, "config": "halo_64x256_s4_b2_wr"},
    ]}))
    new = [{**shape, "family": "conv3x3", "residual": 0, "config": "halo_128x64_s2_b2_pp"}]
    merged = tuning.merge_cache(path, new)["entries"]
    assert sorted((e.get("family", ""), e["batch"], e["config"]) for e in merged) == [
        ("", 1, "sm80_64x64x64_s3"), ("conv3x3", 1, "halo_128x64_s2_b2_pp"), ("conv3x3", 8, "halo_64x256_s4_b2_wr")]


def test_every_family_has_its_stages():
    assert set(tuning.ALL_STAGES) >= {"res2", "fused1", "conv3x3_1", "stem"}
    assert all(s in tuning.RESNET50_CONV3X3 or s in tuning.RESNET50_STEM or s in tuning.RESNET50_STAGES
               or s in tuning.RESNET50_FUSED for s in tuning.ALL_STAGES)
