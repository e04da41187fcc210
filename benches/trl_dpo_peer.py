#!/usr/bin/env python3
"""Peer of `trace-train dpo`: TRL's DPOTrainer on the same pairs file, model folder and
settings, logging each optimizer step as a JSON line with our metric names.

  python3 trl_dpo_peer.py --model FOLDER --pairs pairs.jsonl [--loss sigmoid|ipo|robust|hinge]
      [--beta 0.1] [--epsilon 0.1] [--nll_coef 0] [--lr 1e-5] [--batch_size 4] [--accum 1]
      [--epochs 1] [--lora_r 16] [--lora_alpha 32] [--max_length 2048] [--seed 42]
      [--device auto|cpu|cuda] [--output_dir DIR] [--save_adapter DIR]

  # beside ours, on the same pairs:
  trace-train dpo --model FOLDER --pairs pairs.jsonl --output_dir ours --device cpu
  python3 benches/trl_dpo_peer.py --model FOLDER --pairs pairs.jsonl --device cpu > peer.jsonl

What it runs, set to match ours (src/pref/dpo.rs, config DpoConfig):
- the pairs file `trace-train prefs` writes: each line's `prompt` becomes a user
  message and `chosen`/`rejected` assistant messages (TRL's conversational format),
  so the chat template of the folder renders them as ours does;
- LoRA on all seven projections (PEFT), no dropout, the reference the same model with
  the adapter switched off (TRL's default for a fresh PEFT adapter; ours
  `reference: adapter_off`);
- loss_type as --loss (TRL's `sigmoid`, `ipo` (length-normalised, as ours), `robust`
  with label_smoothing = --epsilon, `hinge`), and --nll_coef > 0 adds TRL's `sft` term
  with that weight (ours: the chosen answer's NLL divided by its length, per pair; TRL's
  is a token mean over the batch, so the two differ when answer lengths differ);
- AdamW, cosine schedule with 10% warm-up (ours: warmup_ratio 0.1, min_lr_ratio 0.1; TRL
  decays to 0), gradient norm clipped at 1, f32 on the CPU / bf16 on a GPU.

Output: one JSON line a logged step with `step`, `loss`, `rewards/chosen`,
`rewards/rejected`, `rewards/margins`, `rewards/accuracies`, `logps/chosen`,
`logps/rejected` (TRL's names, which ours share), then a summary line with the versions,
`tokens_per_s` and `peak_mem_gib`. Tokens are counted as ours counts them (src/pref/dpo.rs):
a pair is its prompt twice plus both answers, in the chat template's tokens; the rate is
taken over the steps after the first (its time holds the start-up), from the mean tokens
of a pair, and the peak is `torch.cuda.max_memory_allocated` (and the reserved peak).
Compare the first step's loss (log 2 for a fresh adapter under both) and the curves.
"""
import argparse
import math
import json
import sys

KEYS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
        "logps/chosen", "logps/rejected"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def fail(msg, hint):
    print(f"error: {msg}\nhint: {hint}", file=sys.stderr)
    sys.exit(2)


