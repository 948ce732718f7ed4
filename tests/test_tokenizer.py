import random

import pytest

from glmrt.model.tokenizer import IncrementalDecoder, Tokenizer

GLM47_SPECIAL_IDS = {
    "<|endoftext|>": 151329, "[MASK]": 151330, "[gMASK]": 151331, "[sMASK]": 151332, "<sop>": 151333,
    "<eop>": 151334, "<|system|>": 151335, "<|user|>": 151336, "<|assistant|>": 151337,
    "<|observation|>": 151338, "<think>": 151350, "</think>": 151351,
}
GLM47_FIRST_SPECIAL_ID = 151329
TEST_VOCAB_SIZE = 2048
TEST_FIRST_SPECIAL_ID = TEST_VOCAB_SIZE - 23
RARE_CHARACTERS = "龘齉鱻灪麤𠀋𝔘𝕏🦩🪐🫠ꙮ䨻"
TEXT_ALPHABET = "abc xyz,.!\n" + "éüßñ" + "привет" + "γειά" + "你好世界模型" + "こんにちは" + "한국어" + "😀🚀🎉" + RARE_CHARACTERS


@pytest.fixture(scope="module")
def model_dir(test_model_dir):
    return test_model_dir("bf16")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer(model_dir)


def ids_of(tokenizer, names):
    return [tokenizer.token_to_id(name) for name in names]


def random_text(rng, length):
    return "".join(rng.choice(TEXT_ALPHABET) for _ in range(length))


def single_byte_token_ids(tokenizer):
    return [token for token in range(TEST_FIRST_SPECIAL_ID) if tokenizer.decode([token]) == "\ufffd"]


def stream(tokenizer, ids):
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(token) for token in ids]
    pieces.append(decoder.flush())
    return pieces


def test_auto_tokenizer_loads_the_test_model_offline(model_dir, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf_tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    assert len(hf_tokenizer) == TEST_VOCAB_SIZE
    assert hf_tokenizer.eos_token == "<|endoftext|>"
    assert hf_tokenizer.chat_template is not None


def test_special_tokens_are_the_last_ids_at_glm47_relative_offsets(tokenizer):
    assert tokenizer.vocab_size == TEST_VOCAB_SIZE
    for name, glm_id in GLM47_SPECIAL_IDS.items():
        assert tokenizer.token_to_id(name) == TEST_FIRST_SPECIAL_ID + glm_id - GLM47_FIRST_SPECIAL_ID
    assert tokenizer.token_to_id("</think>") == TEST_VOCAB_SIZE - 1
    gap_names = [tokenizer.decode([token]) for token in range(TEST_FIRST_SPECIAL_ID + 10, TEST_FIRST_SPECIAL_ID + 21)]
    assert all(name.startswith("<|") and name.endswith("|>") for name in gap_names)
    assert len(set(gap_names)) == 11


def test_eos_ids_are_endoftext_user_and_observation(tokenizer):
    assert tokenizer.eos_token_ids == ids_of(tokenizer, ["<|endoftext|>", "<|user|>", "<|observation|>"])
    assert tokenizer.eos_token_ids == [2025, 2032, 2034]


def test_encode_adds_no_special_tokens_and_round_trips(tokenizer):
    text = "Hello world, 你好 😀 def f(x): return x"
    ids = tokenizer.encode(text)
    assert all(token < TEST_FIRST_SPECIAL_ID for token in ids)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode("") == []


def test_special_token_text_in_plain_text_maps_to_its_id(tokenizer):
    assert tokenizer.encode("<|user|>") == ids_of(tokenizer, ["<|user|>"])


def test_chat_template_renders_system_and_user_turns_with_thinking_on(tokenizer):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 你好"}]
    expected_text = "[gMASK]<sop><|system|>You are terse.<|user|>Hi 你好<|assistant|><think>"
    assert tokenizer.render_chat(messages) == expected_text
    expected_ids = (ids_of(tokenizer, ["[gMASK]", "<sop>", "<|system|>"]) + tokenizer.encode("You are terse.")
                    + ids_of(tokenizer, ["<|user|>"]) + tokenizer.encode("Hi 你好")
                    + ids_of(tokenizer, ["<|assistant|>", "<think>"]))
    assert tokenizer.apply_chat_template(messages) == expected_ids
    assert tokenizer.apply_chat_template(messages, enable_thinking=True) == expected_ids


def test_chat_template_with_thinking_off_ends_with_closing_think(tokenizer):
    messages = [{"role": "user", "content": "Hello"}]
    assert tokenizer.render_chat(messages, enable_thinking=False) == "[gMASK]<sop><|user|>Hello<|assistant|></think>"
    ids = tokenizer.apply_chat_template(messages, enable_thinking=False)
    assert ids[-2:] == ids_of(tokenizer, ["<|assistant|>", "</think>"])


def test_chat_template_without_generation_prompt_ends_after_the_last_turn(tokenizer):
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"},
                {"role": "tool", "content": "42"}]
    rendered = tokenizer.render_chat(messages, add_generation_prompt=False)
    assert rendered == ("[gMASK]<sop><|user|>Hello<|assistant|></think>Hi<|observation|>"
                        "<tool_response>42</tool_response>")


