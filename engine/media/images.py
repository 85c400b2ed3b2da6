"""An image a client sent, decoded with Pillow into the RGB pixels libmtmd takes.

Every way an image can be bad ends here as one `MediaError` line: no bytes, a format Pillow
cannot read, a header that promises more pixels than is sane (a decompression bomb is refused
before its pixels are decoded), a truncated or corrupt body. libmtmd's own decoder (stb_image)
is not used: Pillow reads more formats, applies the EXIF orientation and refuses a bomb early.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from engine.errors import EngineError
from engine.native.projector import Pixels

# A 40-megapixel photo is read; a header promising more is refused before decoding
# (Pillow's own bomb limit is 89 megapixels, and it only warns below twice that).
MAX_PIXELS = 40_000_000
# Projectors resize to a few hundred pixels a side (tiles included); a larger image is
# scaled down first so that no more than this is copied into libmtmd.
MAX_SIDE = 4096


class MediaError(EngineError):
    """An attachment that cannot be read, in one line for the user."""


def decode_image(data: bytes, name: str = "the image") -> Pixels:
    """`data` (a PNG, JPEG, WebP, GIF, BMP, TIFF... file) as RGB pixels."""
    if not data:
        raise MediaError(f"{name} is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im: Image.Image = Image.open(io.BytesIO(data))
            w, h = im.size
            if w < 1 or h < 1:
                raise MediaError(f"{name} has no pixels ({w}x{h})")
            if w * h > MAX_PIXELS:
                raise MediaError(
                    f"{name} is {w}x{h} pixels; the most Candlewick reads is "
                    f"{MAX_PIXELS // 1_000_000} megapixels"
                )
            im.load()
            im = ImageOps.exif_transpose(im) or im
            if im.mode != "RGB":
                im = _flatten(im)
            if max(im.size) > MAX_SIDE:
                im.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
            return Pixels(im.width, im.height, im.tobytes())
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError(
            f"{name} is not an image Candlewick can read (PNG, JPEG, WebP, GIF, BMP or TIFF)"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(
            f"{name} declares more pixels than it can hold (a decompression bomb)"
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise MediaError(f"{name} is truncated or corrupt ({_short(e)})") from None


def _flatten(im: Image.Image) -> Image.Image:
    """RGB, with transparency composed over white (what a viewer shows)."""
    if im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGB", rgba.size, (255, 255, 255))
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return bg
    return im.convert("RGB")


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:120]


__all__ = ["MAX_PIXELS", "MAX_SIDE", "MediaError", "decode_image"]
