"""
Generation speed with and without the KV cache, per query mode, for 1 and 8 sequences.

    python bench/sample_speed.py                                   # CPU: 4 x 256 model
    python bench/sample_speed.py --size=gpt2 --device=cuda         # GPT-2 small, bf16

GPT.generate() from a random prompt of --prompt_len tokens to --new_tokens more, greedy
(temperature 0), with use_kv_cache True and False taking turns within each round. The
"same tokens" column checks that both produce the identical sequence. tokens/s counts
generated tokens over all sequences: batch * new_tokens / median seconds. The target is
a speed-up of at least 5x for 256 new tokens on the CPU.
"""

import statistics

import torch

from common import DEFAULT_MODES, command_line, header, interleaved, parser, query_modes, resolve_device
from model import GPT, GPTConfig

SIZES = {  # n_layer, n_head, n_embd, block_size
    "cpu": (6, 6, 384, 1024),  # the CPU training benchmark's model
    "gpt2": (12, 12, 768, 1024),
}


def time_generation(model, prompt, new_tokens, rounds, device, autocast):
    """Greedy generation with and without the KV cache, interleaved over rounds.
    Returns ({"cached": [s], "plain": [s]}, whether both produced the same tokens)."""
    out = {}

    def run(use_kv_cache, tokens=new_tokens):
        with torch.no_grad(), autocast:
            out[use_kv_cache] = model.generate(prompt, tokens, temperature=0, use_kv_cache=use_kv_cache)

    run(True, min(new_tokens, 16))  # warm-up (and compilation)
    times = interleaved({"cached": lambda: run(True), "plain": lambda: run(False)}, rounds, device)
    return times, torch.equal(out[True], out[False])


def main():
    p = parser(__doc__.split("\n\n")[1].strip())
    p.add_argument("--size", choices=SIZES, default=None, help="model size; default cpu or gpt2 by device")
    for key in ("n_layer", "n_head", "n_embd", "vocab_size"):
        p.add_argument(f"--{key}", type=int, default=0, help="override the size preset")
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated query modes")
    p.add_argument("--batch_sizes", default="1,8", help="comma-separated numbers of sequences")
    p.add_argument("--prompt_len", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=0, help="timed rounds (default 1 on CPU, 5 on CUDA)")
    args = p.parse_args()
    query_modes(p, args)
    device, dtype, autocast = resolve_device(args)
    cuda = device.startswith("cuda")
    args.size = args.size or ("gpt2" if cuda else "cpu")
    rounds = args.rounds or (5 if cuda else 1)
    n_layer, n_head, n_embd, block_size = SIZES[args.size]
    n_layer, n_head, n_embd = args.n_layer or n_layer, args.n_head or n_head, args.n_embd or n_embd
    vocab_size = args.vocab_size or 50304
    block_size = max(block_size, args.prompt_len + args.new_tokens)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    rows = []
    for mode in args.modes.split(","):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                              vocab_size=vocab_size, query_mode=mode)).to(device).eval()
        if args.compile:  # generate() calls forward, so that is what gets compiled
            model.forward = torch.compile(model.forward, dynamic=True)
        for batch in batch_sizes:
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(0, min(vocab_size, 50257), (batch, args.prompt_len), generator=g)
            prompt = prompt.to(device)
            times, same = time_generation(model, prompt, args.new_tokens, rounds, device, autocast)
            cached, plain = statistics.median(times["cached"]), statistics.median(times["plain"])
            tokens = batch * args.new_tokens
            rows.append(f"| {mode} | {batch} | {tokens / plain:,.0f} | {tokens / cached:,.0f} | {plain / cached:.1f}x "
                        f"| {'yes' if same else 'NO'} |")

    print(header(f"Generation: {n_layer} layers, d={n_embd}, prompt {args.prompt_len} + {args.new_tokens} new tokens, "
                 f"greedy, {rounds} round(s)", device, dtype, args.compile, command_line()))
    print("| query_mode | sequences | tokens/s, no cache | tokens/s, KV cache | speed-up | same tokens |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
