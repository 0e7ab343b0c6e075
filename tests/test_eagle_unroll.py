"""Training heads on the target's own answers and on their own later draft steps."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, DynamicCache

from engine.cpu import Stack
from engine.heads import answers, train
from engine.heads.files import read_info
from engine.heads.model import EagleHead, HeadConfig, draft_steps
from engine.spec.runner import ModelRunner
from tests.test_decoding import run
from tests.test_eagle import random_head
from tests.test_fastlinear import NATIVE, accelerated
from tests.tiny import tiny_model

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def test_unrolled_draft_steps_give_what_drafting_with_the_cache_gives() -> None:
    config = HeadConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=48, rope_theta=10000.0, rms_norm_eps=1e-6,
                        max_positions=64)
    torch.manual_seed(0)
    head = EagleHead(config).eval()
    n, steps = 7, 3
    f, e = torch.randn(1, n, 32), torch.randn(1, n + steps, 32)
    with torch.no_grad():
        preds = list(draft_steps(head, f, e[:, :n], steps))  # step s: [1, n - s + 1, H]
        stack = Stack(head.decoder)  # what drafting runs: the engine's forward of the layer
        for j in range(n - steps + 1):
            own = stack.new_cache()
            pred = stack(head.fc(torch.cat([f[0, : j + 1], e[0, : j + 1]], -1)), own)[-1:]
            assert torch.allclose(pred[0], preds[0][0, j], atol=1e-4)
            for step in range(2, steps + 1):
                x = head.fc(torch.cat([pred, e[0, j + step - 1 : j + step]], -1))
                pred = stack(x, own)
                assert torch.allclose(pred[0], preds[step - 1][0, j], atol=1e-4), (j, step)


def test_an_answer_record_holds_the_greedy_answer_with_its_features() -> None:
    target = tiny_model("llama", vocab_size=64, seed=1, scale=4.0)
    prompt = [3, 9, 4, 22, 17]
    record, answer_ids = answers.answer(ModelRunner(target), prompt, 20, frozenset(), top_k=4)
    assert answer_ids == run(target, prompt, n=20)
    assert record.ids.tolist() == prompt + answer_ids[:-1]
    greedy = record.top_ids[len(prompt) - 1 :, 0].tolist()
    assert greedy == answer_ids
    with torch.no_grad():
        out = target(input_ids=record.ids[None], output_hidden_states=True)
    assert torch.allclose(record.hidden.float(), out.hidden_states[-1][0].float(), atol=2e-3,
                          rtol=2e-3)
    probs = out.logits[0].float().softmax(-1).topk(4, dim=-1).values
    assert torch.allclose(record.top_probs.float(), probs, atol=2e-3)
    windows = answers.pack([record, record], seq_len=8)
    assert windows["ids"].shape == (len(record.ids) * 2 // 8, 8)
    assert windows["hidden"].shape[:2] == windows["ids"].shape
    assert windows["ids"].reshape(-1)[: len(record.ids)].tolist() == record.ids.tolist()


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_batched_answers_are_the_answers_given_one_by_one(tmp_path: Path, kind: str,
                                                          native: bool) -> None:
    target = accelerated(tmp_path, kind, native)  # our int4/int8 layers, as the targets run
    vocab = int(target.config.vocab_size)
    prompts = [[3, 9, 4, 22, 17], [5, 1], [8, 30, 2, 2, 41, 12, 7, 19], [vocab - 1]]
    alone = [answers.answer(ModelRunner(target), p, 16, frozenset(), top_k=4) for p in prompts]
    eos = frozenset({alone[2][1][5]})  # the third answer (at least) ends early
    alone = [answers.answer(ModelRunner(target), p, 16, eos, top_k=4) for p in prompts]
    assert len({len(a) for _, a in alone}) > 1  # the batch shrinks as answers end
    runners = [ModelRunner(target) for _ in prompts]
    together = answers.answer_batch(runners, prompts, 16, eos, top_k=4)
    for (one, one_ids), (many, many_ids) in zip(alone, together, strict=True):
        assert many_ids == one_ids
        assert many.ids.tolist() == one.ids.tolist()
        assert torch.equal(many.top_ids, one.top_ids)  # bit for bit: the row promise
        assert torch.equal(many.top_probs, one.top_probs)
        assert torch.equal(many.hidden, one.hidden)


def test_a_batched_step_needs_a_cache_per_sequence(tmp_path: Path) -> None:
    runner = ModelRunner(accelerated(tmp_path, "llama", native=False))
    with pytest.raises(ValueError, match="a cache of its own"):
        runner.model_forward.step_many([([1], runner.cache), ([2], runner.cache)])


def test_answers_resume_from_their_first_prompt_only(tiny_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "answers.pt"
    common = ["--target", str(tiny_folder), "--out", str(data), "--max-tokens", "6"]
    assert answers.main([*common, "--prompts", "2", "--skip", "3", "--batch", "1"]) == 0
    assert answers.main([*common, "--prompts", "3", "--skip", "3", "--batch", "2"]) == 0
    lines = data.with_name(data.name + ".jsonl").read_text().splitlines()
    asked = [json.loads(line)["messages"][0]["content"] for line in lines]
    assert asked == [text for _, text in answers.prompts()[3:6]]
    assert len(answers.load_records(data)) == 3
    with pytest.raises(SystemExit, match="--skip 3"):
        answers.main([*common, "--prompts", "4"])


def test_text_only_answers_write_chats_that_resume_and_name_their_prompts(
        tiny_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "chats"
    common = ["--target", str(tiny_folder), "--out", str(data), "--max-tokens", "5",
              "--text-only", "--skip", "2"]
    assert answers.main([*common, "--prompts", "2", "--batch", "2"]) == 0
    assert answers.main([*common, "--prompts", "3", "--batch", "1"]) == 0
    text = data.with_name(data.name + ".jsonl")
    chats = [json.loads(line) for line in text.read_text().splitlines()]
    assert [c["prompt"] for c in chats] == [2, 3, 4]
    assert [c["messages"][0]["content"] for c in chats] == [t for _, t in answers.prompts()[2:5]]
    assert all(c["messages"][1]["role"] == "assistant" for c in chats)
    assert not data.exists()  # no labels were kept
    with pytest.raises(SystemExit, match="--skip 2"):
        answers.main([*common[:-2], "--prompts", "4"])
    text.write_text(text.read_text() + "not json\n")
    with pytest.raises(SystemExit, match="line 4"):
        answers.main([*common, "--prompts", "5"])


def reference_chain(head: EagleHead, target: torch.nn.Module, data: train.Features,
                    steps: int, first: int = 0) -> float:
    """Draft each chain from row ``first`` on with the head's cache, feeding its own
    tokens: accepted per chain."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids, hidden, top = data.ids[0], data.hidden[0].float(), data.top_ids[0, :, 0]
    n = len(ids) - 1
    greedy = [int(top[t]) == int(ids[t + 1]) for t in range(n)]
    accepted = counted = 0
    with torch.no_grad():
        for j in range(n - steps):
            if j < first or not greedy[j]:
                continue
            counted += 1
            cache = DynamicCache(config=head.decoder.config)  # training's own forward
            pred = head(hidden[None, : j + 1], embed(ids[None, 1 : j + 2]).float(), cache=cache)
            pred = pred[:, -1:]
            for step in range(1, steps + 1):
                token = int(lm_head(pred[0]).argmax(-1))
                if token != int(top[j + step]) or not greedy[j + step]:
                    break
                accepted += 1
                pred = head(pred, embed(torch.tensor([[token]])).float(), cache=cache)
    return accepted / counted


