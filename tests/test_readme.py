"""The README's Python example runs as written (on the CPU here, on the GPU where there is one)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run():
    blocks = [b for b in python_blocks() if "import torch" in b]
    assert blocks, "the README has no runnable Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
