"""What each MLPerf Inference round asks of a submission tree: the scenarios a benchmark must have per
system type, and where every file goes (the tree changed shape in v6.0).

The facts are those of MLCommons' submission checker (tools/submission/submission_checker/constants.py
of mlcommons/inference, rounds v5.0-v6.1); tests/test_mlperf_rounds.py holds this module against the
checker's own tables, so a drift shows up as a failing test, not as a tree the checker rejects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from trtfuse.errors import UserError

ROUNDS = ("v5.0", "v5.1", "v6.0", "v6.1")  # the rounds the checker trtfuse was written against knows
SYSTEM_TYPES = ("edge", "datacenter")
SCENARIO_ORDER = ("SingleStream", "MultiStream", "Offline", "Server")
EDGE = ("SingleStream", "MultiStream", "Offline")
# The scenarios a closed-division benchmark must submit, per round and system type. ResNet-50 left the
# datacenter suite in v5.1: from then on it is an edge benchmark only.
REQUIRED_SCENARIOS = {
    "resnet50": {
        "v5.0": {"datacenter": ("Offline", "Server"), "edge": EDGE},
        "v5.1": {"edge": EDGE},
        "v6.0": {"edge": EDGE},
        "v6.1": {"edge": EDGE},
    },
}
COMPLIANCE_TESTS = {"resnet50": ("TEST01", "TEST04")}
IMPLEMENTATION = "trtfuse"  # the implementation id in v5.x's <system>_<implementation>_<Scenario>.json


def _known(round_: str) -> str:
    """The round whose rules apply: a later round than the checker knows is taken as its last."""
    if round_ in ROUNDS:
        return round_
    if round_.startswith("v") and round_ > ROUNDS[-1]:
        return ROUNDS[-1]
    raise UserError(f"MLPerf round {round_!r} is not one trtfuse can write a tree for",
                    f"use LoadGen of a round from {ROUNDS[0]} to {ROUNDS[-1]} (the round is its seeds')")


def default_system_type(benchmark: str, round_: str) -> str:
    """The system type a benchmark is submitted as in a round: datacenter where the round has it
    (ResNet-50 in v5.0, as trtfuse's trees always were), else edge."""
    types = REQUIRED_SCENARIOS.get(benchmark, {}).get(_known(round_), {})
    return "datacenter" if "datacenter" in types else "edge"


def required_scenarios(benchmark: str, round_: str, system_type: str) -> tuple[str, ...]:
    """The scenarios the closed division needs, or a UserError where the round has no such suite."""
    per_round = REQUIRED_SCENARIOS.get(benchmark)
    if per_round is None:
        raise UserError(f"trtfuse knows the required scenarios of resnet50 only, not of {benchmark!r}",
                        "submit run.mlperf_model = resnet50 runs, or use --division open")
    known = _known(round_)
    types = per_round[known]
    if system_type not in types:
        have = " or ".join(f"--system-type {t}" for t in types)
        why = " (ResNet-50 left the datacenter suite in v5.1)" if benchmark == "resnet50" else ""
        raise UserError(f"{benchmark} is not a {system_type} benchmark in MLPerf {round_}{why}",
                        f"use {have}, with its scenarios: "
                        + "; ".join(f"{t}: {', '.join(s)}" for t, s in types.items()))
    return types[system_type]


@dataclass(frozen=True)
class Layout:
    """Where a round's checker looks for each file, relative to the <division>/<submitter> folder."""

    round: str

    @property
    def v6(self) -> bool:  # v6.0 moved measurements and compliance next to the results, code to src/
        return _known(self.round) >= "v6.0"

    def scenario_dir(self, system: str, benchmark: str, scenario: str) -> PurePosixPath:
        return PurePosixPath("results", system, benchmark, scenario)

    def measurements_dir(self, system: str, benchmark: str, scenario: str) -> PurePosixPath:
        if self.v6:
            return self.scenario_dir(system, benchmark, scenario)
        return PurePosixPath("measurements", system, benchmark, scenario)

    def measurements_file(self, system: str, benchmark: str, scenario: str) -> PurePosixPath:
        name = "measurements.json" if self.v6 else f"{system}_{IMPLEMENTATION}_{scenario}.json"
        return self.measurements_dir(system, benchmark, scenario) / name

    def compliance_dir(self, system: str, benchmark: str, scenario: str, test: str) -> PurePosixPath:
        if self.v6:
            return self.scenario_dir(system, benchmark, scenario) / test
        return PurePosixPath("compliance", system, benchmark, scenario, test)

    @property
    def code_dir(self) -> PurePosixPath:
        return PurePosixPath("src" if self.v6 else "code")
