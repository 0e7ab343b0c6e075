"""The terminal chat: streaming, commands and errors, driven through text streams."""

import io

from engine.spec.session import ChatEngine
from engine.tools.chat import parse_args, repl
from tests.tiny import tiny_loaded


def test_terminal_chat_streams_answers_and_handles_commands() -> None:
    engine = ChatEngine(tiny_loaded(seed=1, scale=4.0))
    inp = io.StringIO("hello there\n/method suffix\n/k 3\n/method medusa\n/help\n"
                      "/k adaptive\nand again\n/reset\n/quit\nnever read\n")
    out = io.StringIO()
    repl(engine, parse_args(["--max-tokens", "8"]), inp, out)
    text = out.getvalue()
    assert text.count("anve> ") == 2
    assert "8 tokens" in text and "speculation off" not in text
    assert "(method suffix, k=3)" in text
    assert "unknown method 'medusa'" in text
    assert "commands: /method {auto,off,ngram,suffix}" in text
    assert engine.method == "suffix" and engine.num_draft_tokens == "adaptive"
    assert "never read" not in text


def test_terminal_chat_shows_how_much_of_a_long_prompt_it_has_read() -> None:
    engine = ChatEngine(tiny_loaded(seed=1, scale=4.0))
    question = ("the quick brown fox jumps " * 30).strip()  # about 170 tokens: two chunks
    out = io.StringIO()
    repl(engine, parse_args(["--max-tokens", "4"]), io.StringIO(question + "\n/quit\n"), out)
    total = len(engine.encode([{"role": "user", "content": question}])) - 1
    text = out.getvalue()
    assert f"\r(reading the prompt: 0/{total} tokens)" in text
    assert f"\r(reading the prompt: {total}/{total} tokens)\n" in text
    assert "4 tokens" in text
