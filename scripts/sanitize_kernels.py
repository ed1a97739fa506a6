"""Small, ragged calls of every kernel family, for `compute-sanitizer --tool memcheck` (and
racecheck / synccheck): each tensor its own allocation (PYTORCH_NO_CUDA_MEMORY_CACHING=1, set
here before torch loads), lengths that end mid-tile, and caches whose last row is in use, so a
read past a tensor reaches memory that no allocation owns.

    compute-sanitizer --tool memcheck --error-exitcode 7 python3 scripts/sanitize_kernels.py

It checks no values (the GPU tests do); it prints one line per call and "ok" at the end.
`--device cpu` runs the same calls on the reference path (a smoke test of this script);
`--only persistent_forward_calls,prefill_calls` runs those sections alone.
"""

import contextlib
import os
import sys

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flash_cuda  # noqa: E402

DEV = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
DT = torch.bfloat16 if DEV == "cuda" else torch.float32


@contextlib.contextmanager
def environment(**values):
    """The library's environment switches (read per call) set to `values` inside the block, and
    restored, unset or as the caller had them, after it."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


gen = torch.Generator(device=DEV).manual_seed(0)


def rand(*shape, grad=False):
    t = torch.randn(*shape, device=DEV, dtype=DT, generator=gen)
    return t.requires_grad_(grad)


def ints(values):
    return torch.tensor(values, dtype=torch.int32, device=DEV)


def run(name, fn):
    fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    print(name, flush=True)


def paged(k_dense, v_dense, lengths, page):
    """(k_pages, v_pages, block_table) of a dense (b, capacity, hk, d) cache; the pages are
    shuffled, and the physically last page belongs to the longest sequence's last block, which
    that sequence fills, so its last row is the last row of the tensor."""
    b, cap, hk, d = k_dense.shape
    per_seq = cap // page
    n = b * per_seq
    order = torch.randperm(n - 1, generator=torch.Generator().manual_seed(1)).tolist()
    longest = max(range(b), key=lambda i: lengths[i])
    table = torch.empty(b, per_seq, dtype=torch.int32)
    it = iter(order)
    for i in range(b):
        for j in range(per_seq):
            table[i, j] = n - 1 if (i, j) == (longest, per_seq - 1) else next(it)
    kp = torch.empty(n, page, hk, d, device=DEV, dtype=DT)
    vp = torch.empty_like(kp)
    for i in range(b):
        for j in range(per_seq):
            kp[table[i, j]] = k_dense[i, j * page:(j + 1) * page]
            vp[table[i, j]] = v_dense[i, j * page:(j + 1) * page]
    return kp, vp, table.to(DEV)


def decode_calls(head_dims=(64, 80, 128, 256)):  # 80: a head dim below its tile width (96)
    for d in head_dims:
        b, hk, cap = 3, 2, 320  # a multiple of every page size below
        lengths = [cap, 77, 5]  # one full (its last row is the cache's last row), two ragged
        k_dense, v_dense = rand(b, cap, hk, d), rand(b, cap, hk, d)
        seqlens = ints(lengths)
        for h, sq in ((2, 1), (8, 1), (8, 4), (16, 3)):  # MHA, GQA re-strided, packed in kernel
            q = rand(b, sq, h, d)
            for splits in (1, 3):
                run(f"decode d{d} h{h}/{hk} q{sq} splits {splits} contiguous",
                    lambda: flash_cuda.flash_attn_with_kvcache(
                        q, k_dense, v_dense, cache_seqlens=seqlens, causal=True,
                        num_splits=splits))
                for page in (16, 5, 64):
                    kp, vp, table = paged(k_dense, v_dense, lengths, page)
                    run(f"decode d{d} h{h}/{hk} q{sq} splits {splits} page {page}",
                        lambda: flash_cuda.flash_attn_with_kvcache(
                            q, kp, vp, cache_seqlens=seqlens, block_table=table, causal=True,
                            num_splits=splits))
        # Appending steps (the attention kernel PDL-launched after the append kernel on sm_90):
        # one new token, rotary on half the head dim, into the caches' free rows.
        k_new, v_new, q = rand(b, 1, hk, d), rand(b, 1, hk, d), rand(b, 1, 8, d)
        cos, sin = rand(cap, d // 4), rand(cap, d // 4)
        room = ints([cap - 1, 77, 5])
        for splits in (1, 3):
            run(f"append step d{d} splits {splits} contiguous",
                lambda: flash_cuda.flash_attn_with_kvcache(
                    q, k_dense, v_dense, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                    cache_seqlens=room, causal=True, num_splits=splits))
            kp, vp, table = paged(k_dense, v_dense, lengths, 16)
            run(f"append step d{d} splits {splits} page 16",
                lambda: flash_cuda.flash_attn_with_kvcache(
                    q, kp, vp, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                    cache_seqlens=room, block_table=table, causal=True, num_splits=splits))


def prefill_calls():
    """Varlen, paged varlen and fixed-length fwd+bwd at d64 / d128 and at head dims the Hopper
    kernels run zero-padded (d80 on the d128 kernels; d160 on the d192 ones, d224 on the d256
    ones: sessions 45-46)."""
    for d in (64, 80, 128, 160, 224):
        lens_q, lens_k = [37, 1, 100], [37, 64, 130]
        cu_q = ints([0] + torch.tensor(lens_q).cumsum(0).tolist())
        cu_k = ints([0] + torch.tensor(lens_k).cumsum(0).tolist())
        h, hk = 4, 2
        q = rand(sum(lens_q), h, d, grad=True)
        k, v = rand(sum(lens_k), hk, d, grad=True), rand(sum(lens_k), hk, d, grad=True)

        def fwd_bwd(causal):
            out = flash_cuda.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q),
                                                    max(lens_k), causal=causal)
            out.backward(torch.ones_like(out))

        for causal in (False, True):
            run(f"varlen fwd+bwd d{d} causal {causal}", lambda: fwd_bwd(causal))
        cap = 192
        k_dense, v_dense = rand(3, cap, hk, d), rand(3, cap, hk, d)
        kp, vp, table = paged(k_dense, v_dense, lens_k[:2] + [cap], 16)
        cu_kp = ints([0, lens_k[0], lens_k[0] + lens_k[1], lens_k[0] + lens_k[1] + cap])
        run(f"paged varlen prefill d{d}",
            lambda: flash_cuda.flash_attn_varlen_func(q.detach(), kp, vp, cu_q, cu_kp,
                                                      max(lens_q), cap, causal=True,
                                                      block_table=table))
        for s in (77, 300):
            qb, kb, vb = (rand(2, s, 4, d, grad=True) for _ in range(3))
            out = flash_cuda.flash_attn_func(qb, kb, vb, causal=True)
            run(f"fixed fwd+bwd d{d} s{s}", lambda: out.backward(torch.ones_like(out)))
        if d == 128:  # the sm90 backward's deterministic turns (dQ by TMA reductions in order)
            out = flash_cuda.flash_attn_func(qb, kb, vb, deterministic=True)
            run(f"fixed fwd+bwd d{d} s300 deterministic",
                lambda: out.backward(torch.ones_like(out)))


def unchecked_decode_calls():
    """Out-of-range cache_seqlens, cache_batch_idx, cache_leftpad and block-table entries with the
    value checks off (as in graph capture): the kernel clamps them (sm80/fwd.cuh SequenceInfo), so
    memcheck must see no access outside the tensors. CUDA only (the reference indexes with them)."""
    if DEV != "cuda":
        return
    with environment(FLASH_CUDA_CHECK_VALUES="0"):
        b, cap, hk, d = 3, 192, 2, 128
        k_dense, v_dense = rand(b + 1, cap, hk, d), rand(b + 1, cap, hk, d)
        q = rand(b, 1, 8, d)
        seqlens = ints([cap + 50, 77, 10**6])
        run("unchecked decode contiguous",
            lambda: flash_cuda.flash_attn_with_kvcache(
                q, k_dense, v_dense, cache_seqlens=seqlens, cache_batch_idx=ints([10**6, 1, -2]),
                cache_leftpad=ints([0, 60, -7]), num_splits=3))
        kp, vp, table = paged(k_dense[:b], v_dense[:b], [cap, 77, 5], 16)
        table[0, 2], table[2, 0] = 10**6, -5
        run("unchecked decode page 16",
            lambda: flash_cuda.flash_attn_with_kvcache(
                q, kp, vp, cache_seqlens=seqlens, block_table=table, num_splits=3))


def ring_decode_calls():
    """The d128 decode and unchecked calls again with FLASH_CUDA_DECODE_RING=1: every key-split
    step on the warp-specialised ring tiles (sm_90; kernels/sm80/kv_ring.cuh)."""
    with environment(FLASH_CUDA_DECODE_RING="1"):
        decode_calls(head_dims=(128,))
        unchecked_decode_calls()


def overlap_decode_calls():
    """Paged d128 steps on the 128-key tile with each block's V copy issued with its K copy
    (FLASH_CUDA_DECODE_OVERLAP=1, the ring tiles off): 66 sequences of 1024 keys, GQA 4 in one
    KV head, page 16, the split heuristic's count (4 on an H200), the lengths ragged."""
    with environment(FLASH_CUDA_DECODE_OVERLAP="1", FLASH_CUDA_DECODE_RING="0"):
        b, cap, h, hk, d = 66, 1024, 4, 1, 128
        k_dense, v_dense = rand(b, cap, hk, d), rand(b, cap, hk, d)
        lengths = [cap - (i * 37) % 300 for i in range(b)]
        kp, vp, table = paged(k_dense, v_dense, lengths, 16)
        q = rand(b, 1, h, d)
        for splits in (0, 1):
            run(f"overlapped copies d{d} h{h}/{hk} b{b} splits {splits} page 16",
                lambda: flash_cuda.flash_attn_with_kvcache(
                    q, kp, vp, cache_seqlens=ints(lengths), block_table=table,
                    num_splits=splits))