def reference_acceptance(head: EagleHead, target: torch.nn.Module, data: train.Features,
                         first: int = 0) -> float:
    """Share of positions from row ``first`` on whose first draft token (teacher-forced) is
    the target's greedy."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids, hidden, top = data.ids[0], data.hidden[0].float(), data.top_ids[0, :, 0]
    with torch.no_grad():
        pred = head(hidden[None, :-1], embed(ids[None, 1:]).float())  # [1, n, H]
        guess = lm_head(pred[0]).argmax(-1)
    return float((guess == top[1:].long())[first:].float().mean())


def reference_within(head: EagleHead, target: torch.nn.Module, data: train.Features,
                     width: int, first: int = 0) -> float:
    """Share of positions from row ``first`` on whose greedy token is among the head's
    ``width`` likeliest first draft tokens, ranked one by one."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids, hidden, top = data.ids[0], data.hidden[0].float(), data.top_ids[0, :, 0]
    with torch.no_grad():
        pred = head(hidden[None, :-1], embed(ids[None, 1:]).float())  # [1, n, H]
        logits = lm_head(pred[0])  # [n, V]
    found = []
    for row in range(first, len(ids) - 1):
        ranked = sorted(range(logits.shape[-1]), key=lambda v: -float(logits[row, v]))
        found.append(int(top[row + 1]) in ranked[:width])
    return sum(found) / max(1, len(found))


