"""A reader of LoadGen's detail log with the interface MLCommons' ``tools/submission/log_parser.py``
offers (``MLPerfLog(path)[key]``, ``get_keys()``, ``has_error()``), written for trtfuse.

MLCommons' TEST01 ``verify_performance.py`` imports ``log_parser`` from ``tools/submission`` of the
inference repository. Where only the compliance folders are at hand (a partial copy), trtfuse puts
this folder on PYTHONPATH so the unmodified script runs; with a full checkout, MLCommons' own module
is used (``trtfuse.mlperf_tools.script_env``).
"""

import json

PREFIX = ":::MLLOG "


class MLPerfLog:
    def __init__(self, log_path, strict=True):
        self.entries = []
        with open(log_path) as f:
            for line in f:
                if line.startswith(PREFIX):
                    self.entries.append(json.loads(line[len(PREFIX):]))
        self._values = {}
        for entry in self.entries:  # a key logged twice: the last value, as LoadGen's final word
            self._values[entry["key"]] = entry["value"]
        if strict and not self.entries:
            raise ValueError(f"{log_path} holds no {PREFIX.strip()} lines")

    def __getitem__(self, key):
        return self._values[key]

    def get(self, key, default=None):
        return self._values.get(key, default)

    def get_keys(self):
        return list(self._values)

    def has_error(self):
        return any(e.get("metadata", {}).get("is_error") for e in self.entries)

    def num_errors(self):
        return sum(1 for e in self.entries if e.get("metadata", {}).get("is_error"))
