"""The deterministic tokenizer and chat template a client can reproduce without downloads."""

from __future__ import annotations

from pytest_inferbench.loadgen.tokenizer import (
    chat_prompt_tokens,
    count_tokens,
    filler_tokens,
    prompt_of_tokens,
    render_chat,
    text_to_tokens,
)


def test_one_token_per_whitespace_separated_word() -> None:
    assert count_tokens("") == 0
    assert count_tokens("  a  b\nc\td ") == 4


def test_prompt_of_exact_length() -> None:
    for n in (0, 1, 7, 1000):
        assert count_tokens(prompt_of_tokens(n, seed=n)) == n
    assert prompt_of_tokens(5, seed=1) == prompt_of_tokens(5, seed=1)
    assert prompt_of_tokens(5, seed=1) != prompt_of_tokens(5, seed=2)


def test_chat_template_costs_two_per_message_plus_one() -> None:
    messages = [("system", "be brief"), ("user", "what is two plus two")]
    rendered = render_chat(messages)
    assert rendered == ("<|im_start|>system be brief <|im_end|> <|im_start|>user what is two "
                        "plus two <|im_end|> <|im_start|>assistant")
    assert count_tokens(rendered) == chat_prompt_tokens(messages) == (2 + 2) + (2 + 5) + 1


def test_output_tokens_count_back_to_themselves() -> None:
    tokens = filler_tokens(50, "key")
    assert len(tokens) == 50 and all(t.startswith(" ") for t in tokens)
    assert count_tokens("".join(tokens[10:13])) == 3
    assert filler_tokens(50, "key") == tokens
    assert text_to_tokens("x  = 4\n#### 4") == [" x", " =", " 4", " ####", " 4"]
