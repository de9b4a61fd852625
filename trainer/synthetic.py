"""A small, learnable, download-free image set: coloured shapes on noisy backgrounds.

The class is the shape, never the colour: foreground and background colours,
position, size and noise are random, so a model has to learn geometry.
"""

from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("circle", "square", "triangle", "cross")


def _shape_mask(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    radius = rng.uniform(0.22, 0.38) * size
    cy, cx = rng.uniform(radius, size - radius, 2)
    dy, dx = yy - cy, xx - cx
    if shape == "circle":
        return dy * dy + dx * dx <= radius * radius
    if shape == "square":
        return (np.abs(dy) <= radius * 0.8) & (np.abs(dx) <= radius * 0.8)
    if shape == "triangle":
        # Apex up; the half-width grows linearly from the apex to the base.
        rel = (dy + radius) / (2 * radius)
        return (rel >= 0) & (rel <= 1) & (np.abs(dx) <= rel * radius)
    if shape == "cross":
        arm = radius * 0.3
        return ((np.abs(dy) <= arm) & (np.abs(dx) <= radius)) | (
            (np.abs(dx) <= arm) & (np.abs(dy) <= radius)
        )
    raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(CLASSES)}")


def render(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One HxWx3 uint8 image of ``shape``."""
    background = rng.uniform(0, 255, 3)
    foreground = rng.uniform(0, 255, 3)
    # Keep the shape visible: push the foreground away from the background.
    while np.abs(foreground - background).sum() < 180:
        foreground = rng.uniform(0, 255, 3)
    image = np.broadcast_to(background, (size, size, 3)).copy()
    image[_shape_mask(shape, size, rng)] = foreground
    image += rng.normal(0, 12, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_image_folder(root: Path, per_class: int, size: int = 32, seed: int = 0,
                       suffix: str = "png") -> Path:
    """Write ``per_class`` images (png or jpg) per class under ``root/<class>/``; returns ``root``."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    for shape in CLASSES:
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(render(shape, size, rng)).save(folder / f"{shape}_{i:05d}.{suffix}")
    return root
