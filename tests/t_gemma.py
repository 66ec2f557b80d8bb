#!/usr/bin/env python3
"""t_gemma — Gemma 2 and Gemma 3 (text) against transformers 5 (issue 49).

transformers 5.25 (build/ref5-venv; this script re-executes itself there)
makes tiny models with its own save_pretrained, config.json exactly as
transformers writes it, every config key shardlm reads at a value other than
the class's default:
  gemma2  Gemma2ForCausalLM: hidden 48 with 4 heads of head_dim 16 (the
          attention 64 wide), 2 key/value heads, random (1 + w) norm weights
          (all four per block and the final one), rms_norm_eps 1e-5,
          rope_theta 20000, final_logit_softcapping 1.5 and
          attn_logit_softcapping 0.5 (both large enough to change the loss:
          checked), tied, fp32
  gemma3  Gemma3ForCausalLM: 3 layers with layer_types sliding, sliding,
          full (sliding_window_pattern 3), q_norm and k_norm with random
          weights, the global layers' rope_theta 5e5 with linear scaling 2,
          the local layers' 20000, untied, fp32
  gemma2_bf16  the gemma2 case saved in bf16 (the loss at N = 2 and 3)
Both cases have sliding_window 8, a quarter of the sequence (32; Gemma 2's
layer 0 and Gemma 3's layers 0 and 1 local), and query_pre_attn_scalar 24,
not head_dim; attention.* checks that each option changes transformers' loss.

Checks per case, as tests/t_qwen.py makes them (its functions, on this
test's models), against the transformers model in float64:
  X.N1.*      ZeRO 3 at N = 1, three AdamW steps: logits and loss (rel 1e-5),
              every gradient (rel 1e-4), the steps' losses and final weights
  X.N2, X.N3  the step-1 loss at N = 2 and 3 (ZeRO 3)
  X.generate  32 tokens of greedy generation equal transformers' generate
  X.export    the N = 2 run's export loads in transformers 5 as the same
              architecture at shardlm's loss of it
  X.lora      LoRA r 4 on every linear layer, the adapters loaded by PEFT at
              shardlm's logits
  softcap.changes_loss  transformers' loss without the cap differs (> 1 %)
  mm.*        Gemma3ForConditionalGeneration (a tiny SigLIP tower): the
              language model read from text_config and model.language_model.*,
              the vision tower skipped with a log line, logits equal to the
              text model's
  chat.*      a tokenizer in Gemma's layout (tokenizers' API) with Gemma's
              chat template: prepare_data's chat sample has the ids of
              apply_chat_template; generate --chat renders the prompt and
              stops at <end_of_turn>, one of generation_config.json's
              eos_token_id list, where transformers' generate stops; a chat
              line carrying an image is refused in one line (--skip-bad too)
  dpo.*       one DPO step (full fine-tune, beta 0.25) on the gemma2 case: the
              loss ln 2 and every gradient that of TRL's sigmoid loss
  ckpt.same_gradients  activation checkpointing every 2 blocks: the same
              loss and gradients, bit for bit
  plan.*      plan on each preset (8 ranks, ZeRO 3, bf16, 4096 tokens): the
              published parameter totals, the logits buffer a chunk of B T V
  old_spelling.logits  the gemma3 config.json in transformers 4.x's spelling
              (rope_theta, rope_local_base_freq, rope_scaling,
              sliding_window_pattern): the same logits
  eval.loss   shardlm eval of the gemma2 case over 4 windows equals transformers
  mm.export_text_model  the multimodal run's export is a Gemma3ForCausalLM that
              transformers loads at the same logits
  refuse.*    use_bidirectional_attention, layer_types without a pattern,
              hidden_activation gelu: one line, exit 2
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("gemma.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3Config, Gemma3ForCausalLM,  # noqa: E402
                          Gemma3ForConditionalGeneration, Gemma3TextConfig)

import t_qwen as q  # noqa: E402  the checks of the Llama-like families, pointed at this test's models
import subprocess  # noqa: E402

from harness import BIN, ENV, ROOT, byte_bpe_tokenizer, check, failures, note, rel, scratch_dir, write_shard  # noqa: E402

TMP = scratch_dir("t_gemma")
q.TMP = TMP
q.DATA = os.path.join(TMP, "train.bin")
write_shard(q.DATA, q.TOKENS)
q.CLASSES = {"gemma2": Gemma2ForCausalLM, "gemma3": Gemma3ForCausalLM}
V, T = q.V, q.T
SHAPE = dict(vocab_size=V, hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=128, initializer_range=0.2, rms_norm_eps=1e-5,
             query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=None, pad_token_id=None,
             eos_token_id=None)  # transformers' generate(min_new_tokens) never picks an end token; shardlm ignores it
FINAL_CAP = 1.5
ATTN_CAP = 0.5  # below the scores' range at initializer_range 0.2: the cap bends them


def random_norms(model, std=0.3):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0, std)


def make_models():
    dirs = {}
    torch.manual_seed(0)
    g2 = Gemma2ForCausalLM(Gemma2Config(**dict(SHAPE, attn_logit_softcapping=ATTN_CAP), num_hidden_layers=2,
                                        final_logit_softcapping=FINAL_CAP,
                                        rope_parameters={"rope_type": "default", "rope_theta": 20000.0}))
    random_norms(g2)
    dirs["gemma2"] = os.path.join(TMP, "gemma2")
    g2.save_pretrained(dirs["gemma2"])
    dirs["gemma2_bf16"] = os.path.join(TMP, "gemma2_bf16")
    g2.to(torch.bfloat16).save_pretrained(dirs["gemma2_bf16"])
    rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}
    g3 = Gemma3ForCausalLM(Gemma3TextConfig(**SHAPE, num_hidden_layers=3, tie_word_embeddings=False,
                                            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                            rope_parameters=rope))
    random_norms(g3)
    dirs["gemma3"] = os.path.join(TMP, "gemma3")
    g3.save_pretrained(dirs["gemma3"])
    return dirs


def check_attention_options(dirs):
    """Each attention option the cases set changes transformers' loss, so that shardlm's equal loss shows it took
    it: the scores' soft-cap (gemma2), the scale query_pre_attn_scalar^-1/2 and the local layers' window
    (gemma3; its window, 8, is a quarter of the sequence)."""
    x, y = q.windows(0, q.B)
    edits = (("gemma2", "attn_logit_softcapping", None), ("gemma3", "query_pre_attn_scalar", SHAPE["head_dim"]),
             ("gemma3", "sliding_window", 4 * T))
    for kind, key, value in edits:
        with torch.no_grad():
            _, want = q.loss_of(q.hf(kind, dirs[kind]), x, y)
            c = json.load(open(os.path.join(dirs[kind], "config.json")))
            c[key] = value
            c.pop("transformers_version", None)
            config = (Gemma2Config if kind == "gemma2" else Gemma3TextConfig)(**c)
            other = q.CLASSES[kind].from_pretrained(dirs[kind], config=config, dtype=torch.float32).eval().double()
            _, without = q.loss_of(other, x, y)
        e = abs(without.item() - want.item()) / want.item()
        check(f"attention.{key}_changes_loss", e > 1e-3, f"rel {e:.2e}")


def check_softcap(d):
    model = q.hf("gemma2", d)
    x, y = q.windows(0, q.B)
    with torch.no_grad():
        logits, capped = q.loss_of(model, x, y)
        model.config.final_logit_softcapping = None
        _, plain = q.loss_of(model, x, y)
    note(f"gemma2: |logits| up to {logits.abs().max().item():.3f} under the cap {FINAL_CAP}; loss {capped.item():.4f} "
         f"capped, {plain.item():.4f} without")
    e = abs(plain.item() - capped.item()) / capped.item()
    check("softcap.changes_loss", e > 1e-2, f"rel {e:.2e}")


def check_checkpointing(d3):
    """Activation checkpointing every 2 blocks (gemma3's 3 blocks: a segment of 2 and one of 1, recomputed in the
    backward) gives the plain run's loss and gradients bit for bit."""
    plain = q.train("ckpt.plain", d3, 1)
    ck = q.train("ckpt.interval2", d3, 1, extra={"activation_checkpointing": {"enabled": True, "interval": 2}})
    if plain is None or ck is None:
        return
    a, b = plain[0], ck[0]
    names = [k for k in a if k.startswith("grad.")]
    same = bool(names) and all(np.array_equal(a[k], b[k]) for k in names) and np.array_equal(a["loss"], b["loss"])
    check("ckpt.same_gradients", same, f"{len(names)} gradients compared")


