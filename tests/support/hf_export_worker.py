"""Load loopline exports with transformers alone, in a process where loopline cannot be
imported, and answer with their logits, generations and loading info.

Run as ``python hf_export_worker.py REQUEST.json ANSWER.json``. The request lists exports
(``{"dir", "ids", "loops", "generate", "cache"}``, or ``{"dir", "gate"}`` for the learned
exit gate: :func:`_gate_answer`); any import of ``pipeline_lib`` fails here (a
meta-path finder refuses it and src/ directories are dropped from sys.path), and the answer
records that it never got into ``sys.modules``.
"""

from __future__ import annotations

import importlib.abc
import json
import sys


class _NoLoopline(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pipeline_lib" or name.startswith("pipeline_lib."):
            raise ModuleNotFoundError(f"loopline is not installed here (import of {name})")
        return None


def _answer(item: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if "gate" in item:
        return _gate_answer(item["dir"], item["gate"])

    model, info = AutoModelForCausalLM.from_pretrained(
        item["dir"], trust_remote_code=True, output_loading_info=True, dtype=torch.float32)
    model.eval()
    ids = torch.tensor(item["ids"])
    out = {"class": type(model).__name__, "config_loops": model.config.num_loops,
           "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
           "logits": {}}
    with torch.no_grad():
        out["default_logits"] = model(ids).logits.tolist()
        for h in item["loops"]:
            out["logits"][str(h)] = model(ids, num_loops=h).logits.tolist()
    if item.get("generate"):
        tok = AutoTokenizer.from_pretrained(item["dir"])
        gen = item["generate"]
        prompt = tok(gen["prompt"], return_tensors="pt")
        new = model.generate(**prompt, num_loops=gen["loops"], max_new_tokens=gen["max_new"],
                             do_sample=False)[0, prompt["input_ids"].shape[1]:]
        out["generated_ids"] = new.tolist()
        out["generated_text"] = tok.decode(new, skip_special_tokens=True)
        out["prompt_ids"] = prompt["input_ids"][0].tolist()
    if item.get("cache"):
        out["cache"] = _cache_answer(model, AutoTokenizer.from_pretrained(item["dir"]),
                                     item["cache"])
    return out


def _cache_answer(model, tok, ask: dict) -> dict:
    """generate() with the model's KV cache against use_cache=False on a left-padded batch
    (greedy at each loop count, beam search, seeded sampling), and the logits of the cached
    steps against one forward pass over the finished sequences."""
    import torch

    tok.padding_side = "left"
    enc = tok(ask["prompts"], return_tensors="pt", padding=True)
    new = ask["max_new"]

    def both(seed: int = 0, **kw) -> bool:
        runs = []
        for use_cache in (True, False):
            torch.manual_seed(seed)
            runs.append(model.generate(**enc, max_new_tokens=new, use_cache=use_cache, **kw))
        return torch.equal(*runs)

    same = {f"greedy_{h}": both(num_loops=h, do_sample=False) for h in ask["loops"]}
    same["beam"] = both(num_loops=ask["loops"][0], num_beams=3, do_sample=False)
    same["sample"] = both(seed=1, num_loops=ask["loops"][0], do_sample=True, top_p=0.9)
    gen = model.generate(**enc, num_loops=ask["loops"][0], max_new_tokens=new, do_sample=False,
                         eos_token_id=None, return_dict_in_generate=True, output_logits=True)
    mask = torch.cat([enc["attention_mask"], enc["attention_mask"].new_ones(len(enc["input_ids"]),
                                                                              new)], dim=1)
    with torch.no_grad():
        full = model(gen.sequences, attention_mask=mask, num_loops=ask["loops"][0]).logits
    start = enc["input_ids"].shape[1] - 1
    diff = (torch.stack(gen.logits, dim=1) - full[:, start:start + new]).abs().max()
    return {"identical": same, "cache_class": type(gen.cache).__name__,
            "cached_tokens": gen.cache.get_seq_length(), "max_logit_diff": diff.item()}


def _gate_answer(export: str, ask: dict) -> dict:
    """Under ``exit_threshold``: forward's logits and exit loops at each (loops, threshold) of
    ``ask["forward"]``; and for each (loops, threshold, kv_fill) of ``ask["generate"]``,
    greedy cached generate() on left-padded ``prompts`` (its texts, and the loops of each new
    token read from the returned cache), the same without the cache (texts, and the exit loops
    of a forward pass over its sequences), beam search and seeded sampling through the cache,
    and generate() without arguments on the model loaded with that threshold as its config
    default."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(**kw):
        return AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True,
                                                    dtype=torch.float32, **kw).eval()

    model, tok = load(), AutoTokenizer.from_pretrained(export)
    ids = torch.tensor(ask["ids"])
    with torch.no_grad():
        forward = [model(ids, num_loops=h, exit_threshold=t) for h, t in ask["forward"]]
    out = {"forward": [{"logits": o.logits.tolist(), "exit_loops": o.exit_loops.tolist()}
                       for o in forward], "generate": []}
    tok.padding_side = "left"
    enc = tok(ask["prompts"], return_tensors="pt", padding=True)
    new, start = ask["max_new"], enc["input_ids"].shape[1]

    def gen(seed: int = 0, **kw):
        torch.manual_seed(seed)
        return model.generate(**enc, max_new_tokens=new, **kw)

    for h, t, fill in ask["generate"]:
        depth = {"num_loops": h, "exit_threshold": t}
        run = gen(**depth, kv_fill=fill, do_sample=False, return_dict_in_generate=True)
        window = gen(**depth, do_sample=False, use_cache=False)
        mask = torch.cat([enc["attention_mask"], torch.ones_like(window[:, start:])], dim=1)
        with torch.no_grad():
            full = model(window, attention_mask=mask, **depth)
        beam = gen(**depth, kv_fill=fill, num_beams=3, do_sample=False)
        sample = gen(1, **depth, kv_fill=fill, do_sample=True, top_p=0.9)
        default = load(num_loops=h, exit_threshold=t).generate(**enc, max_new_tokens=new,
                                                               do_sample=False, kv_fill=fill)
        out["generate"].append({
            "texts": tok.batch_decode(run.sequences[:, start:], skip_special_tokens=True),
            "exit_loops": run.cache.exit_loops[:, start - 1:].tolist(),
            "cache": [type(run.cache).__name__, run.cache.num_loops, run.cache.kv_fill],
            "window_texts": tok.batch_decode(window[:, start:], skip_special_tokens=True),
            "window_exit_loops": full.exit_loops[:, start - 1:start - 1 + new].tolist(),
            "beam_shape": list(beam.shape), "sample_shape": list(sample.shape),
            "default_is_explicit": torch.equal(default, run.sequences)})
    return out


def main(request_path: str, answer_path: str) -> None:
    sys.meta_path.insert(0, _NoLoopline())
    sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("/src")]
    request = json.loads(open(request_path).read())
    answers = [_answer(item) for item in request["exports"]]
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "pipeline_lib")
    with open(answer_path, "w") as fh:
        json.dump({"answers": answers, "pipeline_lib_modules": loaded}, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
