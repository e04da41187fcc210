#!/usr/bin/env python3
"""Peer baseline on the GPU machine: the same LoRA SFT step and the same batched
sampling that trace-train does, through PyTorch + transformers + PEFT (what users
of the Python pipelines run today). Weights are random: this measures speed and
memory, not quality. Run it in the same GPU run as trace-train's own bench so
that the ratio is taken on one card.

  python3 hf_peer.py sft --model qwen3-4b --batch 4 --seq 1024 [--gc] [--4bit] [--steps 10]
  python3 hf_peer.py gen --model qwen3-4b --batch 32 --prompt 256 --new 256
Prints one JSON line per measurement.

--4bit loads the frozen weights as QLoRA does (bitsandbytes NF4 with double
quantisation, bf16 compute): the random model is written to a temporary folder
and read back through from_pretrained with a BitsAndBytesConfig, since
bitsandbytes quantises while loading. Needs the bitsandbytes wheel.
"""
import argparse, json, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, LlamaConfig, LlamaForCausalLM

SHAPES = {
    # name: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tie)
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936, True),
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152, True),
}

def build(name):
    h, i, l, a, kv, hd, v, tie = SHAPES[name]
    if name.startswith("qwen3"):
        cfg = Qwen3Config(hidden_size=h, intermediate_size=i, num_hidden_layers=l,
                          num_attention_heads=a, num_key_value_heads=kv, head_dim=hd,
                          vocab_size=v, tie_word_embeddings=tie, rope_theta=1e6,
                          max_position_embeddings=40960)
        cls = Qwen3ForCausalLM
    else:
        cfg = LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=l,
                          num_attention_heads=a, num_key_value_heads=kv, vocab_size=v,
                          tie_word_embeddings=tie, rope_theta=1e5)
        cls = LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = cls(cfg).to(torch.bfloat16)
    return model, cfg

def build_4bit(name):
    import tempfile
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    model, cfg = build(name)
    tmp = tempfile.mkdtemp()
    model.save_pretrained(tmp)
    del model
    torch.cuda.empty_cache()
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=q, dtype=torch.bfloat16,
                                                 device_map={"": 0}, attn_implementation="sdpa")
    model.train()  # from_pretrained returns eval mode, where checkpointing is off
    return model, cfg

def sft(args):
    from peft import LoraConfig, get_peft_model
    model, cfg = build_4bit(args.model) if args.four_bit else build(args.model)
    if args.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize(); s = time.perf_counter() - t
    toks = args.batch * args.seq * args.steps
    print(json.dumps({"peer": "transformers+peft", "job": "lora_sft", "model": args.model,
        "batch": args.batch, "seq": args.seq, "rank": args.rank, "grad_ckpt": args.gc, "4bit": args.four_bit,
        "tokens_per_s": round(toks / s, 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)

@torch.no_grad()
def gen(args):
    model, cfg = build(args.model)
    model.eval()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device="cuda")
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=True, temperature=0.7,
              top_p=1.0, pad_token_id=0)
    model.generate(ids, **{**kw, "max_new_tokens": 8, "min_new_tokens": 8})
    torch.cuda.synchronize(); t = time.perf_counter()
    out = model.generate(ids, **kw)
    torch.cuda.synchronize(); s = time.perf_counter() - t
    new = (out.shape[1] - args.prompt) * args.batch
    print(json.dumps({"peer": "transformers.generate", "job": "sample", "model": args.model,
        "batch": args.batch, "prompt": args.prompt, "new": args.new,
        "new_tokens_per_s": round(new / s, 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("job", choices=["sft", "gen"])
    p.add_argument("--model", default="qwen3-4b", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--gc", action="store_true")
    p.add_argument("--4bit", dest="four_bit", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=256)
    a = p.parse_args()
    sft(a) if a.job == "sft" else gen(a)
