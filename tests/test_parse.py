import pytest

from cuforge.agent.parse import ParseError, apply_edit, parse_response

PARENT = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"


def test_full_module_in_a_fence_wins_over_other_blocks():
    text = ("Here is the idea:\n```cuda\n__global__ void k() {}\n```\nAnd the code:\n```python\n" + PARENT +
            "```\nDone.")
    p = parse_response(text)
    assert p.kind == "full" and p.source == PARENT


def test_unfenced_module_and_garbage():
    assert parse_response(PARENT).source == PARENT
    with pytest.raises(ParseError, match="no code block"):
        parse_response("I think you should use shared memory.")
    with pytest.raises(ParseError, match="none defines class ModelNew"):
        parse_response("```python\nprint('hi')\n```")
    with pytest.raises(ParseError, match="empty"):
        parse_response("   ")


def test_search_replace_edits_apply_to_the_parent():
    text = ("<<<<<<< SEARCH\n        return x.relu()\n=======\n        return x.clamp_min(0)\n>>>>>>> REPLACE\n")
    p = parse_response(text, PARENT)
    assert p.kind == "diff" and p.edits == 1 and "clamp_min(0)" in p.source and "relu()" not in p.source


def test_edits_tolerate_whitespace_but_not_ambiguity_or_mismatch():
    assert "clamp" in apply_edit(PARENT, "return   x.relu()", "        return x.clamp(min=0)")
    doubled = PARENT + PARENT
    with pytest.raises(ParseError, match="matches 2 places"):
        apply_edit(doubled, "        return x.relu()\n", "        return x\n")
    with pytest.raises(ParseError, match="does not match the parent"):
        apply_edit(PARENT, "return x.sigmoid()", "return x")
    with pytest.raises(ParseError, match="no parent"):
        parse_response("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE")