def test_the_held_out_measures_count_what_chained_drafting_accepts() -> None:
    target = tiny_model("llama", vocab_size=12, seed=2, dtype=torch.float32)
    prompt = [1, 5, 2, 7, 3, 6]
    record, _ = answers.answer(ModelRunner(target), prompt, 40, frozenset(), top_k=4)
    data = train.Features(**answers.pack([record], seq_len=len(record.ids)))
    seen = []
    for seed in range(3):
        head = random_head(target, seed=seed)
        measured = train.held_out(head, target.get_input_embeddings(),
                                  target.get_output_embeddings(), data, steps=3)
        assert abs(measured.chain - reference_chain(head, target, data, 3)) < 1e-9
        assert abs(measured.acceptance - reference_acceptance(head, target, data)) < 1e-6
        for width in train.TOP_WIDTHS:
            assert abs(measured.within(width) - reference_within(head, target, data, width)) \
                < 1e-6
        assert measured.acceptance <= measured.within(2) <= measured.within(4) <= 1.0
        seen.append(measured.chain)
    assert max(seen) > 0.2  # random heads on a 12-token vocabulary do accept some drafts
    short = data.subset(slice(0, 1))
    short = train.Features(short.ids[:, :3], short.hidden[:, :3], short.top_ids[:, :3],
                           short.top_probs[:, :3])  # too short for a whole chain
    measured = train.held_out(random_head(target, seed=0), target.get_input_embeddings(),
                              target.get_output_embeddings(), short, steps=3)
    assert measured.chain == 0.0 and 0.0 <= measured.acceptance <= 1.0


def test_the_held_out_measures_count_from_the_first_row_asked_and_add_up() -> None:
    target = tiny_model("llama", vocab_size=12, seed=2, dtype=torch.float32)
    prompt = [1, 5, 2, 7, 3, 6]
    record, _ = answers.answer(ModelRunner(target), prompt, 40, frozenset(), top_k=4)
    data = train.Features(**answers.pack([record], seq_len=len(record.ids)))
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    head = random_head(target, seed=1)
    whole = train.held_out(head, embed, lm_head, data, steps=3)
    first = len(prompt) - 1
    answer_rows = train.held_out(head, embed, lm_head, data, steps=3, first=first)
    assert abs(answer_rows.chain - reference_chain(head, target, data, 3, first)) < 1e-9
    assert abs(answer_rows.acceptance
               - reference_acceptance(head, target, data, first)) < 1e-6
    n = len(record.ids) - 1
    assert answer_rows.positions == n - first and whole.positions == n
    assert answer_rows.chains == n - 3 - first  # every answer row follows the greedy text
    both = whole + answer_rows
    assert (both.hits, both.positions, both.accepted, both.chains) == (
        whole.hits + answer_rows.hits, 2 * n - first, whole.accepted + answer_rows.accepted,
        whole.chains + answer_rows.chains)
    assert both.hits_within == tuple(a + b for a, b in zip(whole.hits_within,
                                                           answer_rows.hits_within, strict=True))
    assert abs(answer_rows.within(4) - reference_within(head, target, data, 4, first)) < 1e-6
    beyond = train.held_out(head, embed, lm_head, data, steps=3, first=n + 5)
    assert beyond.positions == beyond.chains == 0 and beyond.chain == beyond.acceptance == 0.0


