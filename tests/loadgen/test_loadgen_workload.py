"""The workload and its prompt text: InferenceX length semantics, exact token counts, warmup
modes, determinism."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from pytest_inferbench.loadgen.prompts import MissingExtraError, point_workload, render
from pytest_inferbench.loadgen.tokenizer import count_tokens, render_chat
from pytest_inferbench.loadgen.workload import (
    DrawnRequests,
    LoadSettings,
    PlannedRequest,
    build_workload,
    poisson_offsets,
)
from pytest_inferbench.recipe.launch import ClientOptions


def test_drawn_requests_read_as_the_request_tuples_they_stand_for() -> None:
    """Drawn lengths are held as columns; every way of reading them gives the same requests,
    template tokens counted in, text keys in send order."""
    load = LoadSettings(prompts_per_conc=3, warmup_per_conc=0, seed=5)
    w = build_workload(512, 64, 4, load, chat_template=True, template_tokens=9)
    drawn = w.requests
    assert isinstance(drawn, DrawnRequests)
    expected = tuple(PlannedRequest(i, o, k) for k, (i, o) in
                     enumerate(zip(w.input_lens, w.output_lens, strict=True)))
    assert len(drawn) == 12 and tuple(drawn) == expected and drawn == expected
    assert drawn[-1] == expected[-1] and drawn[3:5] == expected[3:5]
    assert all(type(r.input_tokens) is int and r.input_tokens >= 9 for r in drawn)
    with pytest.raises(IndexError):
        drawn[12]
    other_seed = LoadSettings(prompts_per_conc=3, warmup_per_conc=0, seed=6)
    assert drawn != build_workload(512, 64, 4, other_seed, chat_template=True,
                                   template_tokens=9).requests
    assert not w.conversational and w.chains() == [[i] for i in range(12)]


def test_lengths_follow_inferencex_random_range_ratio() -> None:
    load = LoadSettings(prompts_per_conc=10, warmup_per_conc=2, range_ratio=0.8, seed=0)
    w = build_workload(1024, 256, 8, load)
    # InferenceX sample_random_requests: np.random.seed(seed), then randint for the inputs,
    # then for the outputs, each uniform in [int(L * ratio), L].
    np.random.seed(0)
    expect_in = np.random.randint(int(1024 * 0.8), 1024 + 1, size=80)
    expect_out = np.random.randint(int(256 * 0.8), 256 + 1, size=80)
    assert w.input_lens == expect_in.tolist()
    assert w.output_lens == expect_out.tolist()
    assert len(w.warmup) == 16
    assert w.send_offsets is None
    assert render(w).token_source == "words"


def test_range_ratio_one_gives_fixed_lengths() -> None:
    w = build_workload(512, 64, 4, LoadSettings(range_ratio=1.0))
    assert set(w.input_lens) == {512} and set(w.output_lens) == {64}
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        LoadSettings(range_ratio=1.5)


def test_warmup_same_repeats_the_first_prompt_distinct_draws_its_own() -> None:
    same = render(build_workload(256, 16, 4, LoadSettings(seed=2)))
    assert len(same.warmup) == 8
    assert {p.text for p in same.warmup} == {same.prompts[0].text}  # InferenceX: request 0
    assert same.workload.warmup == (same.workload.requests[0],) * 8
    distinct = render(build_workload(256, 16, 4, LoadSettings(seed=2, warmup="distinct")))
    texts = [p.text for p in distinct.warmup]
    assert len(set(texts)) == 8 and not set(texts) & {p.text for p in distinct.prompts}
    assert distinct.workload.requests == same.workload.requests  # measured part unchanged
    with pytest.raises(ValueError, match="warmup must be one of same, distinct"):
        LoadSettings(warmup="none")


def test_prompt_text_has_exactly_the_intended_tokens_for_the_simulator() -> None:
    w = render(build_workload(300, 16, 4, LoadSettings(prompts_per_conc=5, seed=3,
                                                         warmup="distinct")))
    for p in (*w.prompts, *w.warmup):
        assert count_tokens(p.text) == p.input_tokens  # the simulated server's own count


def test_prompts_do_not_share_a_prefix() -> None:
    w = render(build_workload(64, 8, 64, LoadSettings(prompts_per_conc=10, seed=0,
                                                        warmup="distinct")))
    heads = [tuple(p.text.split()[:8]) for p in (*w.prompts, *w.warmup)]
    assert len(set(heads)) == len(heads)


def test_chat_template_is_counted_inside_the_isl() -> None:
    client = ClientOptions(use_chat_template=True)
    w = render(point_workload(200, 16, 2, LoadSettings(prompts_per_conc=4, range_ratio=1.0),
                              client))
    assert w.chat_template
    for p in w.prompts:
        assert p.input_tokens == 200
        assert count_tokens(p.text) == 200
        body = p.text.removeprefix("<|im_start|>user ").removesuffix(
            " <|im_end|> <|im_start|>assistant")
        assert render_chat([("user", body)]) == p.text
    # A chat endpoint templates on the server: the client sends the bare prompt.
    chat = ClientOptions(use_chat_template=True, endpoint="/v1/chat/completions")
    bare = point_workload(200, 16, 2, LoadSettings(range_ratio=1.0), chat)
    assert not bare.chat_template and set(bare.input_lens) == {200}


def test_same_seed_same_workload_other_seed_other_text() -> None:
    load = LoadSettings(prompts_per_conc=3, seed=11)
    a = render(build_workload(128, 32, 4, load))
    b = render(build_workload(128, 32, 4, load))
    c = render(build_workload(128, 32, 4, LoadSettings(prompts_per_conc=3, seed=12)))
    assert a == b
    assert [p.text for p in a.prompts] != [p.text for p in c.prompts]


def test_open_loop_schedule_is_absolute_and_poisson() -> None:
    w = build_workload(32, 8, 4, LoadSettings(prompts_per_conc=10, request_rate=20.0, seed=0))
    assert w.send_offsets is not None
    assert len(w.send_offsets) == 40
    assert w.send_offsets[0] == 0.0
    assert all(b >= a for a, b in zip(w.send_offsets, w.send_offsets[1:], strict=False))
    offsets = poisson_offsets(50.0, 20000, seed=5)
    gaps = np.diff(offsets)
    # Exponential gaps: mean 1/rate, coefficient of variation 1 (sampling error ~1% here).
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="positive finite"):
        poisson_offsets(math.inf, 3, 0)


class GreedyTokenizer:
    """A tiny longest-match tokenizer whose merges change counts on re-encoding ("a"+"b" ->
    "ab"), the way BPE vocabularies do; enough to exercise the re-fitting loop."""

    VOCAB = ("a", "b", "ab", "ba", "c", " ", "<u>", "</u>", "<bot>")

    vocab_size = 6  # the base vocabulary, as Hugging Face counts it: special tokens excluded

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            best = max((t for t in range(len(self.VOCAB)) if text.startswith(self.VOCAB[t], i)),
                       key=lambda t: len(self.VOCAB[t]))
            ids.append(best)
            i += len(self.VOCAB[best])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.VOCAB[i] for i in ids)

    def apply_chat_template(self, conversation: list[dict[str, str]], **_: object) -> str:
        return "".join(f"<u>{m['content']}</u>" for m in conversation) + "<bot>"


class JinjaTokenizer(GreedyTokenizer):
    """Renders its chat template with jinja2, imported when a template is asked for, as
    transformers' tokenizers do."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **_: object) -> str:
        import jinja2

        template = jinja2.Template("{% for m in messages %}<u>{{ m.content }}</u>{% endfor %}"
                                   "<bot>")
        return template.render(messages=conversation)


def test_a_chat_template_without_jinja2_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = JinjaTokenizer()
    client = ClientOptions(use_chat_template=True)
    load = LoadSettings(prompts_per_conc=2, seed=1)
    rendered = render(point_workload(64, 8, 2, load, client, tok), tok)
    assert all(p.text.startswith("<u>") for p in rendered.prompts)
    monkeypatch.setitem(sys.modules, "jinja2", None)  # `import jinja2` raises ImportError
    with pytest.raises(MissingExtraError,
                       match=r"jinja2.*pip install 'pytest-inferbench\[tokenizer\]'"):
        render(point_workload(64, 8, 2, load, client, tok), tok)


@pytest.mark.parametrize("template", [False, True])
def test_tokenizer_prompts_hit_the_length(template: bool) -> None:
    tok = GreedyTokenizer()
    client = ClientOptions(use_chat_template=template)
    w = render(point_workload(64, 8, 4, LoadSettings(prompts_per_conc=5, seed=1), client, tok),
               tok)
    assert w.token_source == "tokenizer"
    for p in w.prompts:
        assert len(tok.encode(p.text)) == p.input_tokens
        assert p.text.startswith("<u>") == template
