"""Settings: defaults, a user TOML file, command-line overrides, and errors for bad keys/values."""

import pytest
from trtfuse import config
from trtfuse.errors import UserError


def test_defaults_are_complete_and_valid():
    s = config.load()
    assert s["run"]["scenario"] == "offline" and s["run"]["batch_size"] >= 1
    assert s["server"]["target_latency_ms"] == 15.0


def test_file_then_command_line_override_the_defaults(tmp_path):
    user = tmp_path / "user.toml"
    user.write_text('[run]\nbatch_size = 32\nbackend = "null"\n[server]\ntarget_qps = 1000\n')
    s = config.load(user, {"run.batch_size": 64, "server.min_duration_ms": None})
    assert s["run"]["batch_size"] == 64  # command line beats the file
    assert s["run"]["backend"] == "null"  # file beats the default
    assert s["server"]["target_qps"] == 1000.0  # int accepted for a float key
    assert s["server"]["min_duration_ms"] == config.defaults()["server"]["min_duration_ms"]


def test_unknown_key_names_the_key_and_suggests_the_right_one(tmp_path):
    user = tmp_path / "typo.toml"
    user.write_text("[run]\nbatchsize = 4\n")
    with pytest.raises(UserError) as e:
        config.load(user)
    assert "run.batchsize" in e.value.problem and "run.batch_size" in e.value.fix


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"run.batch_size": 0}, "batch size 0"),
        ({"run.batch_size": "8"}, "must be int"),
        ({"run.scenario": "singlestreams"}, "unknown scenario"),
        ({"server.target_qps": -1.0}, "target QPS"),
        ({"run.threads": -1}, "threads"),
    ],
)
def test_bad_values_are_user_errors(overrides, words):
    with pytest.raises(UserError, match=words):
        config.load(overrides=overrides)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    with pytest.raises(UserError, match="not valid TOML"):
        config.load(bad)
