"""prefdata — preference pairs (DPO) for tools/prepare_data.py.

A line {"prompt", "chosen", "rejected"} is a preference pair, in either of TRL's
two formats:

  strings         the three fields are strings: BOS (when the tokenizer adds
                  it) + prompt untrained, then the completion and EOS trained,
                  the prompt and each completion encoded apart (as a
                  prepare_data completion sample)
  conversational  the three fields are message lists: the prompt is the chat
                  template's rendering of "prompt" with the generation prompt;
                  a completion is the rendering of prompt + chosen (or
                  rejected) minus that prefix (the assistant content and the
                  end-of-turn text the template writes), all trained; no BOS or
                  EOS beyond what the template writes

Both completions of a pair follow the same prompt tokens. A file holds pairs
only: a pair among SFT samples, or an SFT sample among pairs, is a bad line.

Truncation (--max-seq-length L, --max-prompt-length P, default L // 2; TRL's
DPO rule with its default truncation_mode "keep_end"): when prompt + the longer
completion exceed L, a prompt longer than P keeps its last P tokens (its first
token too when that is BOS: then BOS and the last P - 1); when the pair is
still too long, both completions keep their first L - P tokens (the EOS of a
cut completion is lost, as in TRL). Without --max-seq-length nothing is cut.

The preference file is a prepare_data sample file with two samples per pair,
chosen (sample 2i) then rejected (2i + 1), which the trainer runs in the same
micro-batch, plus
  /prompt_lengths  int64 [n_pairs]  tokens at the start of both samples that
                                    are the shared prompt
  attributes: format "shardlm-preferences", n_pairs, max_seq_length and
  max_prompt_length (0 when not cut), n_truncated_pairs, pair_formats (JSON
  object: strings / conversational -> pairs).
"""
import json

import numpy as np

FORMAT = "preference"
FILE_FORMAT = "shardlm-preferences"
KEYS = ("prompt", "chosen", "rejected")


def is_pair(obj):
    """A line meant as a pair: "chosen" or "rejected" (a pair missing the other is then named as one)."""
    return isinstance(obj, dict) and ("chosen" in obj or "rejected" in obj)


class Pair(list):
    """The pieces of a pair's chosen sample then its rejected one (prepare_data's (content, trained) pieces, so
    that the conversion encodes their texts with the others); n_chosen pieces belong to the chosen sample."""

    def __init__(self, chosen, rejected, kind):
        super().__init__(chosen + rejected)
        self.n_chosen = len(chosen)
        self.kind = kind


