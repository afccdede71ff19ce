"""Real small training runs, a few hundred steps in seconds, with fixed seeds.

  --model lm      a 4-layer decoder-only transformer (d=256, 4 heads, seq 128, batch 32,
                  vocabulary 4096), hand-written attention, AdamW, on 8 fixed batches of
                  random tokens (so the loss falls as it memorises them)
  --model resnet  torchvision ResNet-18 (100 classes) on 4 fixed batches of 64 random
                  64x64 images, SGD with momentum

  --model gpt2      transformers GPT2LMHeadModel (GPT2Config defaults, 12 layers), AdamW,
                    batch 8 x 256 tokens, 4 fixed batches (a model no one here wrote)
  --model resnet50  torchvision ResNet-50 (1000 classes), SGD with momentum, batch 32 x 224^2
  --model vit       timm vit_small_patch16_224, AdamW, batch 32 x 224^2

RESULT: the loss of every step, ms/step (median over the timed steps, each timed to
torch.cuda.synchronize), host ms/step (median time until the step's work was queued, before
that wait: near ms/step, the host bounds the step), torch.cuda.max_memory_reserved / max_memory_allocated, and device
memory in use as the driver reports it (torch.cuda.mem_get_info, sampled after every step),
plus the memory-history snapshot's size and dump time with --history.
"""

import argparse
import math
import os
import statistics
import sys
import time

import workload

# Same cuBLAS workspace in every run, whatever the allocator, for reproducible losses.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def build_lm(torch, seed: int):
    nn, F = torch.nn, torch.nn.functional
    vocab, d, heads, layers, seq, batch = 4096, 256, 4, 4, 128, 32

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)
            mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
            self.register_buffer("mask", mask)

        def forward(self, tokens):
            x = self.tok(tokens) + self.pos
            for block in self.blocks:
                x = block(x, self.mask)
            return self.head(self.ln(x))

    torch.manual_seed(seed)
    model = LM().cuda()
    data = torch.randint(0, vocab, (8, batch, seq + 1), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i):
        tokens = data[i % len(data)]
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return model, opt, step


def build_resnet(torch, seed: int):
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet18(weights=None, num_classes=100).cuda()
    images = torch.randn(4, 64, 3, 64, 64, device="cuda")
    labels = torch.randint(0, 100, (4, 64), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(i):
        j = i % len(images)
        return torch.nn.functional.cross_entropy(model(images[j]), labels[j])

    return model, opt, step


def build_gpt2(torch, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    g = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(0, 50257, (8, 256), generator=g).cuda() for _ in range(4)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        x = batches[i % len(batches)]
        return model(input_ids=x, labels=x).loss

    return model, opt, step


def build_images(torch, seed: int, model, classes: int, lr_opt):
    torch.manual_seed(seed)
    model = model.cuda()
    g = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(4, 32, 3, 224, 224, generator=g).cuda()
    labels = torch.randint(0, classes, (4, 32), generator=g).cuda()
    opt = lr_opt(model.parameters())

    def step(i):
        j = i % len(images)
        return torch.nn.functional.cross_entropy(model(images[j]), labels[j])

    return model, opt, step


def build_resnet50(torch, seed: int):
    import torchvision

    torch.manual_seed(seed)
    m = torchvision.models.resnet50(weights=None)
    return build_images(
        torch, seed, m, 1000, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)
    )


def build_vit(torch, seed: int):
    import timm

    torch.manual_seed(seed)
    m = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000)
    return build_images(torch, seed, m, 1000, lambda p: torch.optim.AdamW(p, lr=1e-4))


BUILDERS = {
    "lm": build_lm,
    "resnet": build_resnet,
    "gpt2": build_gpt2,
    "resnet50": build_resnet50,
    "vit": build_vit,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(BUILDERS), required=True)
    parser.add_argument("--steps", type=int, default=200, help="timed steps")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the timed ones")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true",
                        help="torch.use_deterministic_algorithms(True): two runs' losses are then "
                             "equal bit for bit (GPT-2's are not otherwise: atomics in its backward)")
    workload.add_history_args(parser)
    args = parser.parse_args()

    import torch

    torch.backends.cudnn.benchmark = False  # no autotuning: same kernels every run
    torch.backends.cudnn.deterministic = True
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.zeros(1, device="cuda")  # create the context before the first memory reading
    memory = workload.DeviceMemory()
    workload.start_history(args)

    build = BUILDERS[args.model]
    model, opt, loss_of_step = build(torch, args.seed)
    model.train()

    losses, times, host = [], [], []
    total = args.warmup + args.steps
    wall_start = time.perf_counter()
    for i in range(total):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of_step(i)
        loss.backward()
        opt.step()
        queued = time.perf_counter()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
            host.append((queued - start) * 1e3)
        losses.append(loss.detach())
        memory.sample()
    wall = time.perf_counter() - wall_start

    result = {
        "model": args.model,
        "steps": args.steps,
        "warmup": args.warmup,
        "total_steps": total,
        "ms_per_step": statistics.median(times) if times else None,
        # The host's share: the step's work queued, before the wait for the device. Near
        # ms_per_step, the step is bound by the host (the device waits for launches).
        "host_ms_per_step": statistics.median(host) if host else None,
        "train_s": wall,
        "losses": [round(v, 6) for v in torch.stack(losses).float().tolist()],
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        **memory.as_dict(),
    }
    workload.finish_history(args, result)
    workload.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