def test_training_on_answers_with_unrolled_steps(tiny_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "answers.pt"
    assert answers.main(["--target", str(tiny_folder), "--out", str(data), "--prompts", "6",
                         "--max-tokens", "24", "--save-every", "4"]) == 0
    assert len(answers.load_records(data)) == 6
    lines = data.with_name(data.name + ".jsonl").read_text().splitlines()
    assert len(lines) == 6
    out = tmp_path / "head.safetensors"
    args = ["--target", str(tiny_folder), "--out", str(out), "--answers", str(data),
            "--seq-len", "32", "--batch", "4", "--lr", "3e-3", "--held-out", "0.25",
            "--ce-vocab", "200", "--unroll", "3", "--steps", "20"]
    assert train.main(args) == 0
    losses = torch.load(out.with_name(out.name + ".ckpt"), weights_only=True)["losses"]
    assert sum(losses[-4:]) < sum(losses[:4])
    info = read_info(out)
    assert info.extra["unroll"] == 3 and info.extra["corpus"].startswith("target answers")
    assert 0.0 <= info.extra["held_out_chain_accepted"] <= 4.0


def test_a_broken_answers_file_gets_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "answers.pt"
    broken.write_bytes(b"not a torch file")
    with pytest.raises(SystemExit, match="not an answers file"):
        answers.load_records(broken)
    assert answers.load_records(tmp_path / "none.pt") == []


def test_too_few_answers_get_a_clear_error(tiny_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "answers.pt"
    assert answers.main(["--target", str(tiny_folder), "--out", str(data), "--prompts", "1",
                         "--max-tokens", "4"]) == 0
    with pytest.raises(SystemExit, match="too few for two windows"):
        train.main(["--target", str(tiny_folder), "--out", str(tmp_path / "h.safetensors"),
                    "--answers", str(data), "--seq-len", "256"])


def test_answer_files_spread_evenly_through_each_other(tmp_path: Path) -> None:
    def records(first: int, n: int) -> list[answers.Record]:
        return [answers.Record(torch.full((4,), first + i), torch.zeros(4, 8, dtype=torch.float16),
                               torch.zeros(4, 2, dtype=torch.int32),
                               torch.zeros(4, 2, dtype=torch.float16)) for i in range(n)]

    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    answers.save_records(a, records(0, 6))
    answers.save_records(b, records(100, 3), first=50)
    data = train.answer_features([a, b], seq_len=4)
    order = data.ids[:, 0].tolist()
    assert order == [0, 100, 1, 2, 101, 3, 4, 102, 5]


def test_answer_prompts_are_no_benchmark_or_demo_prompts_and_end_with_more_chat() -> None:
    listed = answers.prompts()
    assert {kind for kind, _ in listed} == {"code", "edit", "summary", "chat"}
    more = answers._more_chat_prompts()
    assert listed[-len(more):] == more and {kind for kind, _ in more} == {"chat"}
    assert len(set(more)) == len(more) and not set(more) & set(listed[: -len(more)])
    shipped = set()
    for name in ("bench", "demo"):
        saved = json.loads((ASSETS / name / "prompts.json").read_text())
        shipped |= {p["prompt"] for p in saved["prompts"]}
    assert shipped and not shipped & {text for _, text in listed}


@pytest.mark.parametrize("native", NATIVE)
def test_an_invented_question_is_the_same_in_any_batch(tmp_path: Path, native: bool) -> None:
    target = accelerated(tmp_path, "qwen2", native)
    starts = [[3, 9, 4], [3, 9, 4, 11], [3, 9, 4, 20]]
    runners = [ModelRunner(target) for _ in starts]
    together = answers.invent_questions(runners, starts, frozenset(), [0, 1, 2], 5, 12, 8)
    alone = answers.invent_questions(runners[:1], starts[1:2], frozenset(), [1], 5, 12, 8)
    assert alone == together[1:2]
    assert all(len(q) == 12 for q in together)
    other_seed = answers.invent_questions(runners, starts, frozenset(), [0, 1, 2], 6, 12, 8)
    assert other_seed != together  # drawn, not greedy: 36 tokens from 8 each would repeat
    greedy = answers.answer_batch(runners, starts, 12, frozenset(), top_k=8)
    assert [ids for _, ids in greedy] != together


def test_a_refused_question_is_drawn_again_and_the_last_try_kept(tmp_path: Path) -> None:
    target = accelerated(tmp_path, "llama", native=False)
    runners = [ModelRunner(target) for _ in range(2)]
    seen: list[list[int]] = []

    def refuse(question: list[int]) -> bool:
        seen.append(question)
        return False

    kept = answers.invent_questions(runners, [[5, 6], [5, 6]], frozenset(), [0, 1], 0, 6, 8,
                                    keep=refuse, tries=3)
    assert len(seen) == 6  # each question drawn three times
    assert kept == seen[-2:]  # the last draws, in order
    assert seen[0] != seen[2]  # a new try draws anew
    liked = answers.invent_questions(runners, [[5, 6], [5, 6]], frozenset(), [0, 1], 0, 6, 8,
                                     keep=lambda q: q == seen[2], tries=3)
    assert liked[0] == seen[2] and liked[1] == seen[-1]  # the first accepted, the other last


def test_the_user_turn_prefix_begins_the_templated_chat(tiny_folder: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_folder)
    prefix = answers.user_turn_prefix(tok)
    chat = tok.apply_chat_template([{"role": "user", "content": "hello there"}], tokenize=False)
    assert tok.decode(prefix) + "hello there" == chat[: chat.index("hello there") + 11]
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    with pytest.raises(ValueError, match="does not show the user's message"):
        answers.user_turn_prefix(tok)


def test_mostly_latin_keeps_english_and_refuses_other_scripts() -> None:
    assert answers.mostly_latin("How do I back up `files.csv`? 42")
    assert not answers.mostly_latin("如何备份文件？ How")
    assert not answers.mostly_latin("1234 ... ```")  # no letters at all


def test_a_question_that_runs_to_its_limit_is_drawn_again() -> None:
    assert answers.usable_question("How do I back up files?", 7, 160)
    assert not answers.usable_question("How do I back up files? First, open", 160, 160)
    assert not answers.usable_question("如何备份文件？", 5, 160)


def test_invented_questions_are_answered_resumed_and_not_mixed(tiny_folder: Path,
                                                               tmp_path: Path) -> None:
    data = tmp_path / "invented"
    common = ["--target", str(tiny_folder), "--out", str(data), "--max-tokens", "4",
              "--question-tokens", "6", "--text-only", "--invent", "--seed", "3"]
    assert answers.main([*common, "--prompts", "3", "--batch", "2"]) == 0
    assert answers.main([*common, "--prompts", "5", "--batch", "3"]) == 0
    text = data.with_name(data.name + ".jsonl")
    chats = [json.loads(line) for line in text.read_text().splitlines()]
    assert [c["prompt"] for c in chats] == [0, 1, 2, 3, 4]
    assert {c["kind"] for c in chats} == {"invented"} and {c["seed"] for c in chats} == {3}
    assert [c["messages"][1]["role"] for c in chats] == ["assistant"] * 5
    starts = [c["messages"][0]["content"] for c in chats]
    assert all(s.startswith(o) for s, o in zip(starts, answers.OPENERS, strict=False))
    again = tmp_path / "again"  # the same questions in one run with other batches
    assert answers.main([*common[:3], str(again), *common[4:], "--prompts", "5",
                         "--batch", "5"]) == 0
    redo = [json.loads(line) for line in again.with_name("again.jsonl").read_text().splitlines()]
    assert [c["messages"][0] for c in redo] == [c["messages"][0] for c in chats]
    with pytest.raises(SystemExit, match="--seed 3"):
        answers.main([*common[:-1], "4", "--prompts", "6"])
    with pytest.raises(SystemExit, match="add --invent"):
        answers.main([*[a for a in common if a != "--invent"][:-2], "--prompts", "6"])
    with pytest.raises(SystemExit, match="without labels"):
        answers.main([a for a in common if a != "--text-only"])
    assert len(text.read_text().splitlines()) == 5  # nothing lost or added by the refusals


def test_invented_questions_answered_with_labels_resume_after_a_stop(tiny_folder: Path,
                                                                    tmp_path: Path) -> None:
    data = tmp_path / "labelled"
    common = ["--target", str(tiny_folder), "--out", str(data), "--max-tokens", "4",
              "--question-tokens", "6", "--invent", "--seed", "3", "--save-every", "2"]
    assert answers.main([*common, "--prompts", "4", "--batch", "3"]) == 0
    text = data.with_name(data.name + ".jsonl")
    chats = [json.loads(line) for line in text.read_text().splitlines()]
    records = answers.load_records(data)
    assert [c["prompt"] for c in chats] == [0, 1, 2, 3] and len(records) == 4
    plain = tmp_path / "plain"  # the same questions as --text-only writes them
    assert answers.main([*common[:3], str(plain), *common[4:], "--prompts", "4",
                         "--text-only"]) == 0
    lines = plain.with_name("plain.jsonl").read_text().splitlines()
    assert [json.loads(line)["messages"] for line in lines] == [c["messages"] for c in chats]
    tok = AutoTokenizer.from_pretrained(tiny_folder)
    for chat, record in zip(chats, records, strict=True):
        prompt = answers.prompt_ids(tok, chat["messages"][:1])
        assert record.ids[: len(prompt)].tolist() == prompt  # the question, then its answer
        assert len(record.hidden) == len(record.ids) == len(record.top_ids)
    # a stop between writing the text and saving the records leaves a line too many
    text.write_text(text.read_text() + json.dumps(chats[3] | {"prompt": 4}) + "\n")
    assert answers.main([*common, "--prompts", "6", "--batch", "2"]) == 0
    again = [json.loads(line) for line in text.read_text().splitlines()]
    assert [c["prompt"] for c in again] == [0, 1, 2, 3, 4, 5]
    assert again[:4] == chats and len(answers.load_records(data)) == 6
    text.write_text("\n".join(text.read_text().splitlines()[:3]) + "\n")
    with pytest.raises(SystemExit, match="3 conversations for 6 answers"):
        answers.main([*common, "--prompts", "7"])


@pytest.mark.parametrize("native", NATIVE)
def test_continuous_batching_refills_slots_and_keeps_each_generation(
        tmp_path: Path, native: bool) -> None:
    target = accelerated(tmp_path, "qwen2", native)
    vocab = int(target.config.vocab_size)
    prompts = [[3, 9, 4], [5, 1], [8, 30, 2, 2, 41], [vocab - 1], [7, 7], [12, 40, 3]]
    limits = [3, 9, 1, 6, 2, 5]  # slots free at different steps
    alone = [answers.answer(ModelRunner(target), p, n, frozenset(), top_k=4)
             for p, n in zip(prompts, limits, strict=True)]
    steps: list[int] = []
    forward = ModelRunner(target).model_forward
    step_many = type(forward).step_many

    def counted(self: object, seqs: list, *args: object, **kwargs: object) -> object:
        steps.append(len(seqs))
        return step_many(self, seqs, *args, **kwargs)

    def task(n: int):  # three generations, each continuing the one before
        record, ids = yield answers.Ask(prompts[n], limits[n])
        again, more = yield answers.Ask(prompts[n] + ids, 2)
        _, last = yield answers.Ask(prompts[n] + ids + more, 2, labels=False)
        return record, ids, again, more, last

    reads: list[int] = []
    runner_forward = ModelRunner.forward

    def read(self: ModelRunner, new_ids: list[int], *args: object, **kwargs: object) -> object:
        reads.append(len(new_ids))
        return runner_forward(self, new_ids, *args, **kwargs)

    runners = [ModelRunner(target) for _ in range(3)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(forward), "step_many", counted)
        patch.setattr(ModelRunner, "forward", read)
        done = dict(answers.run_tasks(runners, ((n, task(n)) for n in range(6)),
                                      frozenset(), top_k=4))
    assert sorted(done) == list(range(6))
    same = torch.equal if native else lambda a, b: torch.allclose(a.float(), b.float(), atol=2e-3)
    for n, (one, one_ids) in enumerate(alone):
        record, ids, again, more, last = done[n]
        assert ids == one_ids and torch.equal(record.top_probs, one.top_probs)
        assert torch.equal(record.hidden, one.hidden)
        fresh, follow = answers.answer(ModelRunner(target), prompts[n] + ids, 2, frozenset(), 4)
        assert more == follow and again.ids.tolist() == fresh.ids.tolist()
        assert same(again.hidden, fresh.hidden) and same(again.top_probs, fresh.top_probs)
        _, then = answers.answer(ModelRunner(target), prompts[n] + ids + more, 2, frozenset(), 4)
        assert last == then
    # an ask of L tokens steps L - 1 rows (its first token comes from reading its prompt)
    assert max(steps) == 3 and sum(steps) == sum(limits) - 6 + 2 * 6 * (2 - 1)
    assert steps[:-4].count(3) >= len(steps[:-4]) - 1  # full until the tasks run out
    # the first ask reads its whole prompt; the later ones what their slot's cache lacks
    assert sorted(reads) == sorted([len(p) for p in prompts] + [1] * 12)
    def empty():
        yield answers.Ask([], 2)

    with pytest.raises(ValueError, match="a prompt of at least one token"):
        list(answers.run_tasks(runners, [(0, task(0)), (1, empty())], frozenset(), top_k=4))


def test_answers_to_the_end_of_the_list_are_all_written(tiny_folder: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    short = answers.prompts()[:5]
    monkeypatch.setattr(answers, "prompts", lambda: short)
    data = tmp_path / "chats"
    assert answers.main(["--target", str(tiny_folder), "--out", str(data), "--text-only",
                         "--max-tokens", "3", "--batch", "2", "--save-every", "8",
                         "--skip", "1"]) == 0  # asks for 10,000: the list ends first
    chats = [json.loads(line) for line in data.with_name("chats.jsonl").read_text().splitlines()]
    assert [c["prompt"] for c in chats] == [1, 2, 3, 4]
