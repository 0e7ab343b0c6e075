"""EAGLE-3 heads on tiny random models: tapped target features, fused heads, lossless
drafting with them, teacher-forced data and streamed training (issue #27)."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cpu import forward_for, int8_layers, kernels
from engine.heads import stream
from engine.heads.files import HeadInfo, load_head, save_head
from engine.heads.model import EagleHead, HeadConfig, feature_layers_for, with_fusion
from engine.heads.train import (
    Features,
    TrainSetup,
    answer_flags,
    answer_windows,
    batch_losses,
    chat_ids,
    extract,
    held_out,
    reduced_lm_head,
)
from engine.spec.calibration import measure
from engine.spec.decoding import decode
from engine.spec.drafters import Draft
from engine.spec.drafters.eagle import EagleDrafter, quantize_head
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from engine.spec.session import ChatEngine
from tests.test_calibration import TickClock, measured
from tests.test_decoding import prompts, run
from tests.test_eagle import greedy_equals_plain, random_head
from tests.tiny import tiny_loaded, tiny_model, tiny_tokenizer

PROMPT = [3, 17, 42, 99, 7, 250, 11, 60]
LAYERS = 4
TAPS = feature_layers_for(LAYERS)  # (0, 1)


def native_model(kind: str = "qwen2", vocab_size: int = 320, scale: float = 1.0) -> torch.nn.Module:
    if not kernels.available():
        pytest.skip("native kernels need AVX2, FMA, F16C and a C++ compiler")
    model = tiny_model(kind, vocab_size=vocab_size, layers=LAYERS, dtype=torch.float32,
                       scale=scale, seed=1)
    int8_layers(model)  # the output layer too: row-independent like the rest
    return model


def test_the_fused_layers_lie_between_the_first_and_the_last() -> None:
    assert feature_layers_for(28) == (1, 13)
    assert feature_layers_for(4) == (0, 1)
    with pytest.raises(ValueError, match="too shallow"):
        feature_layers_for(3)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tapped_features_are_the_residual_streams_transformers_computes(kind: str) -> None:
    model = tiny_model(kind, layers=LAYERS)
    fwd = forward_for(model)
    size = int(model.config.hidden_size)
    with torch.inference_mode():
        _, hidden = fwd.step(PROMPT, fwd.new_cache(), 1, keep=True, taps=TAPS)
        out = model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
    assert hidden is not None and hidden.shape == (len(PROMPT), 3 * size)
    for i, layer in enumerate(TAPS):  # hidden_states[i + 1]: after layer i
        torch.testing.assert_close(hidden[:, i * size : (i + 1) * size],
                                   out.hidden_states[layer + 1][0], rtol=0, atol=1e-6)
    torch.testing.assert_close(hidden[:, -size:], out.hidden_states[-1][0], rtol=0, atol=1e-6)


def test_bad_taps_are_refused() -> None:
    fwd = forward_for(tiny_model(layers=LAYERS))
    for taps in ((1, 0), (0, 0), (3,), (-1,)):
        with pytest.raises(ValueError, match="must ascend"):
            fwd.step(PROMPT, fwd.new_cache(), 1, keep=True, taps=taps)


def test_native_tapped_features_match_the_reference_and_keep_the_row_promise(
        variant: str) -> None:
    model = native_model()
    native = forward_for(model)
    assert native.plan.backend == "native" and native.plan.variant == variant
    reference = forward_for(model)
    reference.decoder.native = None
    new = [9, 100, 42, 8, 1, 77]
    with torch.inference_mode():
        caches = [f.new_cache() for f in (native, reference, native)]
        for fwd, cache in zip((native, reference, native), caches, strict=True):
            fwd.step(PROMPT, cache, 0, keep=False)
        rows = native.step(new, caches[0], len(new), keep=True, taps=TAPS)
        ref = reference.step(new, caches[1], len(new), keep=True, taps=TAPS)
        singles = [native.step([t], caches[2], 1, keep=True, taps=TAPS) for t in new]
        plain = native.step(new, native.new_cache(), len(new), keep=True)
    assert rows[1] is not None and ref[1] is not None
    worst = float((rows[1] - ref[1]).abs().max())
    assert worst <= 0.03 * float(ref[1].abs().max())
    assert torch.equal(rows[0], torch.cat([s[0] for s in singles]))
    assert torch.equal(rows[1], torch.cat([s[1] for s in singles]))  # type: ignore[misc]
    size = int(model.config.hidden_size)
    assert plain[1] is not None and plain[1].shape[-1] == size  # no taps: the final state


def test_batched_native_steps_with_taps_give_each_sequence_its_own_step() -> None:
    model = native_model()
    fwd = forward_for(model)
    a, b, c, d = (fwd.new_cache() for _ in range(4))
    with torch.inference_mode():
        for cache in (a, c):
            fwd.step(PROMPT, cache, 0, keep=False)
        for cache in (b, d):
            fwd.step(PROMPT[:5], cache, 0, keep=False)
        together = fwd.step_many([([5, 6], a), ([7], b)], [2, 1], keep=True, taps=TAPS)
        alone = [fwd.step([5, 6], c, 2, keep=True, taps=TAPS), fwd.step([7], d, 1, keep=True,
                                                                         taps=TAPS)]
    for (x, hx), (y, hy) in zip(together, alone, strict=True):
        assert torch.equal(x, y) and hx is not None and hy is not None and torch.equal(hx, hy)


def test_the_runner_keeps_features_of_one_width_and_starts_over_for_another() -> None:
    model = tiny_model(layers=LAYERS)
    runner = ModelRunner(model)
    size = int(model.config.hidden_size)
    runner.keep_hidden(True)
    runner.sync(PROMPT)
    assert runner.hidden is not None and runner.hidden.shape == (len(PROMPT), size)
    narrow = runner.hidden.clone()
    runner.keep_hidden(True, TAPS)
    assert runner.ids == [] and runner.hidden is not None and runner.hidden.shape[-1] == 3 * size
    assert runner.cached(PROMPT, features=True) == 0  # only final features are parked
    runner.sync(PROMPT)
    wide = runner.hidden.clone()
    torch.testing.assert_close(wide[:, -size:], narrow, rtol=0, atol=1e-12)
    for taps, expected in (((), narrow), (TAPS, wide), ((), narrow)):
        runner.keep_hidden(True, taps)  # each width comes back from its own parked cache
        assert runner.resume(PROMPT) == len(PROMPT)
        assert runner.hidden is not None and torch.equal(runner.hidden, expected)
    runner.keep_hidden(False)
    assert runner.resume(PROMPT) == len(PROMPT)


def fused_head(target: torch.nn.Module, seed: int = 0, scale: float = 4.0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(target.config, 32, TAPS, fuse_rank=8))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(scale)
    return head.to(target.dtype).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_eagle3_equals_greedy_plain(kind: str) -> None:
    vocab = 64
    target = tiny_model(kind, vocab_size=vocab, layers=LAYERS, seed=1, scale=4.0)
    drafter = EagleDrafter(fused_head(target), target, min_confidence=0.0, draft_vocab=40,
                           keep_ids=[vocab - 1])
    assert drafter.feature_layers == TAPS
    greedy_equals_plain(target, drafter, vocab)


def test_greedy_eagle3_on_the_native_path_equals_greedy_plain(variant: str) -> None:
    vocab = 64
    target = native_model(vocab_size=vocab, scale=4.0)
    assert forward_for(target).plan.variant == variant
    drafter = EagleDrafter(quantize_head(fused_head(target, seed=2)), target,
                           min_confidence=0.0, draft_vocab=40, keep_ids=[vocab - 1])
    greedy_equals_plain(target, drafter, vocab, count=3, n=12)


def test_a_head_made_fused_drafts_what_it_drafted_before() -> None:
    vocab = 64
    target = tiny_model("qwen2", vocab_size=vocab, layers=LAYERS, seed=1, scale=4.0)
    torch.manual_seed(3)
    base = EagleHead(HeadConfig.for_target(target.config, 32)).to(target.dtype).eval()
    fused = with_fusion(base, TAPS).eval()
    context = prompts(1, vocab, seed=5)[0] + [4, 9, 12]
    drafts = []
    for head in (base, fused):
        runner = ModelRunner(target)
        runner.keep_hidden(True, head.config.feature_layers)
        runner.sync(context[:-1])
        drafter = EagleDrafter(head, target, min_confidence=0.0)
        drafter.observe_hidden(runner.hidden)
        drafts.append(drafter.propose(context, 4, SamplingParams(), torch.Generator()).tokens)
    assert drafts[0] == drafts[1] and len(drafts[0]) == 4
    with pytest.raises(ValueError, match="already fuses"):
        with_fusion(fused, TAPS)
    with pytest.raises(ValueError, match="at least one lower layer"):
        with_fusion(base, ())


def test_a_drafter_ignores_features_of_another_width() -> None:
    target = tiny_model("qwen2", vocab_size=64, layers=LAYERS, seed=1)
    drafter = EagleDrafter(fused_head(target), target, min_confidence=0.0)
    runner = ModelRunner(target)
    runner.keep_hidden(True)  # final features only: not what this head reads
    context = [t % 64 for t in PROMPT]
    runner.sync(context[:-1])
    drafter.observe_hidden(runner.hidden)
    assert drafter.propose(context, 3, SamplingParams(),
                           torch.Generator()).tokens == ()


def test_teacher_forced_features_are_the_targets_own_prefill() -> None:
    model = tiny_model("qwen2", layers=LAYERS)
    ids = torch.tensor([PROMPT, [5, 6, 7, 8, 9, 10, 11, 12]])
    data = extract(model, ids, top_k=4, progress=False, taps=TAPS)
    for i, window in enumerate(ids.tolist()):
        runner = ModelRunner(model)
        runner.keep_hidden(True, TAPS)
        logits = runner.forward(window, rows=len(window))
        assert runner.hidden is not None
        torch.testing.assert_close(data.hidden[i].float(), runner.hidden.float(),
                                   rtol=0, atol=1e-2)  # stored as float16
        top = logits.float().softmax(-1).topk(4, dim=-1)
        assert torch.equal(data.top_ids[i].long(), top.indices)


def write_chats(path: Path, count: int) -> Path:
    lines = []
    for i in range(count):
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": f"Please summarise item {i} of the list."},
            {"role": "assistant", "content": f"Item {i}: the quick brown fox jumps over the "
                                             f"lazy dog, {i * 7} times."}]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def stream_setup(model: torch.nn.Module, head: EagleHead, steps: int, checkpoint: Path
                 ) -> TrainSetup:
    embed = model.get_input_embeddings()
    ids = torch.arange(int(embed.num_embeddings))
    lookup = torch.arange(len(ids))
    return TrainSetup(head, embed, reduced_lm_head(model.get_output_embeddings(),
                                                   head.config.hidden_size, ids),
                      lookup, steps, 2, 3e-3, 0.0, 0.5, checkpoint, 2, unroll=2,
                      reg_weight=0.5)


def test_streamed_training_lowers_the_loss_resumes_and_makes_a_loadable_file(
        tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    model = tiny_model("qwen2", vocab_size=len(tok), layers=LAYERS, dtype=torch.float32, seed=2)
    chats = write_chats(tmp_path / "chats.jsonl", 40)
    args = stream.parse_args(["--target", "x", "--out", str(tmp_path / "h.safetensors"),
                              "--conversations", str(chats)])

    def source() -> Iterator[stream.Window]:
        return answer_windows(tok, stream.conversations(args, 0), 32)

    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target(model.config, 32, TAPS, fuse_rank=8))
    held = stream.held_windows(model, source(), 2, 8, TAPS, tmp_path / "held.pt")
    assert held.hidden.shape == (2, 32, 3 * int(model.config.hidden_size))
    checkpoint = tmp_path / "h.ckpt"
    first, read = stream.run(stream_setup(model, head, 12, checkpoint), model, source(), 6, 2.0,
                             4, 8)
    assert len(first) == 12 and torch.load(checkpoint, weights_only=True)["windows"] == 6
    assert read == 6
    again = EagleHead(head.config)
    more, read = stream.run(stream_setup(model, again, 24, checkpoint), model, source(), 12, 2.0,
                            4, 8)
    assert len(more) == 24 and read == 12 and more[:12] == first  # resumed after the windows read
    assert sum(more[-4:]) / 4 < sum(more[:4]) / 4
    measured = held_out(again, model.get_input_embeddings(), model.get_output_embeddings(), held)
    assert 0.0 <= measured.acceptance <= 1.0
    path = tmp_path / "h.safetensors"
    save_head(again, HeadInfo("tiny", None, len(tok), again.config, 12 * 32), path)
    loaded, info = load_head(path, "tiny", None, model)
    assert info.config.feature_layers == TAPS and loaded.fuses
    assert info.config.fuse_rank == again.config.fuse_rank
    for name, value in again.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value.half().float())


def test_answer_windows_mark_the_rows_whose_next_token_is_an_answers(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    chats = stream.corpus_mod.load(write_chats(tmp_path / "chats.jsonl", 6))
    follow_up = [*chats[0], {"role": "user", "content": "And the next item?"},
                 {"role": "assistant", "content": "Item 1 comes next."}]
    conversations = [chats[1], follow_up, chats[2], chats[3]]
    for messages in conversations:
        ids = chat_ids(tok, messages)
        flags = answer_flags(tok, messages, ids)
        marked = tok.decode([t for t, f in zip(ids, flags, strict=True) if f])
        for m in messages:
            assert (m["content"] in marked) == (m["role"] == "assistant")
        assert ids[: flags.index(True)] == tok.encode(tok.apply_chat_template(
            messages[:1], tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    stream_ids = [t for m in conversations for t in chat_ids(tok, m)]
    stream_flags = [f for m in conversations for f in answer_flags(tok, m, chat_ids(tok, m))]
    windows = list(answer_windows(tok, conversations, 16))
    assert len(windows) == len(stream_ids) // 16
    for n, (ids, mask) in enumerate(windows):
        at = n * 16
        assert ids.tolist() == stream_ids[at : at + 16]
        expected = [*stream_flags, False][at + 1 : at + 17]
        assert mask.tolist() == expected


def test_losses_on_answers_only_ignore_the_other_rows() -> None:
    model = tiny_model("qwen2", vocab_size=64, layers=LAYERS, dtype=torch.float32, seed=3)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    data = extract(model, ids, 8, progress=False, taps=TAPS)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, 5:9] = True
    head = fused_head(model, seed=1)
    setup = stream_setup(model, head, 4, Path("unused"))

    def losses(top_ids: torch.Tensor, masked: bool) -> tuple[float, float]:
        batch = Features(data.ids, data.hidden, top_ids, data.top_probs,
                         mask if masked else None)
        reg, ce = batch_losses(head, setup.embed, setup.w_s, setup.lookup, batch, 0.0, 2)
        return float(reg.detach()), float(ce.detach())

    other = data.top_ids.clone()
    other[:, :5] = (other[:, :5] + 1) % 64  # other targets on rows the mask leaves out
    assert losses(other, True) == losses(data.top_ids, True)
    assert losses(other, False)[1] != losses(data.top_ids, False)[1]
    other = data.top_ids.clone()
    other[:, 6] = (other[:, 6] + 1) % 64  # a row the mask counts
    assert losses(other, True)[1] != losses(data.top_ids, True)[1]


def test_streamed_training_on_answers_only_keeps_each_windows_mask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny_tokenizer()
    model = tiny_model("qwen2", vocab_size=len(tok), layers=LAYERS, dtype=torch.float32, seed=2)
    chats = stream.corpus_mod.load(write_chats(tmp_path / "chats.jsonl", 12))
    windows = list(answer_windows(tok, chats, 32))
    seen: list[Features] = []
    real = stream.train_step

    def step(setup: TrainSetup, opt: torch.optim.Optimizer, batch: Features, n: int
             ) -> tuple[float, float, float]:
        seen.append(batch)
        return real(setup, opt, batch, n)

    monkeypatch.setattr(stream, "train_step", step)
    head = fused_head(model, seed=1)
    for answers_only in (True, False):
        seen.clear()
        losses, read = stream.run(stream_setup(model, head, 3, tmp_path / f"{answers_only}.ckpt"),
                                  model, iter(windows), 3, 1.0, 1, 8, answers_only=answers_only)
        assert read == 3 and len(losses) == 3
        if answers_only:  # a buffer of one: each step's batch is the window just read
            assert [b.mask.tolist() for b in seen] == [[m.tolist()] for _, m in windows[:3]]
            masks = torch.cat([b.mask for b in seen if b.mask is not None])
            assert masks.any() and not masks.all()
        else:
            assert all(b.mask is None for b in seen)


def test_the_stream_command_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        stream.parse_args(["--target", "x", "--out", str(tmp_path / "h.safetensors")])
    with pytest.raises(SystemExit):
        stream.parse_args(["--target", "x", "--out", str(tmp_path / "h"), "--conversations",
                           str(tmp_path / "missing.jsonl")])
    with pytest.raises(SystemExit):
        stream.parse_args(["--target", "x", "--out", str(tmp_path / "h"), "--packages",
                           "--steps-per-window", "0"])


def test_package_chats_come_from_permissively_licensed_packages() -> None:
    chats = []
    for chat in stream.package_chats(("packaging",)):
        chats.append(chat)
        if len(chats) == 5:
            break
    assert chats and all(c[0]["role"] == "user" and c[1]["role"] == "assistant" for c in chats)


def test_the_engine_serves_an_eagle3_head_file_and_reports_it(tmp_path: Path) -> None:
    loaded = tiny_loaded("tiny-a", scale=4.0, layers=LAYERS)
    head = fused_head(loaded.model, seed=4)
    info = HeadInfo("tiny-a", None, int(loaded.model.config.vocab_size), head.config, 1234,
                    0.5, {"teacher_forced": True, "held_out_chain_accepted": 0.7})
    path = save_head(head, info, tmp_path / "h.safetensors")
    engine = ChatEngine(loaded, head=path)
    assert "eagle" in engine.methods
    messages = [{"role": "user", "content": "def add(a, b): quick brown fox"}]
    answers = [list(engine.generate(messages, max_tokens=30, method=m))[-1].token_ids
               for m in ("off", "eagle", "off", "eagle")]
    assert answers[0] == answers[1] == answers[2] == answers[3]
    reported = engine.speculation_report()["head"]
    assert reported["kind"] == "EAGLE-3" and reported["feature_layers"] == list(TAPS)
    assert reported["training_tokens"] == 1234 and reported["teacher_forced"] is True
    assert reported["shipped"] is False and reported["file"] == "h.safetensors"
    assert ChatEngine(tiny_loaded("tiny-b")).speculation_report()["head"] is None


def test_calibration_measures_heads_of_each_width_on_their_own_features() -> None:
    vocab = 64
    target = tiny_model("qwen2", vocab_size=vocab, layers=LAYERS, seed=1, scale=4.0)
    drafters = {"eagle1": EagleDrafter(random_head(target, seed=1), target, min_confidence=0.0),
                "eagle3": EagleDrafter(fused_head(target, seed=2), target, min_confidence=0.0)}
    drafted: dict[str, int] = {}
    for name, drafter in drafters.items():
        propose = drafter.propose

        def counted(*args: object, name: str = name, propose: object = propose) -> Draft:
            draft = propose(*args)  # type: ignore[operator]
            drafted[name] = drafted.get(name, 0) + len(draft.tokens)
            return draft

        drafter.propose = counted  # type: ignore[method-assign]
    cal, _ = measured(measure(target, drafters, "key", budget_s=0.0, clock=TickClock()))
    assert set(cal.step) == {"eagle1", "eagle3"}
    assert drafted["eagle1"] > 0 and drafted["eagle3"] > 0  # both read features they fit


@pytest.mark.parametrize(("kind", "fused"), [("llama", False), ("qwen2", True)])
def test_greedy_lookup_else_head_equals_greedy_plain(kind: str, fused: bool) -> None:
    """``hybrid-eagle``: passes the lookup drafts leave the head behind; it catches up on
    them at its next draft, and every answer stays plain decoding's."""
    vocab = 64
    target = tiny_model(kind, vocab_size=vocab, layers=LAYERS, seed=1, scale=4.0)
    head = fused_head(target) if fused else random_head(target)
    eagle = EagleDrafter(head, target, min_confidence=0.0, draft_vocab=40, keep_ids=[vocab - 1])
    calls = {"suffix": 0, "eagle": 0}  # drafts each part gave the hybrid
    eagle.propose = counted(eagle.propose, calls, "eagle", 1)  # type: ignore[method-assign]
    for i, prompt in enumerate(prompts(4, vocab, seed=12)):
        plain = run(target, prompt, n=24)
        # the lookup knows the first half of the answer; the head drafts the rest
        lookup = SuffixDrafter([[*prompt[-2:], *plain[:12]]], key_len=2)
        lookup.propose = counted(lookup.propose, calls, "suffix", 2)  # type: ignore[method-assign]
        hybrid = HybridDrafter({"suffix": lookup, "eagle": eagle}, min_lookup=2, model="eagle")
        eagle.reset()
        steps = decode(ModelRunner(target), prompt, params=SamplingParams(), max_new_tokens=24,
                       max_context=256, drafter=hybrid, num_draft_tokens=3,
                       first_token_first=i % 2 == 1)
        assert [t for s in steps for t in s.tokens] == plain, (prompt, i)
    assert calls["suffix"] and calls["eagle"]


def counted(propose: Callable[..., Draft], calls: dict[str, int], name: str, least: int
            ) -> Callable[..., Draft]:
    """``propose`` counting in ``calls[name]`` the drafts of at least ``least`` tokens."""

    def wrapped(*args: Any, **kwargs: Any) -> Draft:
        draft = propose(*args, **kwargs)
        calls[name] += len(draft) >= least
        return draft

    return wrapped