def test_chat_template_joins_text_parts_of_structured_content(tokenizer):
    messages = [{"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]}]
    assert tokenizer.render_chat(messages) == "[gMASK]<sop><|user|>one two<|assistant|><think>"


def test_chat_template_rejects_unknown_roles(tokenizer):
    with pytest.raises(Exception, match="unsupported chat role"):
        tokenizer.render_chat([{"role": "narrator", "content": "x"}])


def test_skip_special_tokens_keeps_think_markers(tokenizer):
    ids = ids_of(tokenizer, ["[gMASK]", "<think>"]) + tokenizer.encode("plan") + ids_of(tokenizer, ["</think>"])
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>plan</think>"
    assert tokenizer.decode(ids) == "[gMASK]<think>plan</think>"


def test_rare_characters_are_split_across_several_byte_tokens(tokenizer):
    split = [char for char in RARE_CHARACTERS if len(tokenizer.encode(char)) > 1]
    assert len(split) >= 8
    for char in split:
        assert tokenizer.decode(tokenizer.encode(char)) == char


def test_incremental_decoder_holds_an_incomplete_character_until_it_completes(tokenizer):
    ids = tokenizer.encode("a龘b")
    assert len(ids) >= 4
    pieces = stream(tokenizer, ids)
    assert pieces[0] == "a"
    assert all(piece == "" for piece in pieces[1:len(ids) - 2])
    assert pieces[len(ids) - 2] == "龘"
    assert pieces[len(ids) - 1] == "b"
    assert pieces[-1] == ""


def test_incremental_decoder_never_emits_partial_characters(tokenizer):
    rng = random.Random(11)
    for _ in range(60):
        text = random_text(rng, rng.randint(1, 40))
        pieces = stream(tokenizer, tokenizer.encode(text))
        assert "".join(pieces) == text
        assert all("\ufffd" not in piece for piece in pieces)


def test_incremental_decoder_matches_full_decode_on_random_token_streams(tokenizer):
    rng = random.Random(5)
    byte_ids = single_byte_token_ids(tokenizer)
    assert len(byte_ids) >= 64
    for trial in range(200):
        pool_roll = trial % 3
        ids = []
        for _ in range(rng.randint(1, 48)):
            if pool_roll == 0 or rng.random() < 0.3:
                ids.append(rng.randrange(TEST_VOCAB_SIZE))
            else:
                ids.append(rng.choice(byte_ids))
        assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids)


def test_incremental_decoder_flush_releases_a_trailing_incomplete_character(tokenizer):
    ids = tokenizer.encode("ok龘")[:-1]
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.push_many(ids) == "ok"
    assert decoder.flush() == tokenizer.decode(ids)[2:]
    assert decoder.flush() == ""


def test_incremental_decoder_skipping_special_tokens_matches_full_decode(tokenizer):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "x 你好"}]) + tokenizer.encode("y 龘")
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
    text = decoder.push_many(ids) + decoder.flush()
    assert text == tokenizer.decode(ids, skip_special_tokens=True)


class CountingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.num_decoded_ids = 0

    def decode(self, ids, skip_special_tokens=False):
        self.num_decoded_ids += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_incremental_decoder_work_grows_linearly_with_tokens(tokenizer):
    rng = random.Random(3)
    ids = tokenizer.encode(random_text(rng, 3000))
    counting = CountingTokenizer(tokenizer)
    decoder = IncrementalDecoder(counting)
    text = decoder.push_many(ids) + decoder.flush()
    assert text == tokenizer.decode(ids)
    assert len(ids) > 1000
    assert counting.num_decoded_ids <= 12 * len(ids)


class WindowOnlyTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids, skip_special_tokens=False):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("skip_special_tokens", (False, True))
def test_native_decode_stream_gives_the_window_decoder_pieces(tokenizer, skip_special_tokens):
    rng = random.Random(11)
    byte_ids = single_byte_token_ids(tokenizer)
    special = list(range(TEST_FIRST_SPECIAL_ID, TEST_VOCAB_SIZE))
    for _ in range(400):
        ids = tokenizer.encode(random_text(rng, rng.randint(1, 40)))
        for _ in range(rng.randint(0, 4)):
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(byte_ids + special))
        native = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
        window = IncrementalDecoder(WindowOnlyTokenizer(tokenizer), skip_special_tokens=skip_special_tokens)
        assert native.stream is not None and window.stream is None
        native_pieces = [native.push(token) for token in ids] + [native.flush()]
        window_pieces = [window.push(token) for token in ids] + [window.flush()]
        assert native_pieces == window_pieces
