"""Cells of the SmolLM2 accuracy table on the CPU: calibrate the bf16 model as the table does, then
evaluate the calibration's own simulation (FakeQuantLinear, bit-exact to the CPU reference ops)
with float32 compute, as bf16 matmuls are ~10x slower on the CPU. The float model is the bf16
weights in float32 compute. The model is cast with Module.to, so RoPE's inv_freq is bf16-rounded
for the float model and every cell alike. BASE_PPL skips re-measuring the float model.

    OMP_NUM_THREADS=2 python docs/accuracy/cpu_float32_cells.py W4A8_G128:sq+gptq-mse W4A8_G128:sq+gptq
"""

import copy
import os
import sys
import time
import warnings

import torch

from qfuse.calibration import calibration_batches, parse_recipe
from qfuse.eval.perplexity import default_text, perplexity, windows_of
from qfuse.models import load_smollm2
from qfuse.quantize_model import quantize_with_simulation

torch.manual_seed(0)
model, tok = load_smollm2()
ids = torch.tensor(tok(default_text(), add_special_tokens=False)["input_ids"])
windows = windows_of(ids, 512)
data = list(calibration_batches(tok, 128, 512).split(8))
base = copy.deepcopy(model).to(torch.bfloat16)
t = time.perf_counter()
b = float(os.environ["BASE_PPL"]) if "BASE_PPL" in os.environ else perplexity(copy.deepcopy(base).float(), windows, progress=False).ppl
print(f"windows {windows.shape[0]}; bf16 weights, float32 compute: {b:.4f} ({time.perf_counter() - t:.0f} s)", flush=True)
for scheme, recipe in [(s.split(":")[0], s.split(":")[1]) for s in sys.argv[1:]]:
    t = time.perf_counter()
    steps = parse_recipe(recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, sim = quantize_with_simulation(copy.deepcopy(base), scheme, calibration=steps, calibration_data=data if steps else None, progress=False)
    tc = time.perf_counter() - t
    p = perplexity(sim.float(), windows, progress=False).ppl
    print(f"{scheme} {recipe}: {p:.4f} delta {100 * (p / b - 1):+.2f} % (calibrate {tc:.0f} s, total {time.perf_counter() - t:.0f} s)", flush=True)
