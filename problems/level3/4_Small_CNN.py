import torch
import torch.nn as nn

DESCRIPTION = "Small CNN classifier: three conv3x3-ReLU-maxpool stages, then Linear-ReLU-Linear"


class Model(nn.Module):
    """(conv3x3 -> ReLU -> MaxPool2d(2)) x 3 -> flatten -> Linear -> ReLU -> Linear."""

    def __init__(self, in_channels, channels, image_size, fc_hidden, num_classes):
        super().__init__()
        layers = []
        current = in_channels
        for width in channels:
            layers += [nn.Conv2d(current, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            current = width
        self.features = nn.Sequential(*layers)
        spatial = image_size // 2 ** len(channels)
        self.classifier = nn.Sequential(
            nn.Linear(current * spatial * spatial, fc_hidden),
            nn.ReLU(),
            nn.Linear(fc_hidden, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


batch_size = 128
in_channels = 3
channels = [32, 64, 128]
image_size = 128
fc_hidden = 512
num_classes = 1000


def get_inputs():
    return [torch.randn(batch_size, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, channels, image_size, fc_hidden, num_classes]
