"""The short output layer of drafters: the kept ids' logits unchanged, the rest ``-inf``;
rankings read from files, and every bad file a logged fallback to the low-id rule."""

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType as QuantType
from torch import nn

from engine.cpu import kernels
from engine.cpu.gguf import decode_int4, decode_q6_k
from engine.cpu.layers import Int8Linear, Q4KLinear, Q4Linear, Q6KLinear, Q6KPLinear, Q8Linear
from engine.models.loading import LoadedModel
from engine.spec.decoding import decode
from engine.spec.drafters import vocab as vocab_mod
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.eagle import EagleDrafter
from engine.spec.drafters.tree import choose
from engine.spec.drafters.vocab import (
    Ranking,
    ShortHead,
    as_int4,
    draft_head,
    frequent_ids,
    kept_logits,
    load_ranking,
    save_ranking,
    short_head,
    tokenizer_hash,
)
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from tests.stats import matches
from tests.test_decoding import _exact_two_token_distribution
from tests.test_eagle import random_head
from tests.test_quant import q4_k_blocks, q6_k_blocks
from tests.tiny import tiny_model

VOCAB, HIDDEN, SIZE = 96, 64, 40
NATIVE = pytest.mark.skipif(not kernels.available(), reason="needs the native kernels (AVX2)")


def check(layer: nn.Module, exact: bool, hidden: int = HIDDEN) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, hidden)
    short = short_head(layer, extra_ids=[90, 3, 95], size=SIZE)
    assert isinstance(short, ShortHead)
    full, out = layer(x), short(x)  # [3, V]
    kept = torch.tensor([*range(SIZE), 90, 95])
    same = torch.equal if exact else torch.allclose
    assert same(out[:, kept], full[:, kept])
    dropped = torch.ones(VOCAB, dtype=torch.bool)
    dropped[kept] = False
    assert torch.isinf(out[:, dropped]).all() and (out[:, dropped] < 0).all()


def check_gathered(layer: nn.Module, exact: bool, hidden: int = HIDDEN) -> None:
    """A ranking's ids (any order, with a duplicate end token) gathered into one layer."""
    torch.manual_seed(0)
    x = torch.randn(3, hidden)
    ranked = [77, 5, 60, 12, 90, 31, 0, 95]
    short = short_head(layer, extra_ids=[95, 93], ids=ranked)
    assert isinstance(short, ShortHead) and not len(short.extra_ids)
    full, out = layer(x), short(x)  # [3, V]
    kept = torch.tensor(sorted({*ranked, 93}))
    assert torch.equal(short.kept, kept) and short.size == len(kept)
    same = torch.equal if exact else torch.allclose
    assert same(out[:, kept], full[:, kept])
    dropped = torch.ones(VOCAB, dtype=torch.bool)
    dropped[kept] = False
    assert torch.isinf(out[:, dropped]).all() and (out[:, dropped] < 0).all()


def test_a_dense_head_keeps_the_frequent_and_named_ids() -> None:
    torch.manual_seed(1)
    # torch's float product of fewer rows may take another BLAS path: same rows, maybe
    # not the same bits (they differ on an AVX2 EPYC)
    check(nn.Linear(HIDDEN, VOCAB, bias=True), exact=False)
    check_gathered(nn.Linear(HIDDEN, VOCAB, bias=True), exact=False)


def quantized(kind: str) -> tuple[nn.Module, int]:
    """A ``kind`` layer of VOCAB rows and its input size."""
    torch.manual_seed(2)
    weight, bias = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB)
    if kind == "q4":
        return Q4Linear.from_dense(weight, bias), HIDDEN
    if kind == "q8":
        return Q8Linear.from_weight(weight), HIDDEN
    if kind == "int8":
        return Int8Linear.from_weight(weight, bias), HIDDEN
    k = 256  # the K-quants' super-block
    if kind == "q4k":
        return Q4KLinear.from_groups(decode_int4(q4_k_blocks(VOCAB, k), QuantType.Q4_K, VOCAB, k),
                                     torch.randn(VOCAB)), k
    blocks = decode_q6_k(q6_k_blocks(VOCAB, k), VOCAB, k)
    return (Q6KPLinear if kind == "q6kp" else Q6KLinear).from_blocks(blocks), k


@NATIVE
@pytest.mark.parametrize("kind", ["q4", "q8", "q4k", "q6k", "q6kp"])
def test_quantized_heads_give_the_same_rows_bit_for_bit(kind: str) -> None:
    layer, hidden = quantized(kind)
    check(layer, exact=True, hidden=hidden)
    check_gathered(layer, exact=True, hidden=hidden)