def head_group_decode_calls():
    """The d128 decode and unchecked calls again with FLASH_CUDA_DECODE_HGROUP=16: every
    one-token step that can take head groups on the head-group tiles (kernels/decode.h
    plan_packing), and MHA steps of 32 KV heads (G = 16; leftpad, cache_batch_idx, splits)."""
    with environment(FLASH_CUDA_DECODE_HGROUP="16"):
        decode_calls(head_dims=(128,))
        unchecked_decode_calls()
        b, cap, h, d = 3, 320, 32, 128
        k_dense, v_dense = rand(b + 1, cap, h, d), rand(b + 1, cap, h, d)
        q = rand(b, 1, h, d)
        for splits in (1, 3, 0):
            run(f"head groups d{d} h{h}/{h} splits {splits}",
                lambda: flash_cuda.flash_attn_with_kvcache(
                    q, k_dense, v_dense, cache_seqlens=ints([cap, 77, 5]),
                    cache_batch_idx=ints([3, 0, 1]), cache_leftpad=ints([0, 9, 5]),
                    num_splits=splits))


def persistent_forward_calls():
    """Fixed-length forwards, non-causal and causal, with more 128-row query tiles than an H200 has
    SMs (132), so that the sm90 forward's persistent CTAs each walk two or three tiles (the Q
    buffer and the K/V stages handed on from tile to tile; the last tile of each sequence ends
    mid-tile; causal: tiles taken from a counter), with and without the pingpong turns
    (FLASH_CUDA_SM90=pingpong). d128 (row sums by FADDs non-causal, on the tensor cores causal;
    O through shared memory and TMA stores where not pingpong: the launcher's rule at these
    lengths), d64 (tensor-core row sums, three K/V stages; non-causal also with the 192-key
    blocks, FLASH_CUDA_SM90_KEYS192=1), d256 (80-key blocks; O through the last K and V
    buffers where not pingpong) and d192 (112-key blocks, O as d256). Causal also with the level
    order in chunks of 7 (batch, head) pairs, the last of 5 (FLASH_CUDA_SM90_CHUNK=7; the
    launcher's rule keeps these small calls in one chunk), the fixed walk
    (FLASH_CUDA_SM90_DYNAMIC=0: causal calls take their tiles from a counter by default)."""
    b, s, h = 2, 300, 48  # 3 tiles x 2 x 48 = 288 tiles
    for d in (128, 64, 256, 192):
        q, k, v = rand(b, s, h, d), rand(b, s, h, d), rand(b, s, h, d)
        for mode, causal, keys192, chunk, dynamic in (
                ("1", False, "0", "", ""), ("1", True, "0", "", ""), ("1", True, "0", "7", "0"),
                ("pingpong", False, "0", "", ""), ("pingpong", True, "0", "", ""),
                ("1", False, "1", "", "")):
            if keys192 == "1" and d != 64:
                continue
            with environment(FLASH_CUDA_SM90=mode, FLASH_CUDA_SM90_KEYS192=keys192,
                             FLASH_CUDA_SM90_CHUNK=chunk, FLASH_CUDA_SM90_DYNAMIC=dynamic):
                run(f"persistent forward d{d} b{b} s{s} h{h} causal={causal} "
                    f"FLASH_CUDA_SM90={mode} FLASH_CUDA_SM90_KEYS192={keys192} "
                    f"FLASH_CUDA_SM90_CHUNK={chunk} FLASH_CUDA_SM90_DYNAMIC={dynamic}",
                    lambda: flash_cuda.flash_attn_func(q, k, v, causal=causal))


