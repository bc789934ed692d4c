"""`multimodal.chat_images`: data URLs, http(s) URLs fetched from a local server (timeout, size
cap), and each way an image part fails as an `ImageError` with its code."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import numpy as np
import pytest
from pagoda.runtime.multimodal import chat_images
from pagoda.runtime.multimodal.chat_images import ImageError
from PIL import Image


def _png(size=(12, 10), mode="RGB") -> bytes:
    rng = np.random.default_rng(0)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode).save(
        out, format="PNG"
    )
    return out.getvalue()


PNG = _png()


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/cat.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_data_and_http_urls_decode_to_the_same_image(site):
    a, b = chat_images.load(_data_url(PNG)), chat_images.load(f"{site}/cat.png")
    assert a.size == b.size == (12, 10)
    assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("data:image/png;base64,AAAA", "invalid_image", "could not be decoded"),
        ("data:image/png;base64,@@@", "invalid_image_url", "not valid base64"),
        ("data:image/png,rawbytes", "invalid_image_url", "must be base64"),
        ("file:///etc/passwd", "invalid_image_url", "http"),
        ("/missing.png", "invalid_image_url", "HTTP 404"),
        ("http://127.0.0.1:9/none.png", "invalid_image_url", "could not be fetched"),
    ],
)
def test_bad_images_are_image_errors(site, url, code, words):
    with pytest.raises(ImageError, match=words) as e:
        chat_images.load(site + url if url.startswith("/") else url)
    assert e.value.code == code


def test_the_size_caps(site):
    with pytest.raises(ImageError, match="larger than 100 bytes") as e:
        chat_images.read_url(_data_url(PNG), max_bytes=100)
    assert e.value.code == "image_too_large"
    with pytest.raises(ImageError, match="larger than 100 bytes"):
        chat_images.read_url(f"{site}/cat.png", max_bytes=100)
    huge = io.BytesIO()
    Image.new("1", (8001, 8001)).save(huge, format="PNG")  # 64 M pixels in a few kB
    with pytest.raises(ImageError, match="pixels") as e:
        chat_images.decode(huge.getvalue())
    assert e.value.code == "image_too_large"
