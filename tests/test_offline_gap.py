"""trtfuse.bench.gap's bookkeeping (no GPU): nvidia-smi samples matched to a phase's window, and
trtfuse.bench.e2e's engine-alone records kept apart per input (every byte 1, real images)."""

import datetime as dt

import pytest

from trtfuse.bench import e2e as resnet50_e2e
from trtfuse.bench import gap as offline_gap


def power_log(tmp_path, text):
    path = tmp_path / "smi.csv"
    path.write_text(text)
    log = offline_gap.PowerLog.__new__(offline_gap.PowerLog)  # the parsing only: no nvidia-smi here
    log.path = path
    return log


def test_power_means_take_only_the_samples_inside_the_window(tmp_path):
    log = power_log(tmp_path, "2026/11/25 17:10:00.100, 1700, 600.0, 50\n"
                              "2026/11/25 17:10:01.100, 1800, 690.0, 60\n"
                              "2026/11/25 17:10:01.300, [N/A], 650.0, 61\n"   # a field nvidia-smi could not read
                              "2026/11/25 17:10:01.500, 1900, 700.0, 62\n"
                              "2026/11/25 17:10:03.000, 1500, 500.0, 70\n"
                              "2026/11/25 17:10:0")                            # cut off mid-line
    means = log.means(dt.datetime(2026, 11, 25, 17, 10, 1), dt.datetime(2026, 11, 25, 17, 10, 2))
    assert means == {"samples": 2, "sm_mhz": 1850, "power_w": 695.0, "temp_c": 61.0}
    assert log.means(dt.datetime(2026, 11, 25, 17, 11), dt.datetime(2026, 11, 25, 17, 12)) == {"samples": 0}


def test_power_means_list_the_throttle_reasons_seen(tmp_path):
    log = power_log(tmp_path, "2026/11/25 17:10:01.100, 1800, 690.0, 60, 0x0000000000000004\n"
                              "2026/11/25 17:10:01.300, 1700, 699.0, 61, 0x0000000000000004\n"
                              "2026/11/25 17:10:01.500, 1980, 400.0, 62, 0x0000000000000000\n")
    means = log.means(dt.datetime(2026, 11, 25, 17, 10, 1), dt.datetime(2026, 11, 25, 17, 10, 2))
    assert means["samples"] == 3 and means["sm_mhz"] == 1827
    assert means["throttle_reasons"] == ["0x0000000000000000", "0x0000000000000004"]


def test_summary_leaves_out_rounds_without_power_samples():
    rounds = [{"phase": phase, "samples_per_s": 100.0 - k, "sm_mhz": 1800, "power_w": 690.0}
              for k, phase in enumerate(offline_gap.PHASES)]
    rounds += [{"phase": phase, "samples_per_s": 90.0 - k, "samples": 0}  # nvidia-smi gave nothing this round
               for k, phase in enumerate(offline_gap.PHASES)]
    summary = offline_gap.summarize(rounds)
    assert summary["ones_overlap"] == {"samples_per_s": 95.0, "sm_mhz": 1800, "power_w": 690.0, "vs_ones_overlap": 1.0}
    assert summary["rows_overlap"]["samples_per_s"] == 91.0
    assert summary["rows_overlap"]["vs_ones_overlap"] == round(91 / 95, 4)
    no_power = offline_gap.summarize([r for r in rounds if "samples" in r])
    assert no_power["images_serial"]["sm_mhz"] is None and no_power["images_serial"]["power_w"] is None


def test_engine_records_per_input_are_kept_apart(tmp_path):
    res = resnet50_e2e.Results(tmp_path / "r.json")
    res.set_engine("resnet50", 2048, "all", 87796.49)
    res.set_engine("resnet50", 2048, "all", 86116.2, key="engine_images")
    res.set_engine("resnet50", 2048, "all", 87000.0)  # a later figure replaces the earlier one
    assert res.engine_sps("resnet50", 2048, "all") == 87000.0
    assert res.engine_sps("resnet50", 2048, "all", "engine_images") == 86116.2
    assert res.engine_sps("resnet50", 256, "all", "engine_images") is None
    res.save()
    again = resnet50_e2e.Results(tmp_path / "r.json")
    assert [r["samples_per_s"] for r in again.data["engine"]] == [87000.0]
    assert again.data["engine_images"] == [{"model": "resnet50", "batch": 2048, "plugins": "all",
                                            "samples_per_s": 86116.2}]


@pytest.mark.parametrize("phase", offline_gap.PHASES)
def test_every_phase_is_named_in_the_method(phase):
    assert phase in offline_gap.__doc__
