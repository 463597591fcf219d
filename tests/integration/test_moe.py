#!/usr/bin/env python3
"""Mixture-of-experts models (engine/model/moe.c, docs/moe.md) against Hugging
Face transformers on the CPU.

1. Parity: tiny random Mixtral and Qwen3-MoE checkpoints written here by
   transformers itself (save_pretrained, float32): paged's CPU backend in
   exact mode (build/tests/tools/dump_logits) computes the next-token logits
   of a few prompts, transformers computes them with torch in float32; they
   must agree within 1e-4 relative (||paged - hf|| / ||hf||) with the same
   argmax. Variants: Mixtral (8 experts, top 2, always renormalised);
   Qwen3-MoE (16 experts, top 4, norm_topk_prob, q/k norms); Qwen3-MoE with
   norm_topk_prob off and decoder_sparse_step 2 (dense layers between the
   MoE ones); Qwen3-MoE with mlp_only_layers [0, 2] (the dense MLP in the
   listed layers, the experts in layer 1).
2. GGUF: the same Mixtral and Qwen3-MoE weights written as llama.cpp lays
   them out (gguf-py: arch "llama" with expert_count for Mixtral, Q/K rows
   permuted as convert_hf_to_gguf.py does; "qwen3moe"; every layer's experts
   stacked in one `ffn_{gate,up,down}_exps` tensor and the router in
   `ffn_gate_inp`) give the safetensors logits within 1e-5 relative, and
   with --tp 2 --ep (a rank's experts a block of the stacked rows) within
   1e-5 of the largest logit.
3. Tensor parallelism: --tp 2 and --tp 4 (each rank a slice of every
   expert's columns, the router whole) give the logits of --tp 1 within
   1e-5 of the largest logit, same argmax; so do --tp 2 and --tp 4 with
   expert parallelism (dump_logits --ep, --enable-expert-parallel: each
   rank n_experts / tp whole experts, the others never read), on the
   checkpoints and on random weights of the Qwen3-MoE shape; and expert
   parallelism with its combine by all-to-all (dump_logits --a2a,
   --all2all-backend alltoall: each row's shares to the rank owning the
   row) gives the all-reduce combine's logits bit for bit.
4. `paged plan` of the Qwen3-30B-A3B shape (tests/gpu/qwen3-30b-a3b-shape.json,
   dummy weights, an H200's 141 GB): 30.5 B parameters, 3.35 B active
   (Qwen's published 30.5 B / 3.3 B), weights = 2 bytes x every parameter;
   with --enable-expert-parallel --tp 2: 64 experts per rank, and a rank's
   weights those of --tp 2 without it (half of every expert's bf16 bytes
   and half of 128 whole experts are the same bytes), both rank-1/2 of the
   experts' 2 x 48 x 128 x 3 x 2048 x 768 bytes below --tp 1.
5. Errors, one line naming the file and the reason: a missing expert
   tensor (under --tp 2 --ep named by rank 1 alone, the rank holding it:
   the other never looks it up); mlp_only_layers naming a layer the model
   does not have;
   an expert width that --tp does not divide; experts that --tp does not
   divide under expert parallelism; --a2a without --ep.
6. --cpu-offload-gb (engine/model/model_offload.c): a layer's router and
   experts travel with it; the logits with one layer and with every layer
   offloaded equal those without bit for bit (the CPU backend runs each op
   when called, so a copy landing early or a weight pointed at the wrong
   offset would show), with and without --tp 2 --ep.

Skipped (exit 77) when torch or transformers are not importable.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4

try:
    import hf_util as hu  # numpy, torch, transformers
    import numpy as np
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the quickstart installs them; say so when missing
    print(f"SKIP: transformers/torch not importable ({e})")
    sys.exit(77)

COMMON = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=312,
              max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2, tie_word_embeddings=False)

VARIANTS = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=96, num_local_experts=8, num_experts_per_tok=2,
                                      rope_theta=1000000.0, sliding_window=None)),
    "qwen3moe": ("Qwen3MoeConfig", dict(intermediate_size=160, moe_intermediate_size=48, num_experts=16,
                                        num_experts_per_tok=4, norm_topk_prob=True, head_dim=32,
                                        rope_theta=1000000.0, use_sliding_window=False)),
    "qwen3moe-sparse2": ("Qwen3MoeConfig", dict(intermediate_size=160, moe_intermediate_size=48, num_experts=16,
                                                num_experts_per_tok=4, norm_topk_prob=False,
                                                decoder_sparse_step=2, head_dim=16, rope_theta=10000.0,
                                                use_sliding_window=False)),
    "qwen3moe-mlponly": ("Qwen3MoeConfig", dict(intermediate_size=160, moe_intermediate_size=48, num_experts=8,
                                                num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0, 2],
                                                head_dim=16, rope_theta=10000.0, use_sliding_window=False)),
}

PROMPTS = [[1, 17, 5, 230, 99, 42, 7, 310, 8], list(range(3, 3 + 70, 3)), [250] * 5 + [11, 12, 13]]


def make_checkpoint(kind, extra, path, seed):
    return hu.make_checkpoint(getattr(transformers, kind)(**COMMON, **extra), path, seed)


# --- GGUF as llama.cpp writes it ---------------------------------------------------

def permute(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute: rows of each head interleaved
    # for llama.cpp's RoPE (paged puts them back at load).
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(name, hf_dir, out):
    import gguf
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    sd = {k: v.numpy() for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    mixtral = cfg["model_type"] == "mixtral"
    arch = "llama" if mixtral else "qwen3moe"
    w = gguf.GGUFWriter(out, arch)
    H, L, nh, nkv = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    n_exp = cfg.get("num_local_experts", cfg.get("num_experts"))  # transformers 5 writes the first for both
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if mixtral:
        w.add_feed_forward_length(cfg["intermediate_size"])
    else:
        hd = cfg["head_dim"]
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    for l in range(L):
        p = f"model.layers.{l}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if mixtral:
            q, k = permute(q, nh), permute(k, nkv)
        w.add_tensor(f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{l}.attn_q.weight", q)
        w.add_tensor(f"blk.{l}.attn_k.weight", k)
        w.add_tensor(f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        if not mixtral:
            w.add_tensor(f"blk.{l}.attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            w.add_tensor(f"blk.{l}.attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        w.add_tensor(f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        moe = "block_sparse_moe." if mixtral else "mlp."
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        w.add_tensor(f"blk.{l}.ffn_gate_inp.weight", sd[p + moe + "gate.weight"])
        for g, hf in zip(("gate", "up", "down"), names):
            stacked = np.stack([sd[f"{p}{moe}experts.{e}.{hf}.weight"] for e in range(n_exp)])
            w.add_tensor(f"blk.{l}.ffn_{g}_exps.weight", stacked)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    failed = []
    worst = {}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for i, (name, (kind, extra)) in enumerate(VARIANTS.items()):
            path = os.path.join(tmp, name)
            model = make_checkpoint(kind, extra, path, seed=101 + i)
            dirs[name] = path
            for ids in PROMPTS:
                ref = hu.hf_logits(model, ids)
                arch, got = hu.paged_logits([path], ids)
                err = hu.rel(got, ref)
                same = hu.same_argmax(got, ref)
                worst[name] = max(worst.get(name, 0.0), err)
                print(f"{name:17s} ({arch:8s}) {len(ids):3d} tokens: rel err {err:.2e}, argmax "
                      f"{'equal' if same else 'DIFFERS'}")
                if not (err < TOL and same):
                    failed.append(("parity", name, len(ids), err))

        # 2. GGUF: llama.cpp's layout of the same weights.
        try:
            import gguf  # noqa: F401
            have_gguf = True
        except ImportError:
            have_gguf = False
            print("gguf-py not importable: the GGUF check is left out")
        for name in ("mixtral", "qwen3moe") if have_gguf else ():
            out = os.path.join(tmp, name + ".gguf")
            write_gguf(name, dirs[name], out)
            for ids in PROMPTS[:2]:
                _, a = hu.paged_logits([dirs[name]], ids)
                arch, b = hu.paged_logits([out], ids)
                err = hu.rel(b, a)
                print(f"{name:17s} gguf ({arch}) vs safetensors {len(ids):3d} tokens: rel err {err:.2e}")
                if not (err < 1e-5 and hu.same_argmax(b, a)):
                    failed.append(("gguf", name, len(ids), err))
            # Expert parallelism on the stacked tensors: a rank's experts are one block of rows.
            _, b = hu.paged_logits([out], PROMPTS[0], tp=2, ep=True)
            _, a = hu.paged_logits([dirs[name]], PROMPTS[0])
            err = hu.max_diff(b, a)
            print(f"{name:17s} gguf --tp 2 --ep vs safetensors --tp 1: max diff {err:.1e} of the largest logit")
            if not (err < 1e-5 and hu.same_argmax(b, a)):
                failed.append(("gguf ep", name, err))

        # 3. Tensor parallelism, experts split by columns and (--ep) whole.
        for name in VARIANTS:
            ids = PROMPTS[0]
            _, a = hu.paged_logits([dirs[name]], ids)
            for tp, ep in ((2, False), (4, False), (2, True), (4, True)):
                _, b = hu.paged_logits([dirs[name]], ids, tp=tp, ep=ep)
                err = hu.max_diff(b, a)
                what = f"--tp {tp}{' --ep' if ep else ''}"
                print(f"{name:17s} {what:10s} vs --tp 1: max diff {err:.1e} of the largest logit")
                if not (err < 1e-5 and hu.same_argmax(b, a)):
                    failed.append(("tp", name, tp, ep, err))
                if ep:
                    # The all-to-all combine adds the same shares in the
                    # same order as the all-reduce: the same logits, bit for bit.
                    _, c = hu.paged_logits([dirs[name]], ids, tp=tp, ep=True, a2a=True)
                    same = bool(np.array_equal(c, b))
                    print(f"{name:17s} {what + ' --a2a':16s} vs {what}: {'identical' if same else 'DIFFERENT'} "
                          f"(max diff {hu.max_diff(c, b):.1e})")
                    if not same:
                        failed.append(("a2a", name, tp, hu.max_diff(c, b)))
        # Random weights: a rank's experts have the values they have at --tp 1
        # (the loader keys each expert's values by its id, not by load order).
        dummy = ["--dummy", os.path.join(dirs["qwen3moe"], "config.json")]
        _, a = hu.paged_logits(dummy, PROMPTS[0])
        for tp in (2, 4):
            _, b = hu.paged_logits(dummy, PROMPTS[0], tp=tp, ep=True)
            err = hu.max_diff(b, a)
            print(f"qwen3moe dummy    --tp {tp} --ep vs --tp 1: max diff {err:.1e} of the largest logit")
            if not (err < 1e-5 and hu.same_argmax(b, a)):
                failed.append(("tp dummy", tp, err))

        # 4. The plan of the Qwen3-30B-A3B shape.
        shape = os.path.join(hu.ROOT, "tests/gpu/qwen3-30b-a3b-shape.json")

        def plan(*flags):
            p = subprocess.run([os.path.join(hu.ROOT, "build/paged"), "plan", "--load-format", "dummy", "--hf-config",
                                shape, "--device-memory", "141G", "--json", *flags], capture_output=True, text=True,
                               timeout=60)
            assert p.returncode == 0, p.stderr
            return json.loads(p.stdout)

        j = plan()
        tot, act, wb = j["model"]["params_total"], j["model"]["params_active"], j["plan"]["ranks"][0]["weights_bytes"]
        print(f"plan qwen3-30b-a3b-shape: {tot / 1e9:.2f} B parameters, {act / 1e9:.2f} B active, weights "
              f"{wb / 2**30:.2f} GiB, {j['model']['n_experts']} experts")
        if not (30.4e9 < tot < 30.6e9 and 3.3e9 < act < 3.4e9 and abs(wb - 2 * tot) < 1e6
                and j["model"]["n_experts"] == 128 and j["model"]["n_experts_used"] == 8):
            failed.append(("plan", tot, act, wb))
        # Expert parallelism: per rank, 64 whole experts instead of half of every
        # one's columns: the same bytes (bf16), half the experts' below --tp 1.
        tp2, ep2 = plan("-tp", "2"), plan("-tp", "2", "--enable-expert-parallel")
        w2, we = (x["plan"]["ranks"][0]["weights_bytes"] for x in (tp2, ep2))
        experts = 2 * 48 * 128 * 3 * 2048 * 768
        print(f"plan qwen3-30b-a3b-shape --tp 2: weights per rank {w2 / 2**30:.2f} GiB; with "
              f"--enable-expert-parallel {we / 2**30:.2f} GiB, {ep2['model']['experts_per_rank']} experts per rank; "
              f"--tp 1 minus --tp 2 {(wb - we) / 2**30:.2f} GiB (experts' half {experts / 2 / 2**30:.2f} GiB)")
        if not (we == w2 and ep2["model"]["experts_per_rank"] == 64 and tp2["model"]["experts_per_rank"] == 128
                and wb - we >= experts // 2 and all(r["weights_bytes"] == we for r in ep2["plan"]["ranks"])):
            failed.append(("plan ep", w2, we))

        # 5. Errors: one line naming the file and the reason.
        def refused(args, want, what, tp=1):
            p = hu.dump(args, PROMPTS[0], tp=tp)
            lines = p.stderr.strip().splitlines()
            ok = p.returncode != 0 and len(lines) == 1 and all(w in lines[0] for w in want)
            print(f"refused, {what}: {lines[-1] if lines else '(nothing)'}")
            if not ok:
                failed.append(("error", what, p.returncode, p.stderr))

        broken = os.path.join(tmp, "broken")
        os.makedirs(broken)
        for f in ("config.json",):
            with open(os.path.join(dirs["mixtral"], f)) as src, open(os.path.join(broken, f), "w") as dst:
                dst.write(src.read())
        sd = load_file(os.path.join(dirs["mixtral"], "model.safetensors"))
        gone = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
        del sd[gone]
        save_file(sd, os.path.join(broken, "model.safetensors"), metadata={"format": "pt"})
        refused([broken], [broken, gone, "missing"], "a missing expert tensor")
        # Expert parallelism: only the rank holding expert 5 (rank 1 of 2:
        # experts 4-7) looks for its tensors; rank 0 never does (the executor
        # names the lowest rank that failed: rank 0 without --ep).
        refused([broken, "--ep"], ["rank 1:", gone, "missing"], "a missing expert tensor, --tp 2 --ep", tp=2)

        only = os.path.join(tmp, "mlp-only")
        os.makedirs(only)
        cfg = json.load(open(os.path.join(dirs["qwen3moe"], "config.json")))
        cfg["mlp_only_layers"] = [0, 3]  # a 3-layer model
        json.dump(cfg, open(os.path.join(only, "config.json"), "w"))
        refused([only], ["config.json", "mlp_only_layers", "below 3"], "mlp_only_layers past the last layer")
        odd = os.path.join(tmp, "odd-experts.json")
        cfg = json.load(open(os.path.join(dirs["qwen3moe"], "config.json")))
        cfg.update(num_attention_heads=8, num_key_value_heads=8, head_dim=8, moe_intermediate_size=44)
        json.dump(cfg, open(odd, "w"))
        refused(["--dummy", odd], ["tensor parallel size 8", "experts' FFN width 44"], "--tp 8, experts of 44",
                tp=8)
        cfg.update(moe_intermediate_size=48, num_experts=12)
        cfg.pop("num_local_experts", None)
        json.dump(cfg, open(odd, "w"))
        refused(["--dummy", odd, "--ep"], ["--enable-expert-parallel", "tensor parallel size 8", "12 experts"],
                "--tp 8 --ep, 12 experts", tp=8)
        refused([dirs["mixtral"], "--a2a"], ["--all2all-backend alltoall", "--enable-expert-parallel"],
                "--tp 2 --a2a without --ep", tp=2)

        # 6. --cpu-offload-gb with experts: 1e-6 GiB moves the first layer, 100 every layer.
        for name in ("mixtral", "qwen3moe-sparse2", "qwen3moe-mlponly"):
            for tp, ep in ((1, False), (2, True)):
                _, a = hu.paged_logits([dirs[name]], PROMPTS[1], tp=tp, ep=ep)
                for gb in ("0.000001", "100"):
                    p = hu.dump([dirs[name], "--cpu-offload-gb", gb], PROMPTS[1], tp=tp, ep=ep)
                    ok = p.returncode == 0 and "cpu offload: layers 0-" in p.stderr
                    b = np.array(json.loads(p.stdout)["logits"]) if ok else None
                    same = ok and np.array_equal(a, b)
                    # Every layer moved: the host copies hold at least the experts (f32 on the CPU).
                    moved = ""
                    if ok and gb == "100" and tp == 1:
                        cfg = json.load(open(os.path.join(dirs[name], "config.json")))
                        n_exp = cfg.get("num_local_experts", cfg.get("num_experts"))
                        width = cfg.get("moe_intermediate_size", cfg["intermediate_size"])
                        step, only = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers", [])
                        moe_layers = sum(1 for l in range(cfg["num_hidden_layers"]) if (l + 1) % step == 0 and l not in only)
                        want = moe_layers * n_exp * 3 * cfg["hidden_size"] * width * 4 / 2**20
                        mib = float(p.stderr.split(" MiB in plain host memory")[0].rsplit(" ", 1)[1])
                        moved = f" ({mib:.2f} MiB moved, experts {want:.2f})"
                        same = same and mib >= want
                    print(f"{name:17s} --cpu-offload-gb {gb:8s} --tp {tp}{' --ep' if ep else '     '}: "
                          f"{'bit for bit' if same else 'DIFFERS ' + p.stderr[-300:]}{moved}")
                    if not same:
                        failed.append(("offload", name, gb, tp))

    print("worst: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print(f"ok: {len(VARIANTS)} MoE variants x {len(PROMPTS)} prompts within {TOL:g} of transformers "
          f"{transformers.__version__}; GGUF, --tp 2/4 (columns and expert parallel), --cpu-offload-gb and the "
          f"errors as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
