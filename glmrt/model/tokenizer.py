import json
import secrets
from pathlib import Path

REPLACEMENT_CHARACTER = "\ufffd"
CLIENT_TEXT_OPEN = "\ue000"
CLIENT_TEXT_CLOSE = "\ue001"


def read_json_if_present(path):
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as handle:
        value = json.load(handle)
    return value if isinstance(value, dict) else {}


def id_list(value):
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [item for item in items if isinstance(item, int) and not isinstance(item, bool)]


class Tokenizer:
    def __init__(self, model_dir):
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise FileNotFoundError(f"tokenizer directory {self.model_dir} does not exist")
        self.hf_tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
        self.backend = getattr(self.hf_tokenizer, "_tokenizer", None)
        self.plain_backend = plain_text_backend(self.backend)
        self.eos_token_ids = self.read_eos_token_ids()

    def read_eos_token_ids(self):
        config = read_json_if_present(self.model_dir / "config.json")
        generation = read_json_if_present(self.model_dir / "generation_config.json")
        merged = []
        for token in (id_list(config.get("eos_token_id")) + id_list(generation.get("eos_token_id"))
                      + id_list(self.hf_tokenizer.eos_token_id)):
            if token not in merged:
                merged.append(token)
        return merged

    @property
    def vocab_size(self):
        return len(self.hf_tokenizer)

    def token_to_id(self, token):
        token_id = self.hf_tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.hf_tokenizer.unk_token_id:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    def encode(self, text):
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

    def render_chat(self, messages, add_generation_prompt=True, enable_thinking=None, tools=None):
        if getattr(self.hf_tokenizer, "chat_template", None) is None:
            raise ValueError(f"{self.model_dir} has no chat template")
        template_options = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
        return self.hf_tokenizer.apply_chat_template(list(messages), tools=tools or None, tokenize=False,
                                                     add_generation_prompt=add_generation_prompt,
                                                     **template_options)

    def encode_plain(self, text):
        if self.plain_backend is None:
            raise ValueError(f"{self.model_dir} has no fast tokenizer to encode client text without control tokens")
        return self.plain_backend.encode(text, add_special_tokens=False).ids

    def apply_chat_template(self, messages, add_generation_prompt=True, enable_thinking=None, tools=None):
        nonce = secrets.token_hex(8)
        marked = [mark_message(message, nonce) for message in messages]
        rendered = self.render_chat(marked, add_generation_prompt, enable_thinking, tools)
        ids = []
        for is_client_text, piece in split_marked(rendered, nonce):
            if piece:
                ids.extend(self.encode_plain(piece) if is_client_text else self.encode(piece))
        return ids

    def decode(self, ids, skip_special_tokens=False):
        ids = [int(token) for token in ids]
        if self.backend is not None:
            return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        clean_up_tokenization_spaces=False)


def plain_text_backend(backend):
    if backend is None:
        return None
    from tokenizers import Tokenizer as BackendTokenizer

    description = json.loads(backend.to_str())
    description["added_tokens"] = []
    return BackendTokenizer.from_str(json.dumps(description))


def marker_open(nonce):
    return CLIENT_TEXT_OPEN + nonce + CLIENT_TEXT_CLOSE


def marker_close(nonce):
    return CLIENT_TEXT_CLOSE + nonce + CLIENT_TEXT_OPEN


def mark_text(text, nonce):
    if not isinstance(text, str) or not text:
        return text
    return marker_open(nonce) + text + marker_close(nonce)


def mark_content(content, nonce):
    if isinstance(content, list):
        return [dict(part, text=mark_text(part.get("text"), nonce)) if isinstance(part, dict) else part
                for part in content]
    return mark_text(content, nonce)


def mark_tool_call(call, nonce):
    function = call.get("function", call)
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        arguments = {mark_text(key, nonce): mark_text(value, nonce) for key, value in arguments.items()}
    marked = dict(function, arguments=arguments)
    return dict(call, function=marked) if "function" in call else marked


def mark_message(message, nonce):
    marked = dict(message, content=mark_content(message.get("content"), nonce))
    if "reasoning_content" in message:
        marked["reasoning_content"] = mark_text(message["reasoning_content"], nonce)
    if "tool_calls" in message:
        marked["tool_calls"] = [mark_tool_call(call, nonce) for call in message["tool_calls"]]
    return marked


def split_marked(rendered, nonce):
    opening = marker_open(nonce)
    closing = marker_close(nonce)
    pieces = []
    position = 0
    while True:
        start = rendered.find(opening, position)
        if start < 0:
            pieces.append((False, rendered[position:]))
            return pieces
        end = rendered.find(closing, start + len(opening))
        if end < 0:
            raise ValueError("the chat template cut a client text apart")
        pieces.append((False, rendered[position:start]))
        pieces.append((True, rendered[start + len(opening):end]))
        position = end + len(closing)


def native_decode_stream(backend, skip_special_tokens):
    if backend is None:
        return None
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    return DecodeStream(skip_special_tokens=skip_special_tokens)


class IncrementalDecoder:
    def __init__(self, tokenizer, skip_special_tokens=False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.backend = getattr(tokenizer, "backend", None)
        self.stream = native_decode_stream(self.backend, skip_special_tokens)

    def decode_window(self, start, end):
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def advance(self):
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)

    def push(self, token_id):
        token = int(token_id)
        self.token_ids.append(token)
        if self.stream is not None:
            try:
                text = self.stream.step(self.backend, token)
            except Exception:
                self.stream = None
                return self.push_window()
            if text is None:
                return ""
            self.advance()
            return text
        return self.push_window()

    def push_window(self):
        prefix_text = self.decode_window(self.prefix_offset, self.read_offset)
        window_text = self.decode_window(self.prefix_offset, len(self.token_ids))
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT_CHARACTER):
            return ""
        self.advance()
        return window_text[len(prefix_text):]

    def push_many(self, token_ids):
        return "".join(self.push(token_id) for token_id in token_ids)

    def flush(self):
        prefix_text = self.decode_window(self.prefix_offset, self.read_offset)
        window_text = self.decode_window(self.prefix_offset, len(self.token_ids))
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self.stream = native_decode_stream(self.backend, self.skip_special_tokens) if self.stream is not None else None
        return window_text[len(prefix_text):]