def dropout_calls():
    """Forward and backward with dropout, fixed length (persistent sm90 forward CTAs walking two
    tiles) and varlen, causal and not, d64 / d128 / d192 / d256: the sm90 forward's quads exchange
    their Philox words through shared memory at d64 / d128 (racecheck's case); deterministic=True
    too (the ordered sm90 backward; d192: the wide kernel's d192 variant, session 46)."""
    b, s, h = 2, 300, 24
    for d in (64, 128, 192, 256):
        q, k, v = (rand(b, s, h, d, grad=True) for _ in range(3))
        for causal, deterministic in ((False, False), (True, False), (False, True)):
            def call():
                out = flash_cuda.flash_attn_func(q, k, v, dropout_p=0.17, causal=causal,
                                                 deterministic=deterministic)
                out.sum().backward()
            run(f"dropout d{d} b{b} s{s} h{h} causal={causal} deterministic={deterministic}",
                call)
        lens = [130, 1, 257]
        cu = ints([0, 130, 131, 388])
        qv, kv, vv = (rand(sum(lens), 4, d, grad=True) for _ in range(3))
        run(f"dropout varlen d{d} lengths {lens}",
            lambda: flash_cuda.flash_attn_varlen_func(
                qv, kv, vv, cu, cu, max(lens), max(lens), dropout_p=0.3,
                causal=True).sum().backward())


if __name__ == "__main__":
    torch.manual_seed(0)
    sections = (decode_calls, unchecked_decode_calls, ring_decode_calls, overlap_decode_calls,
                head_group_decode_calls, prefill_calls, persistent_forward_calls, dropout_calls)
    # --only NAME[,NAME...]: those sections alone (e.g. on a build of a few head dims).
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    unknown = set(only or ()) - {section.__name__ for section in sections}
    if unknown:
        sys.exit(f"--only: no section named {', '.join(sorted(unknown))}")
    for section in sections:
        if only is None or section.__name__ in only:
            section()
    print("ok")