# the language models' totals from their config.json shapes (model/arch.c), the 256k embedding tied
PRESETS = {"gemma-2-9b": (9241705984, 256000, 3584), "gemma-2-27b": (27227128320, 256000, 4608),
           "gemma-3-4b": (3880263168, 262208, 2560), "gemma-3-12b": (11766034176, 262208, 3840),
           "gemma-3-27b": (27009346304, 262208, 5376)}


def check_plan():
    """shardlm plan on each Gemma preset at 8 ranks, ZeRO 3, bf16, 4096 tokens: the parameters (less the
    vocabulary's padding to 128) are the published shapes', and the logits buffer is the LM head's chunk, far
    below the whole B T V."""
    for name, (total, vocab, C) in PRESETS.items():
        r = subprocess.run([BIN, "plan", "--preset", name, "--ranks", "8", "--set", "data.seq_len=4096", "--set",
                            "zero_optimization.stage=3", "--set", "bf16.enabled=true", "--json"], env=ENV,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            check(f"plan.{name}", False, r.stderr[-300:])
            continue
        p = json.loads(r.stdout.strip().splitlines()[-1])
        padding = ((vocab + 127) // 128 * 128 - vocab) * C
        logits = p["memory"]["logits and loss"]["bytes"]
        whole = 4096 * (vocab + 127) // 128 * 128 * 2
        check(f"plan.{name}", p["n_params"] - padding == total and logits < whole / 4,
              f"{p['n_params']} parameters (want {total} + {padding}), logits {logits} B of {whole}")


def check_old_spelling(d3):
    """The gemma3 case's config.json as transformers 4.5x wrote Gemma 3's: rope_theta, rope_local_base_freq and
    rope_scaling (on the global layers) instead of rope_parameters by layer type, sliding_window_pattern instead
    of layer_types: the same logits as transformers' model of the original file."""
    d = os.path.join(TMP, "gemma3_old")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(d3, d)
    c = json.load(open(os.path.join(d, "config.json")))
    for k in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        c.pop(k, None)
    c.update(rope_theta=5e5, rope_local_base_freq=20000.0, rope_scaling={"rope_type": "linear", "factor": 2.0},
             sliding_window_pattern=3)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    res = q.train("old.N1", d, 1)
    if res is None:
        return
    x, y = q.windows(0, q.B)
    with torch.no_grad():
        logits, _ = q.loss_of(q.hf("gemma3", d3), x, y)
    e = rel(res[0]["logits"][..., :V], logits.numpy())
    check("old_spelling.logits", e <= q.TOL, f"rel {e:.2e}")


def check_eval(d2):
    """shardlm eval over the first 4 windows of the data (the soft-capped LM head over the trained rows only)
    equals transformers' loss."""
    r = subprocess.run([BIN, "eval", d2, "--data", q.DATA, "--seq-len", str(T), "--batch", "2", "--max-batches", "2",
                        "--json"], env=ENV, capture_output=True, text=True, timeout=300)
    check("eval.run", r.returncode == 0, r.stderr[-300:])
    if r.returncode != 0:
        return
    got = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    x, y = q.windows(0, 4)
    with torch.no_grad():
        _, want = q.loss_of(q.hf("gemma2", d2), x, y)
    e = abs(got - want.item()) / want.item()
    check("eval.loss", e <= q.TOL, f"{got} vs transformers {want.item()} (rel {e:.2e})")


def check_multimodal(d3):
    """A Gemma3ForConditionalGeneration directory around the gemma3 case's language model."""
    text = json.load(open(os.path.join(d3, "config.json")))
    text.pop("architectures", None)
    text.pop("transformers_version", None)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=8)
    cfg = Gemma3Config(text_config=Gemma3TextConfig(**{k: v for k, v in text.items() if k != "model_type"}),
                       vision_config=vision, mm_tokens_per_image=4, image_token_index=V - 1, boi_token_index=V - 3,
                       eoi_token_index=V - 2)
    torch.manual_seed(1)
    mm = Gemma3ForConditionalGeneration(cfg)
    mm.model.language_model.load_state_dict(Gemma3ForCausalLM.from_pretrained(d3).model.state_dict())
    d = os.path.join(TMP, "gemma3_mm")
    mm.save_pretrained(d)  # tied (Gemma3Config's tie_word_embeddings, which the text model's false does not change)
    ck = os.path.join(TMP, "ck_mm")
    shutil.rmtree(ck, ignore_errors=True)
    res = q.train("mm.N1", d, 1, extra={"optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
                                        "checkpoint": {"dir": ck, "export_hf": True}})
    if res is None:
        return
    model = Gemma3ForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval().double()
    x, y = q.windows(0, q.B)
    with torch.no_grad():
        logits, _ = q.loss_of(model, x, y)
    e = rel(res[0]["logits"][..., :V], logits.numpy())
    check("mm.logits", e <= q.TOL, f"rel {e:.2e}")
    r = q.run(["train", q.config("mm_log", d)])
    exported = json.load(open(os.path.join(ck, "hf", "config.json")))
    text_model = Gemma3ForCausalLM.from_pretrained(os.path.join(ck, "hf"), dtype=torch.float32).eval().double()
    with torch.no_grad():
        e = rel(text_model(input_ids=x).logits.numpy(), logits.numpy())
    check("mm.export_text_model", exported["architectures"] == ["Gemma3ForCausalLM"] and e <= q.TOL,
          f"{exported['architectures']}, logits rel {e:.2e}")
    out = r.stdout + r.stderr
    check("mm.vision_skipped_logged", r.returncode == 0 and "vision tower is skipped" in out
          and "keys shardlm does not know" not in out, f"exit {r.returncode}: {out[-300:]}")


# Gemma 2's and Gemma 3's chat template for text turns (google/gemma-2-2b-it's tokenizer_config.json)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def gemma_tokenizer(d):
    """A tokenizer.json in Gemma's layout, made with tokenizers' own API: <pad> <eos> <bos> <unk> <start_of_turn>
    <end_of_turn>, the 256 byte tokens (byte_fallback), BPE pieces trained on docs/DESIGN.md; normalizer Replace
    " " -> "▁" (no dummy prefix), decoder Replace + ByteFallback + Fuse, <bos> $A; and tokenizer_config.json with
    Gemma's chat template. V tokens in all."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=V, special_tokens=SPECIALS + bytes_, limit_alphabet=40,
                                  show_progress=False)
    tok.train_from_iterator([open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()], trainer)
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok.save(os.path.join(d, "tokenizer.json"))
    json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
               "add_bos_token": True, "add_eos_token": False, "chat_template": GEMMA_TEMPLATE,
               "tokenizer_class": "GemmaTokenizerFast"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return tok.token_to_id("<end_of_turn>")


def check_chat(d3):
    """Gemma's chat template rendered by prepare_data and generate, and generation stopping at <end_of_turn> as
    generation_config.json's eos_token_id list says; images in chat data refused."""
    from transformers import AutoTokenizer
    d = os.path.join(TMP, "gemma3_chat")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(d3, d)
    eot = gemma_tokenizer(d)
    hf_tok = AutoTokenizer.from_pretrained(d)
    chat = [{"role": "user", "content": "What does ZeRO stage 3 shard?"},
            {"role": "assistant", "content": "Parameters, gradients and optimizer state."}]
    # prepare_data: the conversation's tokens are apply_chat_template's
    data = os.path.join(TMP, "chat.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"messages": chat}) + "\n")
    out = os.path.join(TMP, "chat.h5")
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", d,
                          "-o", out, data], capture_output=True, text=True, timeout=300)
    check("chat.prepare_data.run", r.returncode == 0, r.stderr[-300:])
    if r.returncode == 0:
        import h5py
        got = h5py.File(out, "r")["tokens"][:].tolist()
        want = hf_tok.apply_chat_template(chat, tokenize=True, return_dict=False)
        check("chat.prepare_data.template_ids", got == list(want), f"{got[:12]}... vs {list(want)[:12]}...")
    image_line = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                               {"role": "assistant", "content": "A cat."}]}
    bad = os.path.join(TMP, "images.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(image_line) + "\n")
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", d,
                          "--skip-bad", "-o", os.path.join(TMP, "images.h5"), bad], capture_output=True, text=True,
                         timeout=300)
    lines = r.stderr.strip().splitlines()
    check("chat.images_refused", r.returncode == 2 and len(lines) == 1 and "image" in lines[0], r.stderr[-300:])
    # generate: the prompt rendered by the template; the LM head's <end_of_turn> row made twice the row of the token
    # transformers picks third, so that greedy decoding meets <end_of_turn> and stops there
    prompt = chat[:1]
    ids = hf_tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    model = Gemma3ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        free = model.generate(x, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids):]
        model.lm_head.weight[eot] = 2.0 * model.lm_head.weight[int(free[2])]
    model.save_pretrained(d)
    json.dump({"eos_token_id": [1, eot], "bos_token_id": 2, "pad_token_id": 0},
              open(os.path.join(d, "generation_config.json"), "w"))
    with torch.no_grad():
        want = model.generate(x, max_new_tokens=32, do_sample=False, eos_token_id=[1, eot], pad_token_id=0)[0, len(ids):]
    path = os.path.join(TMP, "chat_prompts.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"messages": prompt}) + "\n")
    r = subprocess.run([BIN, "generate", d, "--prompt-file", path, "--max-new-tokens", "32", "--chat"],
                         env=ENV, capture_output=True, text=True, timeout=300)
    check("chat.generate.run", r.returncode == 0, r.stderr[-300:])
    if r.returncode == 0:
        row = json.loads(r.stdout.strip().splitlines()[0])
        check("chat.generate.stops_at_end_of_turn", row["ids"] == want.tolist() and row["ids"][-1] == eot
              and row["finish_reason"] == "eos", f"{row['ids']} ({row['finish_reason']}) vs {want.tolist()}")


DPO_BETA = 0.25  # not TRL's 0.1


def check_dpo(d2):
    """One full-fine-tune DPO step on the gemma2 case (its final soft-cap in the per-position backward through the
    LM head): the reference pass makes the reference the policy, so the loss is ln 2, and every gradient is that
    of TRL's sigmoid loss, -beta / 2 times d(log p chosen - log p rejected), averaged over the pairs."""
    import h5py
    from datafiles import set_str, write_samples
    rng = np.random.default_rng(23)
    pairs = []
    for _ in range(2):
        prompt = rng.integers(3, V, 5).tolist()
        pairs.append([(prompt + rng.integers(3, V, n).tolist(), [0] * 5 + [1] * n) for n in (7, 4)])
    path = os.path.join(TMP, "pref.h5")
    toks, tr, off = [], [], [0]
    for pair in pairs:
        for ids, trained in pair:
            toks, tr = toks + ids, tr + trained
            off.append(len(toks))
    write_samples(path, toks, tr, off, V)
    with h5py.File(path, "r+") as f:
        del f.attrs["format"]
        set_str(f, "format", "shardlm-preferences")
        f["prompt_lengths"] = np.array([5, 5], np.int64)
        f.attrs["max_prompt_length"] = np.int64(8)
    extra = {"data": {"train": path, "seq_len": T, "shuffle": False},
             "dpo": {"beta": DPO_BETA, "ref_log_probs_path": os.path.join(TMP, "dpo.ref.h5")},
             "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}
    res = q.train("dpo", d2, 1, extra=extra)
    if res is None:
        return
    dump = res[0]
    rows = [json.loads(line) for line in open(os.path.join(TMP, "dpo.jsonl")) if '"loss"' in line]
    e = abs(rows[0]["loss"] - np.log(2.0)) / np.log(2.0) if rows else float("inf")
    check("dpo.loss_ln2", e <= q.TOL, f"rel {e:.2e}")
    model = q.hf("gemma2", d2)
    loss = 0.0
    for pair in pairs:
        lp = []
        for ids, trained in pair:
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
            lp.append(sum(logp[p - 1, ids[p]] for p in range(1, len(ids)) if trained[p]))
        margin = (lp[0] - lp[0].detach()) - (lp[1] - lp[1].detach())
        loss = loss - torch.nn.functional.logsigmoid(DPO_BETA * margin) / len(pairs)
    loss.backward()
    bad, worst = [], 0.0
    for n, p in model.named_parameters():
        g = q.dumped(dump, "grad.", n)
        e = rel(g, p.grad.numpy()) if g is not None else float("inf")
        worst = max(worst, e)
        if not e <= q.GRAD_TOL:
            bad.append(f"{n} {e:.2e}")
    check("dpo.grads", not bad, f"{bad[:4]}")
    note(f"gemma2 DPO: max gradient rel err {worst:.2e}")


def check_refused(dirs):
    cases = {"bidirectional": ("gemma3", {"use_bidirectional_attention": True}, ["use_bidirectional_attention"], None),
             "layer_types": ("gemma3", {"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
                             ["layer_types"], None),
             "activation": ("gemma2", {"hidden_activation": "gelu"}, ["hidden_activation"], None)}
    for name, (src, edit, words, _) in cases.items():
        d = os.path.join(TMP, "bad_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(dirs[src], d)
        c = json.load(open(os.path.join(d, "config.json")))
        c.update(edit)
        json.dump(c, open(os.path.join(d, "config.json"), "w"))
        r = q.run(["train", q.config("bad_" + name, d)])
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("shardlm:")]
        check(f"refuse.{name}", r.returncode == 2 and len(lines) == 1 and all(w in lines[-1] for w in words),
              f"exit {r.returncode}: {r.stderr[-300:]}")


def main():
    q.TOKENIZER = byte_bpe_tokenizer(os.path.join(TMP, "tokenizer.json"), V)
    dirs = make_models()
    parts = os.environ.get("T_GEMMA_ONLY", "gemma2,gemma3,extra").split(",")  # a part alone while developing
    for kind in ("gemma2", "gemma3"):
        if kind not in parts:
            continue
        q.check_n1(kind, dirs[kind])
        q.check_ranks(kind, dirs[kind], kind)
        q.check_export(kind)
        q.check_generate(kind, dirs[kind])
        q.check_lora(kind, dirs[kind])
    if "extra" in parts:
        check_softcap(dirs["gemma2"])
        check_attention_options(dirs)
        check_eval(dirs["gemma2"])
        check_checkpointing(dirs["gemma3"])
        check_plan()
        check_old_spelling(dirs["gemma3"])
        q.check_ranks("gemma2_bf16", dirs["gemma2_bf16"], "gemma2")
        check_multimodal(dirs["gemma3"])
        check_chat(dirs["gemma3"])
        check_dpo(dirs["gemma2"])
        check_refused(dirs)
    sys.exit(1 if failures() else 0)


if __name__ == "__main__":
    main()
