"""ResNet-50 v1.5, the torchvision architecture with torchvision's parameter names.

torchvision has no CPU build here, so the architecture is written out; its ``state_dict`` keys match
``torchvision.models.resnet50()`` exactly (``conv1.weight``, ``layer1.0.downsample.1.running_mean``,
``fc.bias``, ...), so a torchvision checkpoint loads as it is. v1.5: the stride-2 convolution of a
downsampling bottleneck is the 3x3 one (``conv2``), not the first 1x1.

Without a weights file the weights are random but reproducible (seeded); BatchNorm parameters and
statistics are random too, so that folding BN into the convolutions changes every weight.
"""

from __future__ import annotations

import os

from trtfuse.models.prepared import PreprocessSpec

NAME = "resnet50"
NUM_CLASSES = 1000
INPUT_SHAPE = (3, 224, 224)
PREPROCESS = PreprocessSpec()  # torchvision mean/std
SEED = 50
LAYERS = (3, 4, 6, 3)  # bottlenecks per stage


def build(weights: str | os.PathLike | None = None):
    """(eval-mode torch module, random_weights): torchvision state dict, or seeded."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = _resnet50(torch.nn)
        if weights is None:
            _randomize_batchnorm(model)
    if weights is not None:
        load_state_dict_into(model, weights, "ResNet-50 (torchvision)")
    return model.eval(), weights is None


def _resnet50(nn):
    """The module tree (``nn`` is ``torch.nn``, passed in so torch stays a lazy import): torchvision's ResNet
    family as ``torchvision_resnet`` writes it out, at ResNet-50's depths."""
    from trtfuse.models.torchvision_resnet import _resnet

    return _resnet(nn, LAYERS, 1, 64)


def _randomize_batchnorm(model) -> None:
    """Random BN scale/shift/statistics near the identity, so activations keep their scale."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def load_state_dict_into(model, weights: str | os.PathLike, what: str) -> None:
    """Load a state dict file (``torch.save``; plain tensors only) into ``model``, strictly.

    Also used for EfficientNet-Lite. Raises UserError naming the missing/unexpected keys or the
    mismatched shapes, so a checkpoint of another architecture is reported, not half-loaded.
    """
    import torch
    from trtfuse.errors import UserError

    path = os.path.expanduser(os.fspath(weights))
    if not os.path.isfile(path):
        raise UserError(f"weights file {path} does not exist", "check the --weights path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle/zip errors, or objects weights_only refuses
        raise UserError(
            f"cannot load {path} as a torch state dict ({type(e).__name__})",
            "pass a file written by torch.save(model.state_dict(), FILE)",
        ) from e
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # common training-checkpoint wrapper
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise UserError(
            f"{path} is not a state dict (a mapping of names to tensors)",
            "pass a file written by torch.save(model.state_dict(), FILE)",
        )
    # Checkpoints saved from DataParallel prefix every key with "module.".
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}

    expected = model.state_dict()
    # Checkpoints older than torch 0.4.1 lack BN's num_batches_tracked, which inference never reads.
    for key in expected:
        if key.endswith("num_batches_tracked"):
            state.setdefault(key, expected[key])
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise UserError(
            f"{path} does not match the {what} architecture: "
            f"{len(missing)} missing keys {_few(missing)}, "
            f"{len(unexpected)} unexpected keys {_few(unexpected)}",
            f"pass a state dict of {what}",
        )
    wrong = [
        f"{k} {tuple(state[k].shape)} (expected {tuple(v.shape)})"
        for k, v in expected.items()
        if state[k].shape != v.shape
    ]
    if wrong:
        raise UserError(
            f"{path} has {len(wrong)} tensors of the wrong shape for {what}: {_few(wrong)}",
            f"pass a state dict of {what}",
        )
    model.load_state_dict(state, strict=True)


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}]"