class PairBuilder:
    """Plans and assembles preference pairs with prepare_data's SampleBuilder (module PD: its BadLine, checks and
    rendering), applies the truncation rule, and collects the prompt lengths and counts for the file."""

    def __init__(self, pd, builder, max_seq_length, max_prompt_length):
        self.pd = pd
        self.builder = builder
        self.max_seq_length = max_seq_length or 0
        self.max_prompt_length = (max_prompt_length or self.max_seq_length // 2) if max_seq_length else 0
        self.prompt_lengths = []
        self.truncated = 0
        self.kinds = {"strings": 0, "conversational": 0}

    def plan(self, obj):
        pd = self.pd
        for key in KEYS:
            if key not in obj:
                raise pd.BadLine(f"a preference pair has no \"{key}\" field; give \"prompt\", \"chosen\" and "
                                 "\"rejected\" (TRL's implicit-prompt format is not read: split off the prompt)")
        values = [obj[key] for key in KEYS]
        if all(isinstance(v, str) for v in values):
            self.builder.need_tokenizer("preference")
            if obj["chosen"] == obj["rejected"]:
                raise pd.BadLine("\"chosen\" and \"rejected\" are the same; a pair needs two different completions")
            for key in ("chosen", "rejected"):
                pd.string_field(obj, key, allow_empty=False)
            if not obj["prompt"] and not self.builder.bos():
                raise pd.BadLine("\"prompt\" is empty and the tokenizer adds no BOS token, so a completion's first "
                                 "token has nothing before it to be predicted from; give the prompt text")
            return Pair(self.builder.prompt_completion(obj["prompt"], obj["chosen"]),
                        self.builder.prompt_completion(obj["prompt"], obj["rejected"]), "strings")
        if all(isinstance(v, list) for v in values):
            return self.conversational(obj)
        kinds = ", ".join(f"\"{k}\" is {pd.json_type(v)}" for k, v in zip(KEYS, values))
        raise pd.BadLine(f"{kinds}; give all three as strings or all three as message lists")

    def conversational(self, obj):
        pd = self.pd
        tok = self.builder.need_tokenizer("preference")
        prompt = obj["prompt"]
        if not prompt:  # the line's fault, whatever the tokenizer
            raise pd.BadLine("\"prompt\" is an empty list; give the conversation before the completions")
        if tok.template is None:
            raise pd.NoChatTemplate(tok.no_template + "; give one with --chat-template FILE")
        if any(isinstance(m, dict) and m.get("role") == "assistant" for m in prompt[-1:]):
            raise pd.BadLine("\"prompt\" ends with an assistant turn; end it with the turn the completions answer")
        before = pd.render(tok, prompt, True)
        pieces = []
        for key in ("chosen", "rejected"):
            messages = obj[key]
            try:
                pd.check_messages(prompt + messages)
            except pd.BadLine as e:
                raise pd.BadLine(f"prompt + {key}: {e}")
            if not messages or any(m["role"] != "assistant" for m in messages):
                raise pd.BadLine(f"\"{key}\" is not a list of assistant messages; give the completion as "
                                 "[{\"role\": \"assistant\", \"content\": ...}]")
            full = pd.render(tok, prompt + messages, False)
            if not full.startswith(before) or len(full) == len(before):
                raise pd.BadLine(f"the chat template does not render prompt + {key} as the prompt's rendering "
                                 "followed by the completion; use a template that renders each turn "
                                 "independently of the later ones")
            pieces.append([(before, 0), (full[len(before):], 1)])
        if pieces[0][1][0] == pieces[1][1][0]:
            raise pd.BadLine("\"chosen\" and \"rejected\" render the same; a pair needs two different completions")
        return Pair(pieces[0], pieces[1], "conversational")

    def assemble(self, pair, encodings):
        """The pair's two (int32 ids, uint8 trained), truncated; records its prompt length."""
        samples = [self.builder.assemble(pair[:pair.n_chosen], encodings),
                   self.builder.assemble(pair[pair.n_chosen:], encodings)]
        # Every completion token is trained and no prompt token is: the prompt ends at the first trained token.
        prompts = [int(np.argmax(trained)) for _, trained in samples]
        if prompts[0] != prompts[1] or not np.array_equal(samples[0][0][:prompts[0]], samples[1][0][:prompts[1]]):
            raise self.pd.BadLine("the chosen and rejected samples do not start with the same prompt tokens; "
                                  "use a chat template that renders each turn independently of the later ones")
        samples, prompt = self.truncate(samples, prompts[0])
        self.prompt_lengths.append(prompt)
        self.kinds[pair.kind] += 1
        return samples

    def truncate(self, samples, prompt):
        limit, keep = self.max_seq_length, self.max_prompt_length
        if not limit or max(len(ids) for ids, _ in samples) <= limit:
            return samples, prompt
        self.truncated += 1
        ids = samples[0][0]
        if prompt > keep:
            bos = self.builder.tokenizer is not None and self.builder.tokenizer.bos is not None \
                and ids[0] == self.builder.tokenizer.bos
            kept = np.r_[0:1, prompt - keep + 1:prompt] if bos else np.arange(prompt - keep, prompt)
            samples = [(np.concatenate([i[kept], i[prompt:]]), np.concatenate([t[kept], t[prompt:]]))
                       for i, t in samples]
            prompt = keep
        if max(len(ids) for ids, _ in samples) > limit:
            end = prompt + limit - keep
            samples = [(i[:end], t[:end]) for i, t in samples]
        return samples, prompt

    def write(self, writer):
        """The prompt lengths dataset into the writer's file; the attributes that make it a preference file."""
        writer.file.create_dataset("prompt_lengths", data=np.asarray(self.prompt_lengths, dtype="<i8"))
        return {"format": FILE_FORMAT, "n_pairs": len(self.prompt_lengths), "max_seq_length": self.max_seq_length,
                "max_prompt_length": self.max_prompt_length, "n_truncated_pairs": self.truncated,
                "pair_formats": json.dumps(self.kinds), "formats": json.dumps({FORMAT: len(self.prompt_lengths)})}
