"""Top CUDA kernels of PyTorch's MiniLM forward (fp32, TF32 off), to compare
per-kernel device time with `RLX_CUDA_PROFILE=1 rlx bench --device cuda`.

    python3 bench/gpu_torch_profile.py --model-dir DIR --batch 32 --seq 128
"""
import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpu_minilm import build_model, inputs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(a.model_dir)
    ids, tt, mask = inputs(a.batch, a.seq)
    with torch.inference_mode():
        for _ in range(5):
            model(ids, tt, mask)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                model(ids, tt, mask)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
