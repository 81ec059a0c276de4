"""What the GPU check runs on (`scripts/gpu_check.sh`, its first step): Python, torch, Triton
and their CUDA, the device and its memory, and `nvidia-smi`'s view; exits 1 when the device
asked for is not usable, so the summary says so first.

    python -m scripts.gpu_check_machine cuda|cpu
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys

import torch


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    import triton

    print(f"python {platform.python_version()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, CUDA {torch.version.cuda}")  # fmt: skip
    print(f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    if device == "cuda":
        if not torch.cuda.is_available():
            print("no usable CUDA device: the GPU steps cannot run")
            sys.exit(1)
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        print(f"device: {props.name}, capability {props.major}.{props.minor}, "
              f"{props.multi_processor_count} SMs, {total / 2**30:.1f} GiB "
              f"({free / 2**30:.1f} free), bf16 {torch.cuda.is_bf16_supported()}")  # fmt: skip
        if shutil.which("nvidia-smi"):
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
            print(smi.stdout)
    else:
        print("device: cpu (the check's steps on the CPU, Triton interpreted)")


if __name__ == "__main__":
    main()
