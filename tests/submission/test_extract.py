from harness.submission.extract import extract, fenced_blocks

MODEL = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"


def test_python_file_is_taken_as_is():
    result = extract("x = 1\n", is_python_file=True)
    assert result.source == "x = 1\n" and result.syntax_error is None


def test_last_complete_python_block_defining_modelnew_wins():
    text = (f"Intro\n```python\n{MODEL}# first\n```\nmiddle\n```python\n{MODEL}# second\n```\n"
            "```python\n# only comments\n```\n```cuda\n__global__ void k() {{}}\n```\nThe end.")
    result = extract(text, is_python_file=False)
    assert result.source.endswith("# second\n")
    assert "Intro" in result.explanation and "The end." in result.explanation
    assert "__global__" not in result.explanation


def test_truncated_fence_is_not_code():
    text = f"```python\n{MODEL}```\nnow better:\n```python\n{MODEL}def forward(self, x):\n    return ("
    result = extract(text, is_python_file=False)
    assert result.source == MODEL  # the complete first block, not the cut-off second one


def test_cpp_blocks_only_is_no_code():
    result = extract("reasoning\n```cpp\nint main() {}\n```\n```cpp\nvoid f(", is_python_file=False)
    assert result.source is None and result.explanation.startswith("reasoning")


def test_think_blocks_are_not_explanation_but_their_code_counts():
    text = f"<think>let me try\n```python\n{MODEL}```\n</think>\nFinal words."
    result = extract(text, is_python_file=False)
    assert result.source == MODEL and result.explanation == "Final words."


def test_syntax_error_is_reported_with_line():
    text = "```python\nclass ModelNew(torch.nn.Module)\n    pass\n```"
    result = extract(text, is_python_file=False)
    assert result.source is not None and result.syntax_error.startswith("SyntaxError") and "line 1" in (
        result.syntax_error)


def test_bare_code_without_fences():
    assert extract(MODEL, is_python_file=False).source == MODEL
    assert extract("prose about ModelNew = great", is_python_file=False).source is None


def test_longer_fences_and_tildes():
    text = f"````python\n{MODEL}```inner```\n````\n~~~py\n{MODEL}~~~\n"
    blocks = fenced_blocks(text)
    assert [b.lang for b in blocks] == ["python", "py"]
