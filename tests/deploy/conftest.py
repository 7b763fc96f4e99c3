import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def pytest_terminal_summary(terminalreporter):
    """The sizes of the images test_images.py built (its record of them)."""
    images = sys.modules.get("test_images")
    for tag, size in (getattr(images, "IMAGE_SIZES", None) or {}).items():
        terminalreporter.write_line(f"image {tag}: {size / 1e6:.0f} MB")
