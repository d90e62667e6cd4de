"""What training augmentation (crop and flip, --augmentation crop-flip) costs a local step: the augmentation of one
batch against one SGD step of the model it feeds, interleaved, medians (issue 35 item 8).

    python benchmarks/bench_augment.py --device cpu --repeats 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hasfl_ray.models import build_model  # noqa: E402
from hasfl_ray.training.augment import augment_batch  # noqa: E402


def timed(device: str, action) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    action()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, batch in (("cifar10", 32), ("preresnet18[3x32x32,10 classes,sbn,scaler on]", 10)):
        if name.startswith("preresnet"):
            from hasfl_ray.models.resnet import resnet_config
            from hasfl_ray.models import register_model
            name, config = resnet_config("preresnet18", 3, 10, (32, 32))
            register_model(name, config)
        model = build_model(name).to(args.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(batch, 3, 32, 32, device=args.device)
        y = torch.randint(0, 10, (batch,), device=args.device)
        fill = torch.zeros(3, device=args.device)

        def step():
            optimizer.zero_grad()
            F.cross_entropy(model(augmented[0]), y).backward()
            optimizer.step()

        augmented = [x]
        aug, train = [], []
        for k in range(args.repeats + 3):
            a = timed(args.device, lambda: augmented.__setitem__(0, augment_batch(x, 1, 0, 0, k, fill)))
            t = timed(args.device, step)
            if k >= 3:
                aug.append(a)
                train.append(t)
        rows.append((name.split("[")[0], batch, statistics.median(aug), statistics.median(train)))
    print(f"{'model':14s} {'batch':>5s} {'augment ms':>11s} {'step ms':>9s} {'augment / step':>15s}")
    for model, batch, a, t in rows:
        print(f"{model:14s} {batch:5d} {a * 1e3:11.3f} {t * 1e3:9.2f} {a / t:15.1%}")


if __name__ == "__main__":
    main()
