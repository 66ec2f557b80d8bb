"""Tokenizers in the structure of released families' tokenizer.json files, built with `tokenizers`' own API and
trained on the caller's texts (nothing is downloaded), and their chat templates; shared by tests/t_tokenizer.py
(ids against tokenizers 0.23) and tests/t_qwen.py (chat templates through prepare_data and generate against
transformers 5.25's apply_chat_template).

  qwen2_tokenizer  Qwen2/Qwen2.5's file: a byte-level BPE whose model has continuing_subword_prefix and
                   end_of_word_suffix "" (not null), normalizer NFC, pre_tokenizer Sequence[Split(Qwen2's
                   regex, Isolated), ByteLevel(add_prefix_space false, trim_offsets false, use_regex false)],
                   post_processor and decoder ByteLevel with the same flags, added tokens after the vocabulary:
                   <|endoftext|>, <|im_start|>, <|im_end|> (special) and <tool_call>, </tool_call> (not special)
  phi3_tokenizer   Phi-3/3.5-mini's file (Llama 2's SentencePiece-converted layout): <unk> <s> </s>, the 256
                   byte tokens <0x00>..<0xFF>, then the pieces (trained behind Metaspace so that they carry ▁);
                   BPE with unk_token <unk>, byte_fallback and fuse_unk; normalizer Sequence[Prepend ▁,
                   Replace " " -> ▁], no pre-tokenizer; post_processor TemplateProcessing <s> $A; decoder
                   Sequence[Replace ▁ -> " ", ByteFallback, Fuse, Strip(" ", 1, 0)]; added tokens after the
                   vocabulary as Phi-3's 32000..32010: <|endoftext|> (special), then <|assistant|>,
                   <|placeholder1|>, <|system|>, <|end|>, <|user|> (special, rstrip true: the newline after
                   them is part of the token)
"""
import json

# Qwen2's pre-tokenization regex (its tokenizer.json's Split pattern): Llama 3's with digits one at a time.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PLAIN = ["<tool_call>", "</tool_call>"]
PHI3_SPECIAL = ["<|endoftext|>"]
PHI3_RSTRIP = ["<|assistant|>", "<|placeholder1|>", "<|system|>", "<|end|>", "<|user|>"]

# Qwen2.5-Instruct's chat template as its tokenizer_config.json has it (ChatML, a default system turn, tool calls
# with their arguments through tojson, tool responses as user turns), written out here: nothing is downloaded.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Phi-3-mini-4k-instruct's chat template (its eos_token after the last turn unless a generation prompt follows).
# A template with Qwen3's rule for reasoning (written here, shorter than Qwen3's own): ChatML; an assistant turn
# after the last user message is rendered with its <think> block (reasoning_content, or the <think>...</think> that
# starts its content; empty when none), an earlier one with its content alone, so that a conversation's middle turns
# render otherwise than the same turn ending a shorter conversation.
QWEN3_LIKE_TEMPLATE = """{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning = message.reasoning_content if message.reasoning_content is defined else '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

PHI3_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
                 "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
                 "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + "
                 "message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")


def qwen2_tokenizer(texts, vocab_size):
    """Qwen2's tokenizer.json structure (module text), vocab_size tokens in all."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.NFC()
    trained.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(QWEN2_SPECIAL) - len(QWEN2_PLAIN),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    trained.train_from_iterator(texts, trainer)
    j = json.loads(trained.to_str())["model"]
    tok = Tokenizer(models.BPE(vocab=j["vocab"], merges=[tuple(m) for m in j["merges"]], dropout=None,
                               unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN2_PLAIN])
    # decoders.ByteLevel takes no flags; Qwen2's file writes the pre-tokenizer's (decoding ignores them)
    j = json.loads(tok.to_str())
    j["decoder"].update(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return Tokenizer.from_str(json.dumps(j))


def phi3_tokenizer(texts, vocab_size):
    """Phi-3's tokenizer.json structure (module text), vocab_size tokens in all."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    n_added = len(PHI3_SPECIAL) + len(PHI3_RSTRIP)
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    pieces = vocab_size - 3 - 256 - n_added
    # half the pieces at most single characters (the others bytes, by byte_fallback), half merges
    trainer = trainers.BpeTrainer(vocab_size=pieces, limit_alphabet=min(120, pieces // 2), show_progress=False)
    trained.train_from_iterator(texts, trainer)
    j = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece, _ in sorted(j["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    assert len(vocab) + n_added <= vocab_size, f"{len(vocab)} + {n_added} tokens for {vocab_size}"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in j["merges"]], dropout=None, unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = None
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PHI3_SPECIAL])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=True) for t in PHI3_RSTRIP])
    return tok
