"""The images of chat content parts (`{"type": "image_url", "image_url": {"url": ...}}`) read
into PIL images in the API process: `data:` URLs (base64), or http(s) URLs fetched with a
timeout and a size cap. Whatever fails (an undecodable image, one too large, a URL of another
scheme, an unreachable host) is an `ImageError`: the server answers a 400 naming the part.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.error
import urllib.request

from pagoda.runtime.multimodal.image_processing import MAX_IMAGE_PIXELS
from PIL import Image

MAX_IMAGE_BYTES = 20 << 20  # one image's encoded bytes (OpenAI's per-image limit: 20 MB)
FETCH_TIMEOUT_S = 10.0  # an http(s) image's fetch, connection and read
FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")  # what PIL may decode (no other plug-in runs)


class ImageError(ValueError):
    """An image part that cannot be read; `code` the OpenAI-style error code."""

    def __init__(self, message: str, code: str = "invalid_image") -> None:
        super().__init__(message)
        self.code = code


def read_url(url: str, max_bytes: int = MAX_IMAGE_BYTES, timeout: float = FETCH_TIMEOUT_S,
             what: str = "image") -> bytes:  # fmt: skip
    """The encoded image (`what`: or video) `url` names: a base64 `data:` URL's payload or an
    http(s) body."""
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ImageError(f"a data URL {what} must be base64: data:{what}/...;base64,...",
                             f"invalid_{what}_url")  # fmt: skip
        if len(payload) > (max_bytes + 2) // 3 * 4:
            raise ImageError(f"the {what} is larger than {max_bytes} bytes", f"{what}_too_large")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ImageError("the data URL's payload is not valid base64",
                             f"invalid_{what}_url") from None  # fmt: skip
        if len(data) > max_bytes:
            raise ImageError(f"the {what} is larger than {max_bytes} bytes", f"{what}_too_large")
        return data
    if not url.startswith(("http://", "https://")):
        raise ImageError(f"the {what} URL must be http(s):// or a base64 data: URL",
                         f"invalid_{what}_url")  # fmt: skip
    return _fetch(url, max_bytes, timeout, what)


def _fetch(url: str, max_bytes: int, timeout: float, what: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read(max_bytes + 1)
    except urllib.error.HTTPError as e:
        raise ImageError(
            f"fetching the {what} answered HTTP {e.code}", f"invalid_{what}_url"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ImageError(f"the {what} URL could not be fetched ({reason})",
                         f"invalid_{what}_url") from None  # fmt: skip
    if len(body) > max_bytes:
        raise ImageError(f"the {what} is larger than {max_bytes} bytes", f"{what}_too_large")
    return body


def decode(data: bytes) -> Image.Image:
    """The decoded image (one of `FORMATS`, at most `MAX_IMAGE_PIXELS`), fully read."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        if image.width * image.height > MAX_IMAGE_PIXELS:  # (the header alone is read yet)
            raise ImageError(f"the image has {image.width}x{image.height} pixels, more than "
                             f"{MAX_IMAGE_PIXELS}", "image_too_large")  # fmt: skip
        image.load()
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError(f"the image could not be decoded ({type(e).__name__})") from None
    return image


def load(url: str) -> Image.Image:
    """The image an `image_url` part names, decoded."""
    return decode(read_url(url))
