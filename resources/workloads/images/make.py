"""Writes the `vision` workload's pictures, deterministically: photo-like scenes (a sky
gradient, hills, a sun, sensor noise) of four sizes, so that a projector that tiles large
images reads a different number of tiles for each.

    python resources/workloads/images/make.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
# name, width, height, seed, format
PICTURES = (
    ("dawn.png", 128, 128, 1, "PNG"),
    ("meadow.jpg", 320, 240, 2, "JPEG"),
    ("valley.jpg", 512, 384, 3, "JPEG"),
    ("coast.jpg", 640, 360, 4, "JPEG"),
)


def scene(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    top, bottom = rng.uniform(0.3, 1.0, 3), rng.uniform(0.0, 0.6, 3)
    img = np.empty((height, width, 3))
    for c in range(3):  # the sky: a vertical gradient with a slight tilt
        img[:, :, c] = top[c] * (1 - y) + bottom[c] * y + 0.1 * (x - 0.5) * (c - 1)
    # Hills: two sine ridges, each a flat colour shaded towards the bottom.
    for k in range(2):
        phase, amp, level = rng.uniform(0, 6.3), rng.uniform(0.04, 0.12), 0.55 + 0.2 * k
        ridge = level + amp * np.sin(2 * np.pi * (1.5 + k) * x + phase)
        colour = rng.uniform(0.05, 0.6, 3)
        below = y > ridge
        shade = 1 - 0.5 * (y - ridge).clip(0, 1)
        for c in range(3):
            img[:, :, c] = np.where(below, colour[c] * shade, img[:, :, c])
    # A sun: a soft disc in the sky.
    cx, cy, r = rng.uniform(0.2, 0.8), rng.uniform(0.1, 0.3), rng.uniform(0.05, 0.1)
    d = np.sqrt((x - cx) ** 2 * (width / height) ** 2 + (y - cy) ** 2)
    glow = np.exp(-((d / r) ** 4))
    img = img * (1 - glow[..., None]) + np.array([1.0, 0.95, 0.8]) * glow[..., None]
    img += rng.normal(0.0, 0.02, img.shape)  # sensor noise
    return (img.clip(0, 1) * 255).round().astype(np.uint8)


def main() -> None:
    for name, w, h, seed, fmt in PICTURES:
        im = Image.fromarray(scene(w, h, seed))
        options = {"quality": 85, "optimize": True} if fmt == "JPEG" else {"optimize": True}
        im.save(HERE / name, fmt, **options)


if __name__ == "__main__":
    main()
