"""The tiny random models of test_hf.py, and its second process: given the
daemon's socket, a model, a dtype, a seed and the token ids, it builds the
same model (torch.manual_seed before construction, on the CPU), restores the
longest stored prefix through primecache.hf and writes what it computed
from there (the covered length, the logits of the remaining tokens, greedy
generate's tokens, the weights digest) to a file with torch.save.

    python3 hf_worker.py SOCKET MODEL DTYPE SEED TOKENS_JSON OUT
"""

import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# Tiny configs, one per layer type primecache.hf stores (checked on
# transformers 5.17): qwen3_next and kimi_linear alternate LinearAttentionLayer
# and DynamicLayer (kimi's MLA keys are the kv latent, its values k_rot);
# deepseek_v32 has DynamicIndexedLayer (indexer keys; index_topk 8 < the
# prompt, so the sparse selection matters); gemma3_text alternates
# DynamicSlidingWindowLayer (window 8 < the prompt) and DynamicLayer;
# falcon_h1 has LinearAttentionAndFullAttentionLayer (mamba2 and attention).
CONFIGS = {
    "qwen3_next": dict(num_key_value_heads=2, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       full_attention_interval=2, decoder_sparse_step=1),
    "kimi_linear": dict(num_key_value_heads=4, moe_intermediate_size=32, num_local_experts=4, num_experts=4,
                        num_experts_per_tok=2, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                        v_head_dim=16, linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
                        linear_attn_config={"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4},
                        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
    "deepseek_v32": dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                         head_dim=8, index_topk=8, index_head_dim=16, index_n_heads=2, first_k_dense_replace=1,
                         n_group=1, topk_group=1),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=16, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
    "falcon_h1": dict(num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                      mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=8),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_config(model_type: str, **overrides):
    kw = {**BASE, **CONFIGS[model_type], **overrides}
    if model_type == "gemma3_text" and "num_hidden_layers" in overrides:
        kw["layer_types"] = kw["layer_types"][:overrides["num_hidden_layers"]]
    if model_type == "kimi_linear" and "num_hidden_layers" in overrides:
        kw["layer_types"] = kw["layer_types"][:overrides["num_hidden_layers"]]
    try:
        return AutoConfig.for_model(model_type, **kw)
    except Exception:  # a strict config refuses fields it does not know: keep those it knows
        default = AutoConfig.for_model(model_type)
        return AutoConfig.for_model(model_type, **{k: v for k, v in kw.items() if hasattr(default, k)})


def make_model(model_type: str, dtype: torch.dtype, seed: int = 0, **overrides):
    """The same weights in every process for the same arguments: seeded,
    initialised on the CPU, then cast and moved."""
    config = make_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype).to(device()).eval()


def main(socket, model_type, dtype_name, seed, tokens_path, out):
    import primecache
    import primecache.hf

    with open(tokens_path) as f:
        ids = torch.tensor([json.load(f)], dtype=torch.long, device=device())
    model = make_model(model_type, DTYPES[dtype_name], int(seed))
    with primecache.connect(socket, timeout=30.0) as client:
        store = primecache.hf.CacheStore(client, model)
        with torch.no_grad():
            cache, covered = store.lookup(ids)
            result = {"covered": covered, "weights_digest": (store.fingerprint.weights_digest.hi,
                                                             store.fingerprint.weights_digest.lo)}
            if cache is not None:
                result["logits"] = model(ids[:, covered:], past_key_values=cache, use_cache=True).logits.cpu()
                again, _ = store.lookup(ids)
                result["generated"] = model.generate(ids, past_key_values=again, max_new_tokens=4,
                                                     do_sample=False).cpu()
    torch.save(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:7])