def test_int8_heads_give_the_same_rows() -> None:
    layer, hidden = quantized("int8")  # torch's int8 product: same rows, maybe not same bits
    check(layer, exact=False, hidden=hidden)
    check_gathered(layer, exact=False, hidden=hidden)


def test_a_small_vocabulary_or_an_unknown_layer_is_left_alone() -> None:
    small = nn.Linear(HIDDEN, SIZE)
    assert short_head(small, [], size=SIZE) is small
    assert short_head(small, [1], ids=range(SIZE)) is small  # every id kept

    class Odd(nn.Module):
        out_features = VOCAB

    odd = Odd()
    assert short_head(odd, [], size=SIZE) is odd
    assert short_head(odd, [], ids=[1, 2]) is odd


def test_ids_outside_the_vocabulary_are_ignored() -> None:
    layer = nn.Linear(HIDDEN, VOCAB)
    short = short_head(layer, extra_ids=[VOCAB + 5], ids=[3, 1, VOCAB, -1])
    assert torch.equal(short.kept, torch.tensor([1, 3]))


@NATIVE
def test_an_int4_short_head_rounds_only_the_kept_rows() -> None:
    torch.manual_seed(3)
    layer = nn.Linear(HIDDEN, VOCAB, bias=True)
    short = short_head(layer, extra_ids=[90, 95], size=SIZE, int4=True)
    assert isinstance(short, ShortHead) and isinstance(short.frequent, Q4Linear)
    x = torch.randn(3, HIDDEN)
    full, out = layer(x), short(x)  # [3, V]
    assert torch.allclose(out[:, [90, 95]], full[:, [90, 95]])  # the named rows stay exact
    rounded = (out[:, :SIZE] - full[:, :SIZE]).abs().max() / full[:, :SIZE].abs().max()
    assert 0 < rounded < 0.1  # 4 bits per 32 inputs: close, not equal
    assert torch.isinf(out[:, SIZE:90]).all()
    assert isinstance(as_int4(nn.Linear(HIDDEN, SIZE)), Q4Linear)
    gathered = short_head(layer, extra_ids=[95], ids=[50, 7], int4=True)
    assert isinstance(gathered.frequent, Q4Linear)
    assert torch.allclose(gathered(x)[:, [7, 50, 95]], full[:, [7, 50, 95]], rtol=0.1, atol=0.1)


def test_int4_leaves_layers_it_cannot_read_or_run_alone() -> None:
    odd = nn.Linear(HIDDEN + 1, VOCAB)  # not a multiple of 32 inputs
    assert as_int4(odd) is odd
    q8 = Q8Linear.from_weight(torch.randn(VOCAB, HIDDEN)) if kernels.available() else odd
    assert as_int4(q8) is q8


class Tokenizer:
    """Just enough of a tokenizer for the hash: a string per id."""

    def __init__(self, size: int, salt: str = "") -> None:
        self.size, self.salt = size, salt

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}{self.salt}": i for i in range(self.size)}


def write(folder: Path, name: str, ids: list[int], tokenizer: Tokenizer) -> Path:
    path = folder / f"{name}{vocab_mod.SUFFIX}"
    save_ranking(path, Ranking(torch.tensor(ids), tokenizer_hash(tokenizer), {"why": "test"}))
    return path


def test_a_ranking_round_trips_and_gives_its_top_ids_sorted(tmp_path: Path) -> None:
    tok = Tokenizer(VOCAB)
    path = write(tmp_path, "a", [9, 4, 70, 2, 33], tok)
    ranking = load_ranking(path)
    assert ranking.ids.tolist() == [9, 4, 70, 2, 33] and ranking.info == {"why": "test"}
    assert ranking.top(3).tolist() == [4, 9, 70]
    assert frequent_ids(tok, VOCAB, size=3, folder=tmp_path).tolist() == [4, 9, 70]  # type: ignore[union-attr]
    assert tokenizer_hash(tok) != tokenizer_hash(Tokenizer(VOCAB, salt="x"))


def test_the_drafter_head_uses_a_fitting_ranking(tmp_path: Path) -> None:
    tok = Tokenizer(VOCAB)
    write(tmp_path, "other", [1, 2, 3], Tokenizer(VOCAB, salt="x"))  # another tokenizer
    write(tmp_path, "mine", [50, 60, 70, 80], tok)
    layer = nn.Linear(HIDDEN, VOCAB)
    head = draft_head(layer, [95], tok, size=2, folder=tmp_path)
    assert isinstance(head, ShortHead) and head.kept.tolist() == [50, 60, 95]


