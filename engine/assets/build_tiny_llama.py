"""Rebuild the bundled ``tiny-llama`` checkpoint (kept in the repo; run once, offline, about a minute on a CPU).

A byte-level BPE tokenizer trained on the sentences below and the ``tiny-llama`` preset's shape, trained for a
few hundred steps on the same sentences so that the demo prints recognizable text rather than noise.

    python -m engine.assets.build_tiny_llama
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Dynamic SplitFuse splits long prompts into chunks and fuses them with decodes.",
    "Every forward pass carries the same number of tokens, the token budget.",
    "A paged KV cache stores keys and values in fixed-size blocks.",
    "Continuous batching lets new requests join while others are still generating.",
    "The scheduler decides what the next forward pass contains.",
    "The simulator runs the same scheduler code as the engine.",
    "Once upon a time there was a small language model that loved to serve tokens.",
    "Hello, world! This is splitfuse, a tiny serving engine.",
    "Prefix caching reuses the blocks of a shared prompt prefix.",
    "When memory runs out, the newest request is preempted and recomputed later.",
    "The cat sat on the mat and watched the GPU fans spin.",
]
SEED = 0
STEPS = 400


# A plain template so the chat endpoint renders messages the way a real chat model's tokenizer does.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" \
    "{% if add_generation_prompt %}assistant:{% endif %}"


def build(out_dir: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from engine.presets import PRESETS

    preset = dict(PRESETS["tiny-llama"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=preset["vocab_size"], special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE

    torch.manual_seed(SEED)
    config = transformers.AutoConfig.for_model(preset.pop("model_type"), **preset, pad_token_id=0,
                                               tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = [tokenizer(s)["input_ids"] + [tokenizer.eos_token_id] for s in CORPUS]
    width = max(map(len, ids))
    batch = torch.tensor([x + [0] * (width - len(x)) for x in ids])
    labels = batch.masked_fill(batch == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(STEPS):
        loss = model(input_ids=batch, attention_mask=(batch != 0).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final training loss {loss.item():.3f}")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    build(Path(__file__).parent / "tiny-llama")
