#!/usr/bin/env python3
"""Peer of `trace-train bench rl`: one RL step through TRL's GRPOTrainer (TRL's own
generation with transformers' `generate`, no vLLM) with transformers + PEFT, on the
same sizes, printed as one JSON line with the same field names.

  python3 trl_rl_peer.py --model qwen3-4b|FOLDER --batch 16 --group 8 --prompt 256 --new 512 \
      [--mini_batch_size 16] [--steps 1] [--gc] [--4bit] [--device auto|cpu|cuda]
  python3 trl_rl_peer.py --model tiny --batch 2 --group 2 --prompt 8 --new 4 --device cpu   # seconds

What it runs, set to match our step (src/bench/rl.rs):
- the model: random weights of a shape (qwen3-4b, qwen3-1.7b, qwen3-0.6b, smollm2-135m,
  tiny; PyTorch's init, as hf_peer.py) with a byte-level tokenizer built here, or a model
  folder with its tokenizer (e.g. one made by make_random_model.py); bf16 on a GPU (f32
  on the CPU); --4bit loads the frozen weights in bitsandbytes NF4 with double
  quantisation (QLoRA; needs the bitsandbytes wheel);
- LoRA r 16, alpha 32, no dropout, on all seven projections (PEFT, through the
  trainer's peft_config); reference log-probs with the adapter switched off (TRL does
  that for a PEFT model when beta != 0);
- batch x group completions a step (generation_batch_size), each exactly --new tokens
  (generation_kwargs min_new_tokens = max_completion_length = --new: the end-of-turn
  token cannot be drawn before), temperature 1, top-p 1, top-k off;
- minibatches of --mini_batch_size completions, one AdamW step each
  (per_device_train_batch_size = mini_batch_size, gradient_accumulation_steps 1,
  steps_per_generation = batch x group / mini_batch_size): one sampling, then that many
  optimizer steps, as our step does; lr 5e-7 (Stage 3's default), clip 0.2 / 0.28,
  token-mean loss ("dapo"), group-scaled advantages, k3 KL with beta 0.001 (our GRPO
  defaults), gradient norm clipped at 1;
- prompts of exactly --prompt token ids (the same formula as ours; `_tokenize_prompts`
  is replaced to hand them over, since text does not tokenize to an exact length);
- the reward: the share of even token ids in a completion (ours too).

Phases, each timed between CUDA synchronisations: sample_s is `_generate_single_turn`
(the model's generate and its post-processing), score_s `_calculate_rewards`, old_ref_s
the no-grad log-prob passes made while scoring (the reference pass; the old-log-prob
pass only when TRL needs it, i.e. when a sampling feeds more than one optimizer step,
`old_pass` in the output), update_s the rest of the step (decoding, advantages,
forward, backward, AdamW), step_s from the first optimizer step of a sampling to the
end of its last. One untimed warm-up step, then --steps timed ones (mean). Peak memory
is torch.cuda.max_memory_allocated (and _reserved) over the timed steps, weights
included. TRL 1.16 has no PPOTrainer, so --algorithm ppo is refused.
"""
import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time

