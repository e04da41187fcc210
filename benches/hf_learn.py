#!/usr/bin/env python3
"""The learning peer: trace-train's SFT recipe through PyTorch + transformers +
PEFT, on the same base folder, the same JSONL files and the same
hyper-parameters, so that the two recipes can be compared on what they teach
(held-out answer loss here, exact match by running `trace-train eval` on the
merged folder this script writes, which decodes and scores both models the
same way).

  python3 hf_learn.py --model BASE_DIR --train train.jsonl --eval test.jsonl --out OUT \
      [--epochs 3] [--batch 8] [--accum 1] [--lr 1e-3] [--max_length 2048] ...

What it mirrors of trace-train's `warmup`/`sft` (src/train/sft.rs, src/data/example.rs):
- records: `{"messages": [..., {"role": "assistant", ...}]}` as `generate` writes;
- prompt = the chat template over all but the last message with the generation
  prompt; answer = the rest of the full render, cut right after the first
  end-of-turn token; prompt and answer tokenized separately; loss on the answer
  tokens only (end-of-turn included); examples longer than max_length dropped;
- LoRA r/alpha/dropout on all seven projections, factors in f32 on a bf16 base;
- AdamW (0.9, 0.999, eps 1e-8, weight decay), linear warmup then cosine to a
  floor (min_lr_ratio), global-norm clipping, token-weighted loss over the
  micro-batches of one optimizer step;
- eval loss: mean answer-token loss over the eval file.
What differs: batches are drawn by a seeded shuffle (trace-train buckets by
length), so the two runs see the same examples per epoch in another order.

Speed on the same rows (`--max_steps N --no_save`): the strongest setup that
travels, `--liger` (Liger-Kernel's RoPE, RMSNorm, SwiGLU and fused linear
cross-entropy, which never materialises the logits; the liger-kernel wheel on
PYTHONPATH) and `--packing` (each micro-batch's examples end to end in one row,
positions restarting at each example, so transformers keeps attention inside
each: a block-diagonal mask for sdpa, variable-length kernels for
flash_attention_2 when the flash-attn package is there), with `--4bit`
(bitsandbytes NF4, QLoRA) and `--gc` (gradient checkpointing). The summary line
then has real (non-padding) tokens a second over the steps after the first,
and the peak of torch's allocator.

Writes OUT/adapter (PEFT), OUT/merged (the adapter merged into the base in the
base's own dtype, with the base's tokenizer files) and OUT/metrics.jsonl;
prints one JSON line a logged step and a summary line at the end.
"""
import argparse, json, math, os, random, shutil, time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def chat_template(base):
    path = os.path.join(base, "chat_template.jinja")
    return open(path).read() if os.path.exists(path) else None


def encode(tok, template, messages, end_of_turn, max_length):
    kw = {"chat_template": template} if template else {}
    prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False, **kw)
    full = tok.apply_chat_template(messages, tokenize=False, enable_thinking=False, **kw)
    if not full.startswith(prompt):
        raise ValueError("the full render does not start with the prompt render")
    answer = full[len(prompt):]
    cut = answer.find(end_of_turn)
    if cut < 0:
        raise ValueError(f"no end-of-turn token {end_of_turn!r} in the answer render")
    answer = answer[:cut + len(end_of_turn)]
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    a = tok(answer, add_special_tokens=False)["input_ids"]
    if len(p) + len(a) > max_length:
        return None
    return p + a, len(p)


def load(path, tok, template, end_of_turn, max_length):
    out, dropped = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            ex = encode(tok, template, json.loads(line)["messages"], end_of_turn, max_length)
            if ex is None:
                dropped += 1
            else:
                out.append(ex)
    return out, dropped


def batch_tensors(examples, pad_id, device):
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (seq, plen) in enumerate(examples):
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, plen:len(seq)] = torch.tensor(seq[plen:])
        mask[i, :len(seq)] = 1
    return ids.to(device), labels.to(device), mask.to(device)