def read_pairs(path):
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
                if p.get("chosen_open") or p.get("rejected_open"):
                    fail(f"`{path}` line {i}: an open side (a `first_error` pair): DPOTrainer ends every answer",
                         "compare on pairs made without `prefs --first_error`")
                rows.append({
                    "prompt": [{"role": "user", "content": p["prompt"]}],
                    "chosen": [{"role": "assistant", "content": p["chosen"]}],
                    "rejected": [{"role": "assistant", "content": p["rejected"]}],
                })
            except (ValueError, KeyError) as e:
                fail(f"`{path}` line {i}: not a pair ({e})", "pass the output of `trace-train prefs`")
    if not rows:
        fail(f"`{path}` holds no pairs", "run `trace-train prefs` on more rollouts")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder with its tokenizer and chat template")
    p.add_argument("--pairs", required=True, help="the pairs file of `trace-train prefs`")
    p.add_argument("--loss", default="sigmoid", choices=["sigmoid", "ipo", "robust", "hinge"])
    p.add_argument("--beta", type=float, default=0.1, help="DPO's beta")
    p.add_argument("--epsilon", type=float, default=0.1, help="robust DPO's label-flip rate")
    p.add_argument("--nll_coef", type=float, default=0.0, help="weight of the NLL term on chosen answers")
    p.add_argument("--lr", type=float, default=1e-5, help="peak learning rate")
    p.add_argument("--batch_size", type=int, default=4, help="pairs a micro-batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches an optimizer step")
    p.add_argument("--epochs", type=float, default=1, help="passes over the pairs")
    p.add_argument("--lora_r", type=int, default=16, help="LoRA rank")
    p.add_argument("--lora_alpha", type=float, default=32, help="LoRA alpha")
    p.add_argument("--max_length", type=int, default=2048, help="longest prompt + answer in tokens")
    p.add_argument("--seed", type=int, default=42, help="seed of the pair order")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    p.add_argument("--output_dir", default="trl_dpo_peer_out", help="TRL's output folder")
    p.add_argument("--save_adapter", default=None,
                   help="write the trained LoRA adapter here (PEFT layout), for `trace-train eval --adapter`")
    a = p.parse_args()
    if a.loss == "robust" and not 0 <= a.epsilon < 0.5:
        fail(f"--epsilon {a.epsilon}: robust DPO needs it in [0, 0.5)", "pass e.g. --epsilon 0.1")

    import peft
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    cuda = torch.cuda.is_available() if a.device == "auto" else a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, device_map={"": 0} if cuda else None)
    losses = [a.loss]
    weights = [1.0]
    if a.nll_coef > 0:
        losses.append("sft")
        weights.append(a.nll_coef)
    pairs = read_pairs(a.pairs)
    # 10% warm-up in steps (transformers 5 takes no `warmup_ratio`).
    steps = math.ceil(math.ceil(len(pairs) / (a.batch_size * a.accum)) * a.epochs)
    warmup = math.ceil(0.1 * steps)
    cfg = DPOConfig(
        output_dir=a.output_dir, beta=a.beta, loss_type=losses, loss_weights=weights,
        label_smoothing=a.epsilon if a.loss == "robust" else 0.0,
        learning_rate=a.lr, lr_scheduler_type="cosine", warmup_steps=warmup, max_grad_norm=1.0,
        per_device_train_batch_size=a.batch_size, gradient_accumulation_steps=a.accum,
        num_train_epochs=a.epochs, max_length=a.max_length, seed=a.seed, logging_steps=1,
        save_strategy="no", report_to=[], bf16=cuda, use_cpu=not cuda, gradient_checkpointing=False,
    )
    lora = LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=0.0, target_modules=TARGETS,
                      task_type="CAUSAL_LM")

    import time

    # Tokens a pair, as ours counts them: each whole conversation (prompt and answer)
    # rendered by the chat template, so a pair is the prompt twice plus both answers.
    def n_tokens(msgs):
        ids = tok.apply_chat_template(msgs, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)
    per_pair = []
    for r in pairs:
        whole = lambda k: min(n_tokens(r["prompt"] + r[k]), a.max_length)
        per_pair.append(whole("chosen") + whole("rejected"))
    mean_pair_tokens = sum(per_pair) / len(per_pair)
    step_ends = []

    class Lines(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            step_ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                row = {"step": state.global_step}
                row.update({k: logs[k] for k in KEYS if k in logs})
                print(json.dumps(row), flush=True)

    trainer = DPOTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(pairs),
                         processing_class=tok, peft_config=lora, callbacks=[Lines()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    if a.save_adapter:
        trainer.model.save_pretrained(a.save_adapter)
    pairs_a_step = a.batch_size * a.accum
    timed = len(step_ends) - 1
    rate = (timed * pairs_a_step * mean_pair_tokens / (step_ends[-1] - step_ends[0])) if timed > 0 else None
    gib = 1024 ** 3
    print(json.dumps({"summary": True, "trl": trl.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "torch": torch.__version__, "device": "cuda" if cuda else "cpu",
                      "steps": trainer.state.global_step, "pairs": len(pairs),
                      "mean_pair_tokens": round(mean_pair_tokens, 1),
                      "tokens_per_s": round(rate, 1) if rate else None,
                      "peak_mem_gib": round(torch.cuda.max_memory_allocated() / gib, 3) if cuda else None,
                      "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / gib, 3) if cuda else None}))


if __name__ == "__main__":
    main()