SHAPES = {
    # name: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab), tied embeddings
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936),
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152),
    "tiny": (64, 128, 2, 4, 2, 32, 512),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def fail(msg, hint):
    print(f"error: {msg}\nhint: {hint}", file=sys.stderr)
    sys.exit(2)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a shape (%s) or a model folder" % ", ".join(SHAPES))
    p.add_argument("--algorithm", default="grpo", help="grpo (TRL 1.16 has no PPOTrainer)")
    p.add_argument("--batch", type=int, default=16, help="prompts a step")
    p.add_argument("--group", type=int, default=8, help="completions a prompt (num_generations)")
    p.add_argument("--prompt", type=int, default=256, help="tokens a prompt")
    p.add_argument("--new", type=int, default=512, help="tokens every completion has")
    p.add_argument("--mini_batch_size", type=int, default=16, help="completions an optimizer step")
    p.add_argument("--steps", type=int, default=1, help="timed steps after one warm-up step")
    p.add_argument("--gc", action="store_true", help="gradient checkpointing")
    p.add_argument("--4bit", dest="four_bit", action="store_true", help="NF4 base weights (bitsandbytes)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a = p.parse_args()
    if a.algorithm != "grpo":
        fail(f"--algorithm {a.algorithm}: TRL 1.16 has no PPOTrainer (only GRPO-family trainers)",
             "pass --algorithm grpo; compare with `trace-train bench rl --algorithm grpo`")
    for name in ["batch", "prompt", "new", "mini_batch_size", "steps"]:
        if getattr(a, name) < 1:
            fail(f"--{name}: must be at least 1", f"pass --{name} 1 or more")
    if a.group < 2:
        fail(f"--group {a.group}: GRPO needs at least 2 completions a prompt", "pass --group 2 or more")
    if not (os.path.isdir(a.model) or a.model in SHAPES):
        fail(f"--model `{a.model}` is neither a shape nor a folder", "one of %s, or a model folder" % ", ".join(SHAPES))
    n = a.batch * a.group
    a.mini_batch_size = min(a.mini_batch_size, n)
    if n % a.mini_batch_size:
        fail(f"--mini_batch_size {a.mini_batch_size}: TRL needs it to divide batch x group ({n})",
             "pick a divisor of batch x group (ours accepts a short last minibatch; TRL does not)")
    return a


def byte_tokenizer():
    """The tokenizer of `trace-train model tiny`: 256 byte tokens, no merges, and
    <|endoftext|> (256, padding), <|im_start|> (257), <|im_end|> (258, eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token="<|im_start|>")


def build(a, cuda):
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, LlamaConfig,
                              LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    dtype = torch.bfloat16 if cuda else torch.float32
    quant = None
    if a.four_bit:
        if not cuda:
            fail("--4bit needs a GPU (bitsandbytes)", "leave out --4bit on the CPU")
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
    if os.path.isdir(a.model):
        tok = AutoTokenizer.from_pretrained(a.model)
        folder = a.model
    else:
        h, i, l, n, kv, hd, v = SHAPES[a.model]
        if a.model == "smollm2-135m":
            cfg, cls = LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=l, num_attention_heads=n,
                                   num_key_value_heads=kv, vocab_size=v, tie_word_embeddings=True,
                                   rope_theta=1e5), LlamaForCausalLM
        else:
            cfg, cls = Qwen3Config(hidden_size=h, intermediate_size=i, num_hidden_layers=l, num_attention_heads=n,
                                   num_key_value_heads=kv, head_dim=hd, vocab_size=v, tie_word_embeddings=True,
                                   rope_theta=1e6, max_position_embeddings=40960), Qwen3ForCausalLM
        tok = byte_tokenizer()
        cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        with torch.device("cuda" if cuda else "cpu"):
            model = cls(cfg).to(dtype)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        if quant is None:
            return model, tok
        # bitsandbytes quantises while loading: write the random model, read it back.
        folder = tempfile.mkdtemp(prefix="trl_rl_peer")
        model.save_pretrained(folder)
        del model
        torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, quantization_config=quant,
                                                 attn_implementation="sdpa",
                                                 device_map={"": 0} if cuda else None)
    return model, tok


def main():
    a = parse()
    import torch
    import transformers
    import peft
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available() if a.device == "auto" else a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("--device cuda: no GPU visible to PyTorch", "pass --device cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, tok = build(a, cuda)
    vocab = model.config.vocab_size
    rows = a.batch * (1 + a.steps)
    prompt_ids = {f"p{r}": [((r * a.prompt + i) * 2654435761) % (vocab - 1) + 1 for i in range(a.prompt)]
                  for r in range(rows)}
    spg = a.batch * a.group // a.mini_batch_size  # optimizer steps a sampling

    phases = {"sample": 0.0, "score": 0.0, "old_ref": 0.0}

    @contextlib.contextmanager
    def phase(name):
        sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            sync()
            phases[name] += time.perf_counter() - t

    seen = {"rewards": [], "lengths": set(), "old_ref_calls": 0}

    def even_share(prompts, completions, completion_ids, **kwargs):
        r = [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]
        seen["rewards"] = r
        seen["lengths"].update(len(ids) for ids in completion_ids)
        return r

    class Timed(GRPOTrainer):
        def _tokenize_prompts(self, prompts):
            return [prompt_ids[p] for p in prompts], None, {}

        def _generate_single_turn(self, *args, **kwargs):
            with phase("sample"):
                return super()._generate_single_turn(*args, **kwargs)

        def _calculate_rewards(self, *args, **kwargs):
            with phase("score"):
                return super()._calculate_rewards(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            if torch.is_grad_enabled():  # the training forward: part of the update
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            seen["old_ref_calls"] += 1
            with phase("old_ref"):
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    steps = []  # (total, sample, score, old_ref) of each RL step

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % spg == 0:
                if state.global_step == spg and cuda:  # the first timed step
                    sync()
                    torch.cuda.reset_peak_memory_stats()
                sync()
                for k in phases:
                    phases[k] = 0.0
                seen["old_ref_calls"] = 0
                self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % spg == 0:
                sync()
                steps.append((time.perf_counter() - self.t, phases["sample"], phases["score"], phases["old_ref"],
                              seen["old_ref_calls"]))

    out = tempfile.mkdtemp(prefix="trl_rl_peer_out")
    args = GRPOConfig(
        output_dir=out, report_to=[], save_strategy="no", logging_steps=spg, disable_tqdm=True, seed=42,
        use_cpu=not cuda, bf16=cuda, gradient_checkpointing=a.gc,
        max_steps=spg * (1 + a.steps), per_device_train_batch_size=a.mini_batch_size,
        gradient_accumulation_steps=1, steps_per_generation=spg, num_generations=a.group,
        max_completion_length=a.new, generation_kwargs={"min_new_tokens": a.new},
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=5e-7, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, beta=0.001, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        scale_rewards="group", num_iterations=1, mask_truncated_completions=False, disable_dropout=True,
        remove_unused_columns=False, dataloader_num_workers=0, shuffle_dataset=False,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    data = Dataset.from_dict({"prompt": list(prompt_ids)})
    # The trainer's log lines go to stdout; stdout is kept for the result.
    with contextlib.redirect_stdout(sys.stderr):
        trainer = Timed(model=model, reward_funcs=even_share, args=args, train_dataset=data,
                        processing_class=tok, peft_config=lora, callbacks=[Clock()])
        trainer.train()
    if len(steps) != 1 + a.steps:
        fail(f"timed {len(steps)} RL steps, expected {1 + a.steps}", "report this with the TRL version")
    if seen["lengths"] != {a.new}:
        fail(f"completion lengths {sorted(seen['lengths'])}, not {a.new}", "min_new_tokens was not honoured")
    timed = steps[1:]
    mean = lambda k: sum(s[k] for s in timed) / len(timed)
    step_s, sample_s, score_s, old_ref_s = mean(0), mean(1), mean(2), mean(3)
    n = a.batch * a.group
    gib = lambda b: round(b / 2**30, 2)
    result = {
        "peer": f"trl {trl.__version__} GRPOTrainer", "job": "rl_step", "model": a.model, "algorithm": "grpo",
        "batch": a.batch, "group": a.group, "prompt": a.prompt, "new": a.new, "mini_batch": a.mini_batch_size,
        "rank": 16, "4bit": a.four_bit, "grad_ckpt": a.gc, "steps": a.steps,
        "sample_s": round(sample_s, 4), "score_s": round(score_s, 4), "old_ref_s": round(old_ref_s, 4),
        "update_s": round(step_s - sample_s - score_s - old_ref_s, 4), "step_s": round(step_s, 4),
        "warmup_step_s": round(steps[0][0], 4),
        "new_tokens_per_s": round(n * a.new / sample_s, 1),
        "tokens_per_s": round(n * (a.prompt + a.new) / step_s, 1),
        "minibatches": spg, "old_pass": timed[-1][4] > 1,
        "reward_mean": sum(seen["rewards"]) / len(seen["rewards"]),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "trl": trl.__version__},
    }
    if cuda:
        result["peak_mem_gib"] = gib(torch.cuda.max_memory_allocated())
        result["peak_reserved_gib"] = gib(torch.cuda.max_memory_reserved())
    if not all(math.isfinite(result[k]) for k in ["sample_s", "step_s"]):
        fail("a time is not finite", "report this")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