def fallback(tmp_path: Path, caplog: pytest.LogCaptureFixture, tok: Tokenizer | None,
             words: str) -> None:
    layer = nn.Linear(HIDDEN, VOCAB)
    with caplog.at_level(logging.INFO, logger=vocab_mod.__name__):
        head = draft_head(layer, [95], tok, size=SIZE, folder=tmp_path)
    assert isinstance(head, ShortHead) and head.kept.tolist() == [*range(SIZE), 95]  # low ids
    if words:
        assert words in caplog.text


def test_no_ranking_falls_back_to_low_ids(tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    fallback(tmp_path, caplog, Tokenizer(VOCAB), "no ranked list for this tokenizer")
    fallback(tmp_path, caplog, None, "")  # no tokenizer (tests' bare models)


def test_a_mismatched_ranking_falls_back_logged(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, "other", [1, 2, 3], Tokenizer(VOCAB, salt="x"))
    fallback(tmp_path, caplog, Tokenizer(VOCAB), "no ranked list for this tokenizer")
    tok = Tokenizer(VOCAB, salt="y")
    write(tmp_path, "big", [1, VOCAB + 3], tok)  # made for a larger output layer
    fallback(tmp_path, caplog, tok, "names ids beyond the model's 96 rows")


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all", b"\xff" * 64])
def test_a_damaged_ranking_file_is_skipped_logged(tmp_path: Path, content: bytes,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / f"broken{vocab_mod.SUFFIX}").write_bytes(content)
    fallback(tmp_path, caplog, Tokenizer(VOCAB), "skipping")


def test_a_foreign_safetensors_file_is_skipped_logged(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from safetensors.torch import save_file

    save_file({"ids": torch.tensor([1, 2])}, str(tmp_path / f"a{vocab_mod.SUFFIX}"))  # no format
    save_file({"ids": torch.tensor([[1, 2]], dtype=torch.int32)},
              str(tmp_path / f"b{vocab_mod.SUFFIX}"),
              metadata={"format": vocab_mod.FORMAT, "tokenizer_sha256": "0"})  # 2-d
    save_file({"ids": torch.tensor([1, 1], dtype=torch.int32)},
              str(tmp_path / f"c{vocab_mod.SUFFIX}"),
              metadata={"format": vocab_mod.FORMAT, "tokenizer_sha256": "0"})  # repeated
    fallback(tmp_path, caplog, Tokenizer(VOCAB), "skipping")
    for name in "abc":
        assert f"{name}{vocab_mod.SUFFIX}" in caplog.text


GREEDY = SamplingParams()


def loaded(model: nn.Module, tokenizer: Tokenizer | None) -> LoadedModel:
    return LoadedModel("m", model, tokenizer, None, model.config.max_position_embeddings)


def plain(target: nn.Module, prompt: list[int], n: int = 20) -> list[int]:
    steps = decode(ModelRunner(target), prompt, params=GREEDY, max_new_tokens=n,
                   max_context=256)
    return [t for step in steps for t in step.tokens]


def spy(drafter: Any) -> list[int]:
    """The tokens ``drafter`` proposes from now on (a list that grows)."""
    proposed: list[int] = []
    propose = drafter.propose

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        draft = propose(*args, **kwargs)
        proposed.extend(draft.tokens)
        return draft

    drafter.propose = recording
    return proposed


def ranked_without_likely(target: nn.Module, prompts: list[list[int]], vocab: int,
                          folder: Path) -> tuple[list[list[int]], list[int], list[int], Tokenizer]:
    """Plain answers, the 6 ids they use most, a ranking of all other ids (written to
    ``folder``) and its tokenizer."""
    plains = [plain(target, p) for p in prompts]
    said = torch.bincount(torch.tensor([t for p in plains for t in p]), minlength=vocab)
    likely = said.argsort(descending=True)[:6].tolist()
    ranked = [i for i in range(vocab) if i not in likely][::-1]  # any order; no likely id
    tok = Tokenizer(vocab)
    write(folder, "tiny", ranked, tok)
    return plains, likely, ranked, tok


PROMPTS = [[5, 9, 14, 5, 9], [30, 31, 32], [7] * 6, [40, 2, 18, 40, 2, 18]]


def test_greedy_eagle_over_a_ranking_without_the_likely_tokens_equals_plain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranking leaves out the ids plain decoding says most: those are never drafted,
    and the answers stay the same."""
    vocab = 64
    target = tiny_model("llama", vocab_size=vocab, seed=1, scale=4.0)
    plains, likely, ranked, tok = ranked_without_likely(target, PROMPTS, vocab, tmp_path)
    monkeypatch.setattr(vocab_mod, "ASSETS", tmp_path)
    drafter = EagleDrafter(random_head(target), target, min_confidence=0.0,
                           draft_vocab=len(ranked), keep_ids=[vocab - 1], tokenizer=tok)
    assert drafter.lm_head.kept.tolist() == sorted({*ranked, vocab - 1})
    proposed, drafted = spy(drafter), 0
    for i, (prompt, answer) in enumerate(zip(PROMPTS, plains, strict=True)):
        steps = list(decode(ModelRunner(target), prompt, params=GREEDY, max_new_tokens=20,
                            max_context=256, drafter=drafter, num_draft_tokens=2 + i))
        assert [t for s in steps for t in s.tokens] == answer
        drafted += sum(s.drafted for s in steps)
    assert drafted > 0 and proposed and not set(proposed) & set(likely)


def test_greedy_draft_model_over_a_ranking_without_the_likely_tokens_equals_plain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft is the target itself, its ranking without the likely ids: every draft it
    may make is right, the likely ids are never drafted, the answers the same."""
    vocab = 64
    target = tiny_model("llama", vocab_size=vocab, seed=1, scale=4.0)
    same = tiny_model("llama", vocab_size=vocab, seed=1, scale=4.0)
    plains, likely, ranked, tok = ranked_without_likely(target, PROMPTS, vocab, tmp_path)
    monkeypatch.setattr(vocab_mod, "ASSETS", tmp_path)
    accepted = 0
    for prompt, answer in zip(PROMPTS, plains, strict=True):
        drafter = DraftModelDrafter(loaded(same, tok), vocab, min_confidence=0.0,
                                    draft_vocab=len(ranked), int4_vocab=False, window=None,
                                    ranked_vocab=True)
        proposed = spy(drafter)
        steps = list(decode(ModelRunner(target), prompt, params=GREEDY, max_new_tokens=20,
                            max_context=256, drafter=drafter, num_draft_tokens=3))
        assert [t for s in steps for t in s.tokens] == answer
        accepted += sum(s.accepted for s in steps)
        if getattr(drafter.runner, "lean", True) is not None:  # its logits from the short head
            assert not set(proposed) & set(likely)
    assert accepted > 0


def test_sampling_over_a_ranking_keeps_the_target_distribution_outside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """q is zero outside the kept ids, so the target's likeliest tokens, left out of the
    ranking, still come with their probability (from the rejections' residual)."""
    vocab = 8
    target = tiny_model("llama", vocab_size=vocab, seed=11, scale=3.0)
    prompt = [1, 2, 3]
    exact = _exact_two_token_distribution(target, prompt)
    first = exact.reshape(vocab, vocab).sum(1)
    ranked = first.argsort().tolist()[:5]  # the 3 likeliest first tokens left out
    tok = Tokenizer(vocab)
    write(tmp_path, "tiny", ranked, tok)
    monkeypatch.setattr(vocab_mod, "ASSETS", tmp_path)
    drafter = EagleDrafter(random_head(target), target, min_confidence=0.0,
                           draft_vocab=len(ranked), tokenizer=tok)
    proposed = spy(drafter)
    counts = torch.zeros(vocab * vocab)
    drafted = 0
    runner = ModelRunner(target)
    for seed in range(1500):
        params = SamplingParams(temperature=1.0, seed=seed)
        steps = list(decode(runner, prompt, params=params, max_new_tokens=2, max_context=256,
                            drafter=drafter, num_draft_tokens=2,
                            generator=torch.Generator().manual_seed(seed)))
        drafted += sum(s.drafted for s in steps)
        t1, t2 = [t for s in steps for t in s.tokens][:2]
        counts[t1 * vocab + t2] += 1
    assert drafted > 0 and set(proposed) <= set(ranked)
    assert counts.reshape(vocab, vocab).sum(1)[first.argsort()[5:]].sum() > 0  # left-out ids
    assert matches(counts, exact)


def test_the_frequency_tool_ranks_by_share_per_source_then_by_the_id_prior() -> None:
    import numpy as np

    from engine.heads.vocab import chains, permissive, rank

    big = np.array([0, 0, 50, 50, 0, 0])  # a large source
    small = np.array([0, 3, 0, 0, 0, 1])  # a small one weighs as much
    assert rank([big, small]).tolist() == [1, 2, 3, 5]  # uncounted ids left out
    assert rank([big, small], prior_weight=0.01, offset=1).tolist()[-2:] == [0, 4]
    assert permissive("MIT") and permissive("BSD-3-Clause AND 0BSD")
    assert not permissive("MPL-2.0 AND MIT") and not permissive("LGPL-3.0-only")
    # two chains of 3: the first right twice then wrong; the second stops drafting after 1
    hit = torch.tensor([[True, True], [True, False], [False, True]])
    confident = torch.tensor([[True, False], [True, True], [True, True]])
    right = torch.ones(3, 2, dtype=torch.bool)
    assert chains(hit, confident, right, k=3) == (3.0, 4.0)  # accepted 2 + 1, drafted 3 + 1


def test_answer_spans_split_a_chat_where_its_last_answer_begins() -> None:
    from engine.heads.answers import prompt_ids
    from engine.heads.train import chat_ids
    from engine.heads.vocab import answer_spans
    from tests.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    chat = [{"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "general kenobi"}]
    ids, start = answer_spans(tokenizer, chat)
    assert ids == chat_ids(tokenizer, chat) and ids[:start] == prompt_ids(tokenizer, chat[:1])
    assert tokenizer.decode(ids[start:]).startswith("general kenobi")


@pytest.mark.parametrize("gathered", [False, True])
def test_kept_logits_are_the_finite_part_of_the_full_logits(gathered: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(HIDDEN, VOCAB, bias=False)
    short = (short_head(layer, extra_ids=[95, 93], ids=[77, 5, 60, 12, 90])
             if gathered else short_head(layer, extra_ids=[90, 3, 95], size=SIZE))
    assert isinstance(short, ShortHead)
    x = torch.randn(2, HIDDEN)
    logits, ids = kept_logits(short, x)  # [2, N], [N]
    assert ids is not None and torch.equal(ids, short.kept)  # ascending, each once
    assert torch.equal(logits, short(x)[:, ids])
    full, none = kept_logits(layer, x)
    assert none is None and torch.equal(full, layer(x))


def test_a_greedy_choice_over_the_kept_ids_is_the_one_over_the_vocabulary() -> None:
    torch.manual_seed(1)
    layer = nn.Linear(HIDDEN, VOCAB, bias=False)
    short = short_head(layer, extra_ids=[90, 95], size=SIZE)
    greedy, generator = SamplingParams(), torch.Generator()
    for row in torch.randn(20, HIDDEN) * 3:
        logits, ids = kept_logits(short, row[None])
        fast = choose(logits[0], greedy, generator, 2, ids=ids)
        full = choose(short(row[None])[0], greedy, generator, 2)
        assert (fast.token, [t for t, _ in fast.alternatives]) == \
            (full.token, [t for t, _ in full.alternatives])
        assert fast.confidence == pytest.approx(full.confidence)
    with pytest.raises(ValueError, match="whole vocabulary"):
        choose(logits[0], SamplingParams(temperature=1.0), generator, ids=ids)


@pytest.mark.parametrize("target_vocab", [250, 400])
def test_greedy_draft_model_steps_read_only_the_kept_logits_and_draft_the_same(
        target_vocab: int) -> None:
    """The draft model's greedy steps take the short head's kept logits, never the whole
    vocabulary's, and draft what the spread logits draft: the same chains and leaves. A
    target vocabulary smaller than the draft's drops the kept ids it lacks (300 here)."""
    draft = tiny_model("llama", vocab_size=320, seed=3, scale=3.0)
    model = LoadedModel("m", draft, None, None, 256, eos_ids=frozenset({2, 300}))

    def drafter() -> DraftModelDrafter:
        return DraftModelDrafter(model, target_vocab, min_confidence=0.0, draft_vocab=200,
                                 branches=2, min_branch=0.0, int4_vocab=False, window=None)

    fast, spread = drafter(), drafter()
    assert fast.short is not None
    expected = [i for i in [*range(200), 300] if i < target_vocab]
    assert fast.columns.tolist() == expected
    spread.short = None  # forced onto the path that spreads the logits over the vocabulary

    def never(x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a greedy step spread its logits over the vocabulary")

    fast.short.forward = never  # type: ignore[method-assign]
    generator, chains = torch.Generator(), 0
    for prompt in [*PROMPTS, [int(t) for t in torch.randint(3, 320, (40,))]]:
        context = list(prompt)
        for _ in range(6):
            a = fast.propose(context, 4, GREEDY, generator)
            b = spread.propose(context, 4, GREEDY, generator)
            assert (a.tokens, a.parents, a.catch_up) == (b.tokens, b.parents, b.catch_up)
            assert a.probs is None and set(a.tokens) <= set(expected)
            chains += a.parents is not None
            context += [a.tokens[0], (a.tokens[0] * 7 + 1) % 250]
    assert chains > 0  # some drafts had leaves beside the chain
    with pytest.raises(AssertionError, match="spread"):  # sampling still spreads them
        fast.propose(context, 2, SamplingParams(temperature=1.0), generator)
