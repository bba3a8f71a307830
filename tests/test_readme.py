"""The README's code examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_block(marker: str) -> str:
    """The ```python block that follows `<!-- marker -->` in the README."""
    match = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", README.read_text(), re.S)
    assert match, f"README has no python block after <!-- {marker} -->"
    return match.group(1)


def test_reuse_example_trains_a_classifier_on_the_encoder():
    namespace: dict = {}
    exec(compile(readme_block("reuse-example"), "README.md:reuse-example", "exec"), namespace)
    losses = namespace["losses"]
    assert len(losses) == 20
    assert losses[-1] < 0.5 * losses[0]
