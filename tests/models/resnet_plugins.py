"""Dataset plug-ins of the ResNet tests: the embedded 8x8 digits training a ResNet-18 whose width-1 stages are tiny
(4, 8, 8, 16 channels), so that every algorithm trains one in well under a second a round."""

from hasfl_ray.data.digits import DigitsDataset

TINY_STAGES = [4, 8, 8, 16]


def tiny_config(kind: str, norm: str, scaler: bool = True) -> dict:
    return dict(kind=kind, in_channels=1, num_classes=10, image_size=8, norm=norm, scaler=scaler, stages=TINY_STAGES)


class _TinyDigits(DigitsDataset):
    def load(self, config):
        dataset = super().load(config)
        dataset.model = self.model  # the loader names the digits CNN
        return dataset


class TinyPreResNetDigits(_TinyDigits):
    """Digits on HeteroFL's PreResNet-18 layout with static BatchNorm and the Scaler."""

    model = "tiny-preresnet18-sbn"
    model_config = tiny_config("preresnet18", "sbn")


class TinyResNetDigits(_TinyDigits):
    """Digits on FjORD's post-activation ResNet-18 layout with GroupNorm and the Scaler."""

    model = "tiny-resnet18-gn"
    model_config = tiny_config("resnet18", "gn")
