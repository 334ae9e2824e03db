"""The checkpoint name grammar (trainguard.shared.pattern): the step read from names that hold
other values too (Lightning's ``epoch=0-step=3.ckpt``, metric values), wildcards, and the
patterns refused with a reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.shared.pattern import CheckpointPattern, checkpoint_pattern_problem


@pytest.mark.parametrize(
    ("pattern", "name", "step"),
    [
        # Lightning's default ModelCheckpoint and its usual file names
        ("epoch={epoch}-step={step}.ckpt", "epoch=0-step=3.ckpt", 3),
        ("epoch={epoch}-step={step}.ckpt", "epoch=12-step=4000.ckpt", 4000),
        ("epoch={epoch}-step={step}.ckpt", "last.ckpt", None),
        ("epoch={epoch}-step={step}.ckpt", "epoch=0-step=3-v1.ckpt", None),
        ("epoch={epoch}-step={step}.ckpt", "epoch=-step=3.ckpt", None),  # a field is not empty
        ("epoch={epoch}-step={step}.ckpt", "epoch=0-step=.ckpt", None),
        (
            "epoch={epoch}-step={step}-val_loss={val_loss:.2f}",
            "epoch=1-step=40-val_loss=0.12.ckpt",
            40,
        ),
        ("{step}-val_loss={val_loss}", "40-val_loss=-0.12.ckpt", 40),
        ("val_loss={val_loss}-step={step}", "val_loss=nan-step=7.ckpt", 7),
        ("{epoch}-{step}", "0-3", 3),
        ("{epoch}-{step}", "0-3.ckpt", 3),
        ("{epoch}-{step}", "3", None),
        ("step={step:05d}", "step=00042.ckpt", 42),
        # wildcards
        ("*-{step}", "checkpoint-500", 500),
        ("*-{step}", "-500", 500),  # a wildcard may be empty
        ("run*_{step}", "run_a_b_9.pt", 9),
        ("run*_{step}", "xrun_9.pt", None),
        # the old grammar, unchanged
        ("step_{step}", "step_100.pt", 100),
        ("step_{step}", "step_100.pt.part", None),
        ("checkpoint-{step}", "checkpoint-500", 500),
        ("{{{step}}}", "{5}.pt", 5),  # braces, escaped
        ("{step}", ".5", None),  # hidden names never
        ("*_{step}", ".x_5", None),
        ("*_{step}", "a/b_5", None),
    ],
)
def test_names(pattern: str, name: str, step: int | None) -> None:
    assert CheckpointPattern(pattern).step(name) == step


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("epoch={epoch}", "'{step}' once"),
        ("{step}-{step}", "'{step}' once"),
        ("{epoch}{step}", "set apart"),
        ("{step}*", "set apart"),
        ("*{step}{x}", "set apart"),
        ("step={step", "unexpected '{' at character 6"),
        ("step}={step}", "unexpected '}' at character 5"),
        ("{} {step}", "unexpected '{' at character 1"),
        ("{a b}-{step}", "unexpected '{'"),
        ("ckpt/{step}", "not a path"),
        (".{step}", "starting with '.'"),
        ("{step}.part", "ending with '.part'"),
    ],
)
def test_refused_with_the_reason(pattern: str, why: str) -> None:
    problem = checkpoint_pattern_problem(pattern)
    assert problem is not None and why in problem and repr(pattern) in problem
    with pytest.raises(ValueError, match="checkpoint pattern: "):
        CheckpointPattern(pattern)


def test_step_directories_and_their_temporary_names() -> None:
    p = CheckpointPattern("*-{step}")
    assert p.dir_step("checkpoint-500") == 500
    assert p.dir_step("checkpoint-500.ckpt") is None  # a directory is the pattern exactly
    # a wildcard never makes a framework's temporary name a final one
    for temp in ("tmp-checkpoint-500", "checkpoint-500.part", "x-500.orbax-checkpoint-tmp-17"):
        assert p.dir_step(temp) is None
        assert p.temp_dir_step(temp) == 500
    # a pattern that itself starts like a temporary name still names final directories
    assert CheckpointPattern("tmp-{step}").dir_step("tmp-5") == 5


_LITERAL = st.text("abxyz-_=", min_size=1, max_size=4)
_VALUE = st.from_regex(r"[0-9][0-9.]{0,5}", fullmatch=True)  # epochs, metric values
_EXT = st.sampled_from(["", ".ckpt", ".pt", ".safetensors"])


@st.composite
def _templates(draw: st.DrawFn) -> tuple[str, list[tuple[str, str | None]]]:
    """A pattern and its tokens, (kind, literal text): fields and wildcards anywhere, the step
    once, set apart from them by literal text."""
    before = draw(st.lists(st.sampled_from(["lit", "field", "star"]), max_size=3))
    after = draw(st.lists(st.sampled_from(["lit", "field", "star"]), max_size=3))
    kinds = [*before, "lit", "step", "lit", *after] if before else ["step", "lit", *after]
    if not after:
        kinds = kinds[: kinds.index("step") + 1] if draw(st.booleans()) else kinds
    tokens: list[tuple[str, str | None]] = []
    for i, kind in enumerate(kinds):
        tokens.append((kind, draw(_LITERAL) if kind == "lit" else f"f{i}"))
    pattern = "".join(
        {"lit": t or "", "field": f"{{{t}}}", "star": "*", "step": "{step}"}[k] for k, t in tokens
    )
    return pattern, tokens


@given(_templates(), st.integers(0, 10**18 - 1), st.data())
def test_any_template_gives_back_the_step(
    template: tuple[str, list[tuple[str, str | None]]], step: int, data: st.DataObject
) -> None:
    """Whatever the other fields hold (values without the literal text's characters), the step
    read from a name is the step it was made with, with or without an extension, and its
    ``.part`` is a checkpoint being written, not a checkpoint."""
    pattern, tokens = template
    p = CheckpointPattern(pattern)
    parts = []
    for kind, text in tokens:
        if kind == "lit":
            parts.append(text or "")
        elif kind == "step":
            parts.append(str(step))
        elif kind == "field":
            parts.append(data.draw(_VALUE))
        else:
            parts.append(data.draw(st.one_of(st.just(""), _VALUE)))
    name = "".join(parts) + data.draw(_EXT)
    if name.startswith("."):
        return
    assert p.step(name) == step, (pattern, name)
    assert p.step(name + ".part") is None
    assert p.partial_step(name + ".part") == step


@given(st.text(max_size=30), st.text(max_size=40))
def test_never_raises_but_value_error(pattern: str, name: str) -> None:
    """Any text as a pattern is accepted or refused with a reason; any name is a step or not."""
    problem = checkpoint_pattern_problem(pattern)
    if problem is not None:
        with pytest.raises(ValueError):
            CheckpointPattern(pattern)
        return
    p = CheckpointPattern(pattern)
    for got in (p.step(name), p.partial_step(name), p.dir_step(name), p.temp_dir_step(name)):
        assert got is None or 0 <= got < 10**18
