"""
The bytes each of the kernels' ops (nonlinear_queries/ops/kernels.py) reads and writes at GPT-2 small's
shapes, and the time that takes at a GPU's memory bandwidth: the floor of a memory-bound op, beside
the times measured of the inductor kernels each replaces (issue 77; docs/speed.md holds the table).

    python bench/op_bytes.py                       # 96 x 1024 rows (96 x 5's micro-batch), H200's 4.8 TB/s
    python bench/op_bytes.py --rows=12288 --bandwidth=3.35e12   # 12 x 1024 rows, an H100 SXM's 3.35 TB/s

Rows are tokens of one micro-batch (N = micro-batch x block_size); C = n_embd, r = the query's rank, V the
vocabulary. Under bf16 autocast (the GPU's training setting) the fused projection p, h, a, y and the logits
are bf16, x (ln_1's output) and every statistic float32; q comes out bf16 (use_kernels' autocast_out), its
gradient arrives bf16. Counted once: each tensor read or written by the op (a row statistic read by a tile of
rows, or a weight vector read by every program, is counted once: they stay in cache). MB = 10^6 bytes; a
step at 96 x 5 is 12 layers x 5 micro-batches of f's ops and 5 of the cross-entropy's. "issue 65" gives the
bytes of the interface before issue 77 ('-': the same; rms_gelu read x in float32 and wrote a float32 dx, q
came out float32 and the attention cast it, the cross-entropy's backward wrote in place of the logits, which
inductor copied first; its forward wrote each row's log-sum-exp too); the cross-entropy's forward reads each row
twice, the second time from cache (counted once); "measured" quotes the H200 profile of res_gelu at 96 x 5
without the ops (bench/RESULTS.md, 2026-11-29: python bench/train_speed.py --size=gpt2 --compile --device=cuda
--modes=linear,res_gelu --no_mlp475 --splits=96x5 --rounds=4 --profile), whose inductor kernels these
replace, and issue 65's accounting of them; the ops themselves are untimed.
"""

import argparse

BF16, FP32, INT64 = 2, 4, 8


def ops(N, C, R, V):
    """[(op, per step at 12 layers x 5 micro-batches, bytes read, bytes written, issue 65's bytes, measured)] of one
    call each, N rows."""
    layer_calls, loss_calls = 12 * 5, 5
    blocks = -(-N // 32)  # layer_norm_residual's backward: 8 tiles of 4 rows a program, partial sums of each
    return [
        ("rms_statistic (in ln_1's kernel: x in registers there)", layer_calls, 0, N * FP32, 0, "-"),
        ("nlq::rms_gelu", layer_calls, N * R * BF16 + N * FP32, N * R * BF16,
         N * C * FP32 + N * R * BF16 + N * R * BF16 + N * FP32, "f's forward pointwise: 11.5 + 8.9 ms a step"),
        ("rms_gelu's backward (in split_rms_gelu_backward)", layer_calls, 2 * N * R * BF16 + N * FP32,
         N * R * BF16 + N * FP32, 2 * N * R * BF16 + N * FP32 + N * C * FP32 + N * R * BF16 + N * C * FP32,
         "GELU's backward in autograd's cat: 33.9 ms / 60"),
        ("K's and V's gradients copied into the projection's (split_rms_gelu_backward)", layer_calls,
         2 * N * C * BF16, 2 * N * C * BF16, None, "(the cat, above)"),
        ("rstd's gradient into x's (in ln_1's backward kernel)", layer_calls, 2 * N * FP32, 0,
         N * C * FP32, "-"),
        ("nlq::layer_norm_residual", layer_calls, N * C * FP32 + N * C * BF16, N * C * BF16 + 2 * N * FP32,
         N * C * FP32 + N * C * BF16 + N * C * FP32 + 2 * N * FP32 + N * C * FP32 + N * C * BF16,
         "(f's forward pointwise, above)"),
        ("nlq::layer_norm_residual_backward", layer_calls, 2 * N * C * BF16 + 2 * N * FP32,
         N * C * BF16 + 2 * blocks * C * FP32, N * C * FP32 + N * C * BF16 + 2 * N * FP32 + N * C * BF16 +
         2 * blocks * C * FP32, "f's LayerNorm backward: 16.5 ms / 55"),
        ("nlq::cross_entropy_rows (the gradient written over the logits)", loss_calls, N * V * BF16 + N * INT64,
         N * V * BF16 + N * FP32, N * V * BF16 + N * INT64 + 2 * N * FP32, "inductor's online softmax: 37.9 ms / 5"),
        ("the gradient scaled in place (CrossEntropy's backward, inductor's mul)", loss_calls, N * V * BF16 + FP32,
         N * V * BF16, 2 * (N * V * BF16 + N * V * BF16) + N * INT64 + 2 * N * FP32,
         "inductor's fused backward: 40.6 ms / 5"),
    ]


def table(N, C, R, V, bandwidth):
    """The markdown table of ops() at `bandwidth` bytes/s: its lines."""
    lines = [f"| op ({N:,} rows, C = {C}, r = {R}, V = {V:,}) | calls a step | MB read | MB written "
             f"| µs a call at {bandwidth / 1e12:g} TB/s | ms a step | issue 65's MB a call "
             f"| measured, H200 (what it replaces) |",
             "|---|---|---|---|---|---|---|---|"]
    total = total_before = 0.0
    for name, calls, read, written, before, measured in ops(N, C, R, V):
        seconds = (read + written) / bandwidth
        total += calls * seconds
        total_before += calls * (seconds if before is None else before / bandwidth)
        lines.append(f"| {name} | {calls} | {read / 1e6:,.1f} | {written / 1e6:,.1f} | {1e6 * seconds:,.1f} "
                     f"| {1e3 * calls * seconds:.2f} | {'-' if before is None else f'{before / 1e6:,.1f}'} "
                     f"| {measured} |")
    lines.append(f"| all of them | | | | | {1e3 * total:.1f} | {1e3 * total_before:.1f} ms a step | |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", type=int, default=96 * 1024, help="tokens of one micro-batch (batch_size x block_size)")
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--rank", type=int, default=384, help="the query's bottleneck r")
    p.add_argument("--vocab_size", type=int, default=50304)
    p.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s: the H200's HBM3e 4.8 TB/s by default")
    args = p.parse_args()
    print("\n".join(table(args.rows, args.n_embd, args.rank, args.vocab_size, args.bandwidth)))


if __name__ == "__main__":
    main()
