"""One image file to the RGB pixels a record stores, the way the serving signature decodes its bytes.

The served model decodes with TensorFlow (``tf.io.decode_image``, trainer/export.py); the converter
decodes with PIL. Where the two differ, the training set would not be what the model is served:

- **16-bit samples** keep their high byte, as TensorFlow's PNG decoder does when it is asked for
  8 bits (libpng's ``png_set_strip_16``, tensorflow/core/lib/png/png_io.cc): 3000 -> 11. PIL's
  ``convert("RGB")`` clips 16-bit greyscale instead (3000 -> 255); its 16-bit RGB already keeps the
  high byte. Mode "I" (32-bit integers, how older Pillows open a 16-bit greyscale PNG) is read as
  16-bit samples.
- **Large images** are made small before anything else touches them: a JPEG is decoded at 1/2, 1/4
  or 1/8 scale by libjpeg itself (``draft``) while still at least twice the target; any other
  format is decoded once at full size (PNG has no reduced decoding) and reduced by an integer
  factor in its own mode (``reducing_gap``), and only the small image is converted to RGB. Before,
  a 90-megapixel PNG held three full-size copies at once (745 MB in one process).
- **PIL's warnings** (a decompression-bomb warning above 89 megapixels, a palette with
  transparency, ...) become one line each, naming the file, instead of Python's raw two-line
  warning on the console. Above twice PIL's limit the file is refused as unreadable (PIL's
  ``DecompressionBombError``), like any corrupt file.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

# Modes whose samples are wider than 8 bits, reduced to their high byte (see the module docstring).
WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
# Shrink by an integer factor first while the image is at least this many times the target
# (PIL's reducing_gap: 3.0 is "indistinguishable from fair resampling" in Pillow's docs).
REDUCING_GAP = 3.0


def high_byte(image: Image.Image) -> Image.Image:
    """A 16-bit (or "I") greyscale image as 8-bit "L", keeping each sample's high byte."""
    samples = np.asarray(image)  # uint16 (either byte order), or int32 for "I".
    if samples.dtype.kind == "i":
        samples = np.clip(samples, 0, 0xFFFF)
    return Image.fromarray((samples >> 8).astype(np.uint8), "L")


def load_image(path: Path | str, size: int, notes: list[str] | None = None) -> np.ndarray:
    """The image as size x size x 3 uint8; raises ValueError if it is unreadable. PIL's warnings go
    to ``notes`` as one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pixels = _decode(Path(path), size)
        except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
            raise ValueError(f"{type(err).__name__}: {err}") from err
    if notes is not None:
        for warning in caught:
            notes.append(f"{warning.category.__name__}: {str(warning.message).splitlines()[0]}")
    return pixels


def _decode(path: Path, size: int) -> np.ndarray:
    with Image.open(path) as image:
        if image.format == "JPEG" and min(image.size) >= 2 * size:
            # libjpeg decodes at 1/2, 1/4 or 1/8 scale, still larger than the target: nearly the
            # same pixels after the resize below, several times faster and smaller.
            image.draft("RGB", (size, size))
        image.load()
        if image.mode in WIDE_MODES:
            image = high_byte(image)
        if image.size != (size, size):
            # RGB and greyscale resize in their own mode; anything else (alpha, which TensorFlow's
            # decoder drops before any resize, palette, CMYK) becomes RGB first.
            if image.mode not in ("RGB", "L"):
                image = image.convert("RGB")
            image = image.resize((size, size), Image.BILINEAR, reducing_gap=REDUCING_GAP)
        if image.mode != "RGB":
            image = image.convert("RGB")
        return np.asarray(image, dtype=np.uint8)
