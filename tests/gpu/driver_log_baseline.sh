#!/usr/bin/env bash
# Which lines of the driver's error log (CUDA_LOG_FILE) a PyTorch run writes WITHOUT the
# library: a few ResNet-50 steps (forward and backward: the autograd engine's thread) under the
# caching allocator and under the stream-ordered backend (what isolate mode switches PyTorch
# to), each error line counted by the call it names. What the model set's logs show beyond
# these is the library's.
#   bash tests/gpu/driver_log_baseline.sh      (on the GPU machine; writes $OUT/driver_log_*.log)
set -u
OUT=${OUT:-/tmp/isolate-gpu-out}
mkdir -p "$OUT"
for conf in caching backend:cudaMallocAsync; do
    log="$OUT/driver_log_${conf%%:*}.log"
    env -u LD_PRELOAD CUDA_LOG_FILE="$log" PYTORCH_CUDA_ALLOC_CONF=$([ "$conf" = caching ] || echo "$conf") \
        python3 -c '
import torch, torchvision
m = torchvision.models.resnet50().cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(8, 3, 64, 64, device="cuda")
for _ in range(3):
    opt.zero_grad(); m(x).sum().backward(); opt.step()
torch.cuda.synchronize()
print("ok", torch.cuda.memory.get_allocator_backend())'
    echo "== $conf: $(grep -c '\]\[E\]' "$log" 2>/dev/null || echo 0) error lines"
    grep -o 'from cu[A-Za-z_0-9]*' "$log" 2>/dev/null | sort | uniq -c | sort -rn | head
done
