"""torchvision's ResNet family as a user brings it: ResNet-50/101/152, Wide ResNet-50/101-2, ResNeXt-50 32x4d and
ResNeXt-101 32x8d, exported the way a user exports them (``export``: ``torch.onnx.export``, opset 17, dynamic batch,
the exporter's defaults otherwise, so BN is folded into Conv + bias by the exporter, not by us).

torchvision itself where it imports (``torchvision.models.<arch>(weights=None)``); it has no CPU build beside this
project's torch here (its wheel fails with "operator torchvision::nms does not exist"), so otherwise the same
architecture written out: torchvision's module tree, parameter names, v1.5 stride placement (the bottleneck's 3x3),
``groups`` and ``width_per_group``, and its initialisation (kaiming-normal convs, BN weight 1 and bias 0, running
mean 0 and var 1, as ``weights=None`` gives). Fresh BN folds into all-zero conv biases, which the TorchScript exporter
stores once and reads through ``Identity`` nodes: the case that broke the rewrite's matchers.
"""

from __future__ import annotations

import io
import warnings

# arch -> (bottlenecks per stage, groups, width_per_group)
ARCHS = {
    "resnet50": ((3, 4, 6, 3), 1, 64),
    "resnet101": ((3, 4, 23, 3), 1, 64),
    "resnet152": ((3, 8, 36, 3), 1, 64),
    "wide_resnet50_2": ((3, 4, 6, 3), 1, 128),
    "wide_resnet101_2": ((3, 4, 23, 3), 1, 128),
    "resnext50_32x4d": ((3, 4, 6, 3), 32, 4),
    "resnext101_32x8d": ((3, 4, 23, 3), 32, 8),
}
PLANES = (64, 128, 256, 512)   # per stage; a bottleneck's output is 4x


def stage_shapes(arch: str) -> list[dict]:
    """Per stage: blocks, width (the bottleneck's 1x1 -> 3x3 -> 1x1 inner channels), cout, cin (the stage input),
    stride, groups: what the rewrite's rules are applied to."""
    layers, groups, width_per_group = ARCHS[arch]
    out, cin = [], 64
    for k, (blocks, planes) in enumerate(zip(layers, PLANES)):
        out.append(dict(blocks=blocks, width=int(planes * (width_per_group / 64.0)) * groups, cout=planes * 4,
                        cin=cin, stride=1 if k == 0 else 2, groups=groups))
        cin = planes * 4
    return out


def build(arch: str, seed: int = 0, prefer_torchvision: bool = True):
    """(eval-mode torch module, source: "torchvision" or "trtfuse"), random weights as ``weights=None`` gives."""
    import torch

    if arch not in ARCHS:
        from trtfuse.errors import UserError
        raise UserError(f"unknown torchvision ResNet {arch!r}", f"choose one of {', '.join(ARCHS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if prefer_torchvision:
            try:
                import torchvision
                return getattr(torchvision.models, arch)(weights=None).eval(), "torchvision"
            except Exception:   # not installed, or its C++ ops do not load beside this torch
                pass
        return _resnet(torch.nn, *ARCHS[arch]).eval(), "trtfuse"


def _resnet(nn, layers, groups, width_per_group):
    class Bottleneck(nn.Module):
        def __init__(self, inplanes, planes, stride, downsample):
            super().__init__()
            width = int(planes * (width_per_group / 64.0)) * groups
            self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            inplanes = 64
            for k, (blocks, planes) in enumerate(zip(layers, PLANES), start=1):
                stride = 1 if k == 1 else 2
                downsample = None
                if stride != 1 or inplanes != planes * 4:
                    downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                                               nn.BatchNorm2d(planes * 4))
                layer = [Bottleneck(inplanes, planes, stride, downsample)]
                inplanes = planes * 4
                layer += [Bottleneck(inplanes, planes, 1, None) for _ in range(blocks - 1)]
                setattr(self, f"layer{k}", nn.Sequential(*layer))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * 4, 1000)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def export(module, hw: int = 224, dynamo: bool = False, batch: int = 2):
    """``onnx.ModelProto`` as a user exports it: ``torch.onnx.export(module, x, f, opset_version=17, input_names=
    ["input"], output_names=["output"], dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, dynamo=...)``. The
    dynamo exporter (needs onnxscript) writes opset 18 whatever is asked (its lowest), with ReduceMean + Reshape as the
    head."""
    import onnx
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(module, (torch.zeros(batch, 3, hw, hw),), buffer, opset_version=17, input_names=["input"],
                          output_names=["output"], dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                          dynamo=dynamo)
    return onnx.load_from_string(buffer.getvalue())
