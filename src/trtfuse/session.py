"""One MLPerf LoadGen test end to end, as ``trtfuse run`` makes it: the model, dataset and backend from the settings
(or given ready-made), the run folder, the Python or native run loop, and the report with its plots.

``run(settings, ...)`` is what the CLI, the compliance tests, the benchmarks and the tests call; ``resolve_model``
turns a ``--model`` value into a prepared model (also for ``trtfuse serve`` and ``trtfuse triton export``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from trtfuse.errors import UserError


def resolve_model(spec: str, weights: str | None = None):
    """A PreparedModel from a name, a prepared folder or an .onnx file (prepared and cached once)."""
    from trtfuse import models

    path = Path(spec).expanduser()
    if path.is_dir() and (path / "model.json").is_file():
        return models.load_prepared(path)
    if spec.endswith(".onnx"):
        return models.prepare(None, onnx=path)
    if path.is_dir():
        raise UserError(f"{path} holds no prepared model (no model.json)",
                        "pass a model name, an .onnx file, or a folder written by `trtfuse prepare`")
    prepared_dir = models.default_model_dir(spec)
    if weights is None and (prepared_dir / "model.json").is_file():
        # What `trtfuse prepare NAME [--onnx F | --weights F]` made last is what `run --model NAME`
        # means; preparing again without those options would replace it with other weights.
        try:
            return models.load_prepared(prepared_dir)
        except UserError:
            pass  # a broken folder: prepare it again
    return models.prepare(spec, weights=weights)


def _new_run_dir(output_dir: str, model: str, scenario: str, mode: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir).expanduser() / f"{stamp}-{model}-{scenario}-{mode}"
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{base.name}-{n}")
    return run_dir


def open_inputs(settings: dict, weights: str | None = None, progress: bool = True,
                model=None, dataset=None, backend=None, with_backend: bool = True):
    """(model, dataset, backend) for the settings; what is given ready-made is kept. A backend made
    here is loaded with the model (the caller closes it); none with ``with_backend`` False."""
    from trtfuse.backends import create_backend

    r = settings["run"]
    model = model or resolve_model(r["model"], weights)
    if backend is None and with_backend:  # before the dataset: a model the backend rejects should not wait for JPEGs
        # Each backend's own settings section: [triton] for Triton's client, else [tensorrt] (which
        # onnxruntime and null ignore).
        section = settings["triton" if r["backend"] == "triton" else "tensorrt"]
        options = {k: v for k, v in section.items() if v != ""}
        backend = create_backend(r["backend"], threads=r["backend_threads"], **options)
        backend.load(model, r["batch_size"])
    if dataset is None:
        from trtfuse.data import open_dataset

        dataset = open_dataset(r["dataset"], model.preprocess, count=r["sample_count"] or None,
                               progress=progress)
    elif r["sample_count"]:
        dataset = _first(dataset, r["sample_count"])
    return model, dataset, backend


def run(settings: dict, progress: bool = True, weights: str | None = None,
        model=None, dataset=None, backend=None, run_dir: Path | None = None,
        command: list[str] | None = None) -> dict:
    """One LoadGen test end to end; returns the report (also written to the run folder).

    ``model``, ``dataset`` and ``backend`` may be given ready-made (tests, benchmarks); otherwise they
    come from the settings. ``command``: the command line that asked for the run, kept in the report
    (a submission's README says how each run was made).
    """
    from trtfuse import accuracy, files, interrupts, native_sut, report, sysinfo
    from trtfuse.lg_run import run_loadgen

    settings = native_sut.resolve_sut(settings, backend)
    r = settings["run"]
    native = r["sut"] == "native"
    given_dir = run_dir is not None
    files.check_folder_path(run_dir or r["output_dir"], "--run-dir" if given_dir else "--output-dir")
    own_backend = backend is None
    model, dataset, backend = open_inputs(settings, weights, progress, model, dataset, backend,
                                          with_backend=not native)
    if native:  # the engine lives in the native library: no Python backend is loaded beside it
        if backend is None:
            backend = native_sut.open_engine(settings, model, dataset)
        elif not isinstance(backend, native_sut.NativeEngine):
            raise UserError(f"--sut native runs a native engine, not the {backend.name} backend given",
                            "pass a native_sut engine, or use --sut python")
    run_dir = Path(run_dir) if run_dir else _new_run_dir(r["output_dir"], model.name, r["scenario"], r["mode"])
    files.new_folder(run_dir, "--run-dir" if given_dir else "--output-dir")
    folder = interrupts.RunFolder(run_dir)  # complete in the end, or removed if the command is interrupted first
    accuracy.write_qsl_labels(run_dir, dataset.names, dataset.labels)
    if progress:
        print(f"trtfuse: {r['scenario']} {r['mode']} run of {model.name} on {backend.name} ({r['sut']} SUT), "
              f"batch {r['batch_size']}, {len(dataset)} images -> {run_dir}", file=sys.stderr)
    try:
        if native:
            lg_run = native_sut.run_native(backend, model, dataset, settings, run_dir, progress=progress)
        else:
            lg_run = run_loadgen(backend, model, dataset, settings, run_dir, progress=progress)
    finally:
        if own_backend:
            backend.close()
    folder.measured()  # LoadGen's test ended by itself: a signal from now on completes the folder, marked
    results = report.read_loadgen_results(run_dir)
    mode = results["mode"] or r["mode"]  # LoadGen's effective mode: an audit.config may switch it
    result = {
        "model": model.name, "random_weights": bool(model.random_weights),
        "backend": backend.name, "sut": r["sut"], "scenario": r["scenario"], "mode": mode,
        "official": r["official"], "audit_config": r["audit_config"] or None,
        "command": command,
        "sysinfo": sysinfo.probe(),  # the measured machine, for a submission's systems/<system>.json
        "batch_size": r["batch_size"], "dataset": str(r["dataset"]), "dataset_size": len(dataset),
        "run_dir": str(run_dir), "settings": settings,
        "loadgen": results,
        "harness": {"warmup_samples_per_s": lg_run.warmup_samples_per_s, "issued": lg_run.issued,
                    "completed": lg_run.completed, "qsl_load_calls": lg_run.qsl_load_calls,
                    "qsl_loaded_samples": lg_run.qsl_loaded_samples, "wall_s": lg_run.wall_s,
                    "cpu_s": lg_run.cpu_s, "mean_batch": lg_run.mean_batch,
                    "effective": lg_run.effective, "stalls": lg_run.stalls, "gpu": lg_run.gpu,
                    "energy": lg_run.energy,
                    "query_timeline": lg_run.query_timeline.summary(results.get("latency_ns"))
                    if lg_run.query_timeline else None,
                    "timeline": {"t_s": [t for t, _ in lg_run.timeline],
                                 "completed": [n for _, n in lg_run.timeline]}},
    }
    if hasattr(backend, "lane_stats"):  # several GPUs or servers: what each lane answered
        result["lanes"] = backend.lane_stats()
    if model.random_weights:
        result["note"] = report.RANDOM_WEIGHTS_NOTE
    if mode == "accuracy":
        result["accuracy"] = accuracy.evaluate(run_dir)
    report.write_report(run_dir, result)
    from trtfuse.plots import write_run_plots

    write_run_plots(run_dir, result)  # latency_cdf.png, completed_over_time.png ([] without matplotlib)
    folder.complete(lambda why: report.write_report(run_dir, {**result, "interrupted": why}))
    return result


class _FirstN:
    """The first ``n`` samples of a dataset (for --sample-count with a ready-made dataset)."""

    def __init__(self, dataset, n):
        self._d, self.names, self.labels = dataset, dataset.names[:n], dataset.labels[:n]

    def __len__(self):
        return len(self.names)

    def images(self, indices):
        return self._d.images(indices)


def _first(dataset, n):
    return dataset if n >= len(dataset) else _FirstN(dataset, n)
