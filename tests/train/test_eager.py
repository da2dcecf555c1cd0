"""Eager-only optimizers skip torch's ``torch._dynamo`` import and keep torch's arithmetic.

Each check runs in a fresh interpreter: ``torch._dynamo`` stays imported once anything in
the test process (another test, a compile) has imported it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from trainer_helpers import PROJECT_ROOT, config_file, make_pack

from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.train.eager import EagerAdamW
from pipeline_lib.train.optim import build_optimizer

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT_ROOT / "src")}


def _fresh_python(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=ENV,
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eager_adamw_matches_torch_adamw_without_importing_dynamo():
    result = _fresh_python("""
        import copy, json, sys, torch
        from torch import nn
        from pipeline_lib.spec.config import TrainConfig
        from pipeline_lib.train.optim import build_optimizer

        def train(model, opt, steps, first=0):
            for i in range(first, first + steps):
                x = torch.randn(16, 6, generator=torch.Generator().manual_seed(i))
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 12), nn.LayerNorm(12), nn.Linear(12, 3))
        reference = copy.deepcopy(model)
        cfg = TrainConfig(lr=1e-2, weight_decay=0.1, eps=1e-6)
        opt = build_optimizer(model, cfg)
        train(model, opt, 3)
        resumed = build_optimizer(model, cfg)       # state_dict / load_state_dict round trip
        resumed.load_state_dict(opt.state_dict())
        train(model, resumed, 2, first=3)
        dynamo = "torch._dynamo" in sys.modules

        twin = dict(zip(model.parameters(), reference.parameters()))
        plain = torch.optim.AdamW(
            [{**g, "params": [twin[p] for p in g["params"]]} for g in opt.param_groups],
            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
        train(reference, plain, 5)
        same = all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
        print(json.dumps({"type": type(opt).__name__, "dynamo_imported": dynamo,
                          "bit_identical": same}))
    """)
    assert result == {"type": "EagerAdamW", "dynamo_imported": False, "bit_identical": True}


def test_compile_keeps_torchs_own_optimizer():
    model = torch.nn.Linear(3, 3)
    assert type(build_optimizer(model, TrainConfig(compile=True))) is torch.optim.AdamW
    assert type(build_optimizer(model, TrainConfig())) is EagerAdamW


def test_muon_steps_and_round_trips_without_importing_dynamo():
    result = _fresh_python("""
        import json, sys, torch
        from pipeline_lib.spec.config import ModelConfig, TrainConfig
        from pipeline_lib.model.looped import LoopedLM
        from pipeline_lib.train.optim import build_optimizer

        model = LoopedLM(ModelConfig(vocab_size=40, d_model=16, n_heads=2, moe_experts=2))
        opt = build_optimizer(model, TrainConfig(optimizer="muon"))
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            opt.step()
            opt.load_state_dict(opt.state_dict())
            opt.zero_grad()
        print(json.dumps({"inner": type(opt._adamw).__name__,
                          "dynamo_imported": "torch._dynamo" in sys.modules}))
    """)
    assert result == {"inner": "EagerAdamW", "dynamo_imported": False}
    compiled = build_optimizer(torch.nn.Linear(3, 3), TrainConfig(optimizer="muon", compile=True))
    assert type(compiled._adamw) is torch.optim.AdamW


def test_a_training_segment_never_imports_dynamo(tmp_path):
    """The CLI segment (restore, steps, validation, samples, save) stays dynamo-free: the
    import costs about 1.1 s of the 3 s a segment may spend outside its steps."""
    pack = make_pack(tmp_path / "data")
    cfg = config_file(tmp_path / "config.yaml")
    out = tmp_path / "run" / "snapshots" / "step_0000002"
    result = _fresh_python(f"""
        import json, sys
        from pipeline_lib.cli import main
        rc = main(["train", "--config", {str(cfg)!r}, "--data", {str(pack)!r},
                   "--resume-from", "none", "--until-step", "2", "--out", {str(out)!r}])
        print(json.dumps({{"rc": rc, "dynamo_imported": "torch._dynamo" in sys.modules}}))
    """)
    assert result == {"rc": 0, "dynamo_imported": False}
    assert (out / "MANIFEST.json").exists()
