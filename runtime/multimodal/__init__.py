"""Image input for vision-language models, torch-free (the API process imports it): the
vision tower's and the image processor's configs (`config`), the images as the engine receives
them (`inputs`: pixels, placeholder ranges, content hashes), CLIP-style preprocessing with PIL
and NumPy (`image_processing`), image parts of chat messages (`chat_images`) and the prefix
cache's per-block keys of the images a block holds (`hashing`). The torch side is the model's
tower (`model/clip_vision.py`, `model/llava.py`) and the runner's encoder step
(`worker/mm_encoder.py`).
"""