def packed_tensors(examples, device):
    """One row: the examples end to end, positions restarting at each; the
    first label of each example is ignored (the token before it belongs to
    the previous example)."""
    ids, labels, pos = [], [], []
    for seq, plen in examples:
        ids += seq
        labels += [-100] * max(plen, 1) + seq[max(plen, 1):]
        pos += list(range(len(seq)))
    t = lambda v: torch.tensor([v], dtype=torch.long, device=device)
    return t(ids), t(labels), t(pos)


def loss_sum(model, ids, labels, mask, positions=None, liger=False):
    target = labels[:, 1:]
    count = int((target != -100).sum())
    kw = {"attention_mask": mask} if positions is None else {"position_ids": positions}
    if liger:
        # Liger's fused linear cross-entropy: the mean over the shifted
        # labels, without the logits.
        loss = model(input_ids=ids, labels=labels, **kw).loss
        return loss.float() * count, count
    logits = model(input_ids=ids, **kw).logits[:, :-1].float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, int((target != -100).sum())


@torch.no_grad()
def eval_loss(model, examples, pad_id, device, batch):
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(examples), batch):
        s, n = loss_sum(model, *batch_tensors(examples[i:i + batch], pad_id, device))
        total += float(s); count += n
    model.train()
    return total / max(count, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="base model folder (Hugging Face layout)")
    p.add_argument("--train", required=True)
    p.add_argument("--eval")
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup_ratio", type=float, default=0.03)
    p.add_argument("--min_lr_ratio", type=float, default=0.1)
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--lora_r", type=int, default=16)
    p.add_argument("--lora_alpha", type=float, default=32)
    p.add_argument("--lora_dropout", type=float, default=0.05)
    p.add_argument("--max_length", type=int, default=2048)
    p.add_argument("--eval_steps", type=int, default=50)
    p.add_argument("--eval_batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--end_of_turn", default="<|im_end|>")
    p.add_argument("--liger", action="store_true", help="Liger-Kernel's kernels (see above)")
    p.add_argument("--packing", action="store_true", help="a micro-batch's examples in one row")
    p.add_argument("--4bit", dest="four_bit", action="store_true", help="NF4 base (QLoRA)")
    p.add_argument("--gc", action="store_true", help="gradient checkpointing")
    p.add_argument("--max_steps", type=int, default=0, help="stop after N optimizer steps")
    p.add_argument("--no_save", action="store_true", help="write no adapter or merged model")
    a = p.parse_args()
    if a.liger:
        from liger_kernel.transformers import (apply_liger_kernel_to_llama,
                                               apply_liger_kernel_to_qwen3)
        for apply in (apply_liger_kernel_to_qwen3, apply_liger_kernel_to_llama):
            apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                  fused_linear_cross_entropy=True)

    from peft import LoraConfig, PeftModel, get_peft_model
    torch.manual_seed(a.seed); random.seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(a.model)
    template = chat_template(a.model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train, dropped = load(a.train, tok, template, a.end_of_turn, a.max_length)
    evals = load(a.eval, tok, template, a.end_of_turn, a.max_length)[0] if a.eval else []

    attn = "sdpa"
    if a.packing:
        try:
            import flash_attn  # noqa: F401
            attn = "flash_attention_2"
        except ImportError:
            pass
    load_kw = {}
    if a.four_bit:
        from transformers import BitsAndBytesConfig
        load_kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16)
        load_kw["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation=attn, **load_kw)
    if not a.four_bit:
        model = model.to(device)
    if a.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha,
                                             lora_dropout=a.lora_dropout, target_modules=TARGETS))
    for n, prm in model.named_parameters():
        if prm.requires_grad:
            prm.data = prm.data.float()  # f32 factors on the bf16 base, as trace-train keeps them
    params = [prm for prm in model.parameters() if prm.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay)
    per_step = a.batch * a.accum
    steps_per_epoch = math.ceil(len(train) / per_step)
    total = steps_per_epoch * a.epochs
    warm = min(math.ceil(total * a.warmup_ratio), total)

    def lr_at(step):
        if step < warm:
            return a.lr * (step + 1) / warm
        prog = min((step - warm) / max(total - warm, 1), 1.0)
        return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * (1 + math.cos(math.pi * prog)) / 2)

    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "metrics.jsonl"), "w")

    def emit(rec):
        line = json.dumps(rec)
        print(line, flush=True); log.write(line + "\n"); log.flush()

    model.train()
    rng = random.Random(a.seed)
    step, tokens, t0 = 0, 0, time.perf_counter()
    # Real tokens and seconds of the steps after the first (CUDA set-up,
    # Triton compiles and the allocator's growth fall in the first).
    timed_tokens, timed_s = 0, 0.0
    for epoch in range(a.epochs):
        order = list(range(len(train)))
        rng.shuffle(order)
        for s in range(steps_per_epoch):
            chunk = [train[i] for i in order[s * per_step:(s + 1) * per_step]]
            if not chunk:
                break
            micro = [chunk[i:i + a.batch] for i in range(0, len(chunk), a.batch)]
            n_tok = sum(len(seq) - plen for seq, plen in chunk)
            total_loss = 0.0
            ts = time.perf_counter()
            step_tokens = 0
            for mb in micro:
                if a.packing:
                    ids, labels, pos = packed_tensors(mb, device)
                    ls, _ = loss_sum(model, ids, labels, None, pos, a.liger)
                else:
                    ls, _ = loss_sum(model, *batch_tensors(mb, pad_id, device), liger=a.liger)
                (ls / n_tok).backward()
                total_loss += float(ls)
                step_tokens += sum(len(seq) for seq, _ in mb)
            tokens += step_tokens
            norm = float(torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm))
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            opt.step(); opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            secs_step = time.perf_counter() - ts
            step += 1
            if step > 1:
                timed_tokens += step_tokens; timed_s += secs_step
            rec = {"step": step, "epoch": epoch, "loss": total_loss / n_tok, "lr": lr_at(step - 1),
                   "grad_norm": norm, "tokens": step_tokens, "time_step_s": round(secs_step, 3),
                   "tokens_per_s": round(step_tokens / secs_step, 1)}
            if evals and (step % a.eval_steps == 0 or step == total):
                rec["eval_loss"] = eval_loss(model, evals, pad_id, device, a.eval_batch)
            emit(rec)
            if a.max_steps and step >= a.max_steps:
                break
        if a.max_steps and step >= a.max_steps:
            break
    if device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    final_eval = eval_loss(model, evals, pad_id, device, a.eval_batch) if evals else None
    speed = {"steady_tokens_per_s": round(timed_tokens / timed_s, 1) if timed_s else None,
             "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
             if device == "cuda" else None,
             "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)
             if device == "cuda" else None,
             "liger": a.liger, "packing": a.packing, "attention": attn, "four_bit": a.four_bit,
             "gc": a.gc}
    if a.no_save:
        emit({"summary": True, "peer": "transformers+peft" + ("+liger" if a.liger else ""),
              "train_examples": len(train), "steps": step, "seconds": round(secs, 1),
              "tokens_per_s": round(tokens / secs, 1), "final_eval_loss": final_eval, **speed})
        return

    adapter = os.path.join(a.out, "adapter")
    model.save_pretrained(adapter)
    del model, opt
    if device == "cuda":
        torch.cuda.empty_cache()
    # Merge into the base in its own dtype, as trace-train writes `merged/`.
    base = AutoModelForCausalLM.from_pretrained(a.model, dtype="auto")
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    out = os.path.join(a.out, "merged")
    merged.save_pretrained(out, safe_serialization=True)
    for name in os.listdir(a.model):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja",
                                                    "generation_config.json"):
            shutil.copy(os.path.join(a.model, name), os.path.join(out, name))
    emit({"summary": True, "peer": "transformers+peft", "train_examples": len(train),
          "dropped_too_long": dropped, "eval_examples": len(evals), "steps": step,
          "seconds": round(secs, 1), "tokens_per_s": round(tokens / secs, 1),
          "final_eval_loss": final_eval})


if __name__ == "__main__":
    main()
