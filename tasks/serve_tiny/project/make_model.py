"""Build the served model from the binding's pinned config and seed (no download: nothing can be).

Run by the serving environment's interpreter (transformers, tokenizers, torch):

    python make_model.py --binding serve.json --out DIR [--reference [--trace trace.jsonl]]

writes a Hugging Face model folder (config.json, model.safetensors, a character-level tokenizer)
and prints {"weights_sha256": ...}. With --reference it also prints the greedy continuations
of the binding's correctness prompts computed by transformers itself (the reference engine) and
the smallest top-1/top-2 logit gap met on the way, which is how the binding's frozen expected
tokens and their margin were made. With --prompts FILE (JSON lines with `text_input` and
`output_length`: the prompts serve_bench.py draws for one arm at run time) it prints each one's
greedy continuation and trusted length the same way (`prompt_token_ids`, `prompt_trusted`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path


def tokenizer(alphabet: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + list(alphabet))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    return fast, len(vocab)


def build(binding: dict, out: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    m = binding["model"]
    fast, vocab_size = tokenizer(m["alphabet"])
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, **m["config"])
    torch.manual_seed(int(m["seed"]))
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    # NB: the engine loads the architecture the binding names (a registered class whose
    # compute the candidate's model file defines); transformers keeps loading it as llama
    conf = json.loads((out / "config.json").read_text())
    conf["architectures"] = [m["architecture"]]
    (out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    return fast, model


def weights_sha256(out: Path) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def reference(binding: dict, fast, model) -> dict:
    import torch

    c = binding["correctness"]
    outs, margin = [], float("inf")
    with torch.no_grad():
        for prompt in c["prompts"]:
            ids = fast(prompt, add_special_tokens=False)["input_ids"]
            x = torch.tensor([ids])
            got = []
            for _ in range(int(c["max_tokens"])):
                logits = model(x).logits[0, -1]
                top = torch.topk(logits, 2)
                margin = min(margin, float(top.values[0] - top.values[1]))
                nxt = int(top.indices[0])
                got.append(nxt)
                x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
            outs.append(got)
    return {"expected_token_ids": outs, "min_logit_margin": margin}


def greedy_rows(binding: dict, fast, model, rows: list[dict]) -> tuple[list, list]:
    """Greedy continuations of `rows` (`text_input`, `output_length` tokens each) by transformers
    itself and, for each, how many leading tokens are trusted: up to the first position whose
    top-1/top-2 logit gap is under the binding's `margin_bound` (past a near-tie exact equality
    is not fair). Decoded with the key/value cache: it moves a logit by ~1e-6, which can flip
    an argmax only where the gap is already far under `margin_bound`, i.e. past the trusted
    length.

    A row with `enough` (an arm's fresh prompts) is skipped, as ids [] and trusted 0, once that
    many rows of its shape (prompt characters, answer tokens) before it were fully trusted: the
    arm draws a pool large enough that a shortage is vanishingly rare, and pays only for the
    rows it needs."""
    import torch

    bound = float(binding["correctness"]["margin_bound"])
    ids_out, trusted = [], []
    full: dict[tuple[int, int], int] = {}
    with torch.no_grad():
        for row in rows:
            shape = (len(row["text_input"]), int(row["output_length"]))
            if "enough" in row and full.get(shape, 0) >= int(row["enough"]):
                ids_out.append([])
                trusted.append(0)
                continue
            x = torch.tensor([fast(row["text_input"], add_special_tokens=False)["input_ids"]])
            got, first_tie, past = [], None, None
            for k in range(int(row["output_length"])):
                out = model(input_ids=x, past_key_values=past, use_cache=True)
                past = out.past_key_values
                top = torch.topk(out.logits[0, -1], 2)
                if first_tie is None and float(top.values[0] - top.values[1]) < bound:
                    first_tie = k
                nxt = int(top.indices[0])
                got.append(nxt)
                x = torch.tensor([[nxt]])
            ids_out.append(got)
            trusted.append(len(got) if first_tie is None else first_tie)
            if first_tie is None:
                full[shape] = full.get(shape, 0) + 1
    return ids_out, trusted


def read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def trace_reference(binding: dict, fast, model, trace_path: Path) -> dict:
    """Every trace request's greedy continuation and trusted length: what the binding's
    `workload.reference_token_ids` and `reference_trusted` hold (re-binding a trace)."""
    ids, trusted = greedy_rows(binding, fast, model, read_rows(trace_path))
    return {"reference_token_ids": ids, "reference_trusted": trusted}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--binding", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--trace", type=Path, help="with --reference: also every trace request's")
    p.add_argument(
        "--prompts", type=Path, help="with --reference: also these prompts' (an arm's fresh ones)"
    )
    args = p.parse_args()
    binding = json.loads(args.binding.read_text())
    fast, model = build(binding, args.out)
    doc = {"weights_sha256": weights_sha256(args.out)}
    if args.reference:
        doc.update(reference(binding, fast, model))
        if args.trace is not None:
            doc.update(trace_reference(binding, fast, model, args.trace))
        if args.prompts is not None:
            ids, trusted = greedy_rows(binding, fast, model, read_rows(args.prompts))
            doc.update(prompt_token_ids=ids, prompt_trusted=trusted)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
