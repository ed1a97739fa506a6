// Backward main kernel on Hopper (sm_90a) for head dims 192 and 256: the consumer warpgroups
// split the head dim instead of the keys. Producer, mbarriers, masking and the dS / P^T
// arithmetic are bwd_sm90.cuh's; what differs is who computes what.
//
// At d256 the dK and dV of 64 keys are 2 x 64 x 256 fp32, 256 registers per thread of one
// warpgroup: too many (d192: 192). So one CTA = kBlockN = 64 keys of one (batch, query head),
// and consumer warpgroup c (of 2) owns kHalfD = d / 2 columns of their dK and dV (d256: 128
// registers, d192: 96). Per query block of 64 queries:
//   S^T  = K Q_c^T, dP^T = V dO_c^T        wgmma SS (n32): all 64 keys x the warpgroup's 32
//                                          queries 32 c .. 32 c + 31, contracted over d
//   P^T, dS^T                              as bwd_sm90.cuh (scores_to_probs, probs_to_dscores)
//   P^T, dS^T -> shared memory             each warpgroup its 32 query columns of the 64 key
//                                          rows (double-buffered), then a named barrier: both
//                                          halves are needed by both warpgroups
//   dV[:, c's] += P^T dO[:, c's]           wgmma SS: A = P^T rows (K-major), B = dO / Q
//   dK[:, c's] += dS^T Q[:, c's]           MN-major
//   dQ[:, c's] = dS K[:, c's]              over all 64 keys, staged in fp32 and added to
//                                          dq_accum by TMA reductions: one per dq_accum element
//                                          per CTA
// Warpgroup c's columns ("c's"): d256, slabs 2 c and 2 c + 1 (128 c .., one n128 wgmma per k
// step); d192, its own slab 2 c (n64) and half of the middle slab 1 (n32, columns 64 + 32 c ..,
// 64 c bytes into the slab's 128-byte rows: an MN-major B operand's N atoms are 64 columns, so
// an n96 could not start at column 96). The A operand is then read twice per k step (the
// n64 and the n32), against the padded d256 kernel's n128 over 4/3 the columns.
// The double buffer of P^T / dS^T: a warpgroup writes buffer (it + 1) % 2 while the other may
// still read buffer it % 2; it cannot write buffer it % 2 again before the other warpgroup has
// reached the named barrier of it + 1, which it does after its last read of it % 2 (wgmma
// wait 0 of its dQ).
// Staged dQ, d256: no shared memory is left for bwd_sm90.cuh's staging buffers, so a warpgroup
// stages its two dQ slabs (2 x 16 KB) in its own half of the stage's Q and dO tiles (slabs 2 c,
// 2 c + 1 of each): after the named barrier both warpgroups' S^T / dP^T GEMMs, the only readers
// of the other half, have landed, and after its dV / dK GEMMs nothing reads its half. The stage
// goes back to the producer only once the reductions have read the staging: thread 0 of each
// warpgroup arrives on the stage's empty barrier in the next iteration (bulk_wait_group_read
// under that iteration's S^T / dP^T GEMMs), the other consumer threads as before. d192 (Q / dO
// tiles of 24 KB, 176 KB in all before staging) has room for a buffer of its own per warpgroup
// (3 boxes of 32 columns, 24 KB; the middle slab's bytes are read by both warpgroups' dV / dK
// GEMMs, so the Q / dO tiles would not do): the stage goes back as soon as the dV / dK GEMMs
// have read it, and thread 0's bulk_wait_group_read before the named barrier of the next
// iteration says the buffer may be written again.
#pragma once

#include "kernels/sm90/bwd_sm90.cuh"

namespace flash_cuda {
namespace sm90 {

template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool IsDropout = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    mha_bwd_sm90_wide_kernel(const __grid_constant__ BwdParams params,
                             const __grid_constant__ CUtensorMap q_map,
                             const __grid_constant__ CUtensorMap k_map,
                             const __grid_constant__ CUtensorMap v_map,
                             const __grid_constant__ CUtensorMap do_map,
                             const __grid_constant__ CUtensorMap dq_map) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // no body outside sm_90a (see fwd_sm90.cuh)
#else
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kStages = Traits::kStages;
    constexpr int kCols = Traits::kCols;              // queries of S^T per warpgroup: 32
    constexpr int kHalfD = kHeadDim / 2;              // columns of dK / dV per warpgroup
    constexpr int kOwnSlabs = kHalfD / 64;            // d256: 2, d192: 1
    constexpr int kOwnCols = 64 * kOwnSlabs;
    constexpr bool kSharedSlab = kHalfD != kOwnCols;  // d192: 32 columns of the middle slab
    constexpr int kSharedAcc = kSharedSlab ? 16 : 1;  // their accumulators (d256: unused)
    constexpr bool kDqInQdoTiles = Traits::kDqInQdoTiles;
    using PTile = typename Traits::PTile;
    static_assert(Traits::kWide && kBlockN == 64 && kCols == 32, "the d192 / d256 geometry");
    static_assert(kHalfD == kOwnCols || (kHalfD == kOwnCols + 32 && kOwnSlabs == 1),
                  "d256: two slabs per warpgroup; d192: one and half the middle one");
    static_assert(kDqInQdoTiles == !kSharedSlab, "d256 stages dQ in Q / dO, d192 in its buffer");

    const BwdSm90Smem<Traits> smem = BwdSm90Smem<Traits>::make();
    const int tid = threadIdx.x;
    const int batch = blockIdx.y;
    const int head = blockIdx.z;
    const auto work = BwdSm90Work<Traits, Causal>::make(params, batch, head);
    if (work.n0 < 0) return;  // varlen: this sequence has fewer key blocks
    const auto& [seq, mask, range, blocks, n0, valid_keys, n_iters] = work;
    bwd_sm90_init_barriers(smem);

    const int warpgroup = tid / 128;
    if (warpgroup == 0) {
        ptx90::setmaxnreg_dec<24>();
        bwd_sm90_produce(params, work, smem, batch, head, &q_map, &k_map, &v_map, &do_map);
        return;
    }

    // ---- Consumers: warpgroup 1 + c owns kHalfD head-dim columns of dK, dV and dQ (the header),
    // and the queries 32 c .. 32 c + 31 of each block's S^T / dP^T.
    ptx90::setmaxnreg_inc<240>();
    const int c = warpgroup - 1;
    const int t = tid % 128;
    const int lane = t % 32;
    const int key_row0 = 16 * (t / 32);  // the warp's first key in the block
    const float score_log2 = params.scale_softmax_log2;
    const float alibi_slope_log2 = HasAlibi ? sm80::bwd_alibi_slope_log2(params, batch, head) : 0.f;
    const DqTurns turns = DqTurns::make(params, batch, head, seq.seqlen_q);  // deterministic
    const bool elected = c == 0 && t == 0;
    // dq_accum's row of query 0 (the TMA's row coordinate, below 2^31: make_dq_accum_map).
    const int dq_row0 = static_cast<int>(seq.acc_row0);

    // The warpgroup's first own slab (d256: 2 c, d192: 2 c) and, d192, the column of its half of
    // the middle slab.
    const int own_slab0 = c * (Traits::kSlabs - kOwnSlabs);
    const int shared_col0 = kOwnCols + 32 * c;
    // wgmma layout: the warp's 16 keys x its own slabs' columns, and the 32 shared ones (d192).
    float acc_dk[kOwnCols / 2], acc_dv[kOwnCols / 2];
    float acc_dk_shared[kSharedAcc], acc_dv_shared[kSharedAcc];
#pragma unroll
    for (int i = 0; i < kOwnCols / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
#pragma unroll
    for (int i = 0; i < kSharedAcc; ++i) acc_dk_shared[i] = acc_dv_shared[i] = 0.f;
    float acc_s[kCols / 2], acc_dp[kCols / 2];  // S^T, dP^T (64 keys x 32 queries)
    uint32_t p_frag[1][kCols / 16][4], ds_frag[1][kCols / 16][4];
    auto& s_frag = *reinterpret_cast<float(*)[1][kCols / 8][4]>(&acc_s);
    auto& dp_frag = *reinterpret_cast<float(*)[1][kCols / 8][4]>(&acc_dp);

    // Dropout: the tile's Philox key and stream, warp-uniform (uniform registers).
    [[maybe_unused]] const DropoutMask dropout_mask =
        IsDropout ? DropoutMask::make_warp_uniform(
                        params, static_cast<int64_t>(batch) * params.h + head)
                  : DropoutMask{};
    wait_phase(smem.full_kv(), 0);
    for (int it = 0; it < n_iters; ++it) {
        const int stage = it % kStages;
        const int m0 = (blocks.min + it) * kBlockM;
        const uint32_t pt_rows = smem.p(it % 2);
        const uint32_t ds_rows = smem.ds(it % 2);
        // This warpgroup's 32 query rows of each Q / dO slab (4096 bytes: whole 1024-byte
        // swizzle atoms), its first own slab of the head dim and (d192) its 32 columns of the
        // middle slab. Opaque, so that the descriptors are rebuilt in the loop rather than
        // hoisted (see bwd_sm90.cuh).
        const uint32_t query_rows = ptx::opaque(static_cast<uint32_t>(kCols * c * 128));
        const uint32_t slab_offset =
            ptx::opaque(static_cast<uint32_t>(own_slab0 * Traits::kQSlabBytes));
        const uint32_t shared_offset = ptx::opaque(
            static_cast<uint32_t>(kOwnSlabs * Traits::kQSlabBytes + 64 * c));
        // Dropout: the keep bits of the warp's 16 keys x this warpgroup's 32 queries.
        [[maybe_unused]] uint32_t keep[1][1];
        if constexpr (IsDropout) {
            dropout_keep_bits_transposed<1, kCols / 8, 4>(  // all four draws in flight
                keep, [&] { return dropout_mask; }, n0 + key_row0, m0 + kCols * c, lane);
        }
        wait_phase(smem.full_q(stage), (it / kStages) & 1);

        // S^T = K Q_c^T and dP^T = V dO_c^T: k16 step ks reads 32 bytes into the rows of slab
        // ks / 4.
        ptx90::fence_operand(acc_s);
        ptx90::fence_operand(acc_dp);
        ptx90::wgmma_fence();
        auto ss_gemm = [&](float (&acc)[kCols / 2], uint32_t a_tile, uint32_t b_rows) {
#pragma unroll
            for (int ks = 0; ks < kHeadDim / 16; ++ks) {
                const uint32_t a_offset = (ks / 4) * Traits::kKVSlabBytes + 32 * (ks % 4);
                const uint32_t b_offset = (ks / 4) * Traits::kQSlabBytes + 32 * (ks % 4);
                ptx90::wgmma_ss<kCols, Element>(acc,
                                                ptx90::make_smem_desc_sw128(a_tile + a_offset),
                                                ptx90::make_smem_desc_sw128(b_rows + b_offset),
                                                ks > 0);
            }
            ptx90::wgmma_commit();
        };
        ss_gemm(acc_s, smem.k(), smem.q(stage) + query_rows);
        ss_gemm(acc_dp, smem.v(), smem.d_o(stage) + query_rows);

        // P^T while dP^T accumulates, then dS^T: columns are queries kCols c + ...
        ptx90::wgmma_wait<1>();
        ptx90::fence_operand(acc_s);
        const uint32_t column_bytes = 4 * (kCols * c + 2 * (lane % 4));
        scores_to_probs<kCols, HasAlibi>(s_frag, n0 + key_row0 + lane / 4,
                                         ptx::opaque(m0 + kCols * c + 2 * (lane % 4)), range,
                                         mask, smem.lse(stage) + column_bytes, score_log2,
                                         alibi_slope_log2,
                                         block_fully_visible<kBlockN, kCols>(range, n0,
                                                                             m0 + kCols * c));
        ptx90::wgmma_wait<0>();
        ptx90::fence_operand(acc_dp);
        if (it > 0 && t == 0) {  // the previous staged dQ has been read (d256: release its stage)
            ptx90::bulk_wait_group_read<0>();
            if constexpr (kDqInQdoTiles) ptx90::mbarrier_arrive(smem.empty_q((it - 1) % kStages));
        }
        // Dropout: dS = P o (dP o M / p_keep - D), dV += (P o M)^T dO (1 / p_keep at the end).
        if constexpr (IsDropout) drop_transposed(dp_frag, keep, params.rp_keep);
        probs_to_dscores<kCols>(dp_frag, s_frag, smem.dsum(stage) + column_bytes);
        sm80::convert_p_to_a_fragments<Element, PTile>(p_frag, s_frag);
        if constexpr (IsDropout) drop_pairs_transposed(p_frag, keep);  // dV: 1 / p_keep at the end
        sm80::convert_p_to_a_fragments<Element, PTile>(ds_frag, dp_frag);

        // P^T and dS^T -> shared memory: the warp's 16 key rows, this warpgroup's 32 queries
        // (16-byte chunks 4 c .. 4 c + 3 of each 128-byte row).
        store_key_rows(pt_rows, p_frag[0], key_row0, lane, 4 * c);
        store_key_rows(ds_rows, ds_frag[0], key_row0, lane, 4 * c);
        ptx90::fence_proxy_async_shared();  // the st.shared above, read by the wgmma below
        ptx90::named_barrier_sync(1, Traits::kConsumerThreads);  // both warpgroups' halves

        // dV += P^T dO, dK += dS^T Q on this warpgroup's columns: A K-major (k16 step = 32
        // bytes of the 128-byte rows), B MN-major (rows = queries, k16 step = 2048 bytes; d256's
        // two 64-column slabs kQSlabBytes apart, d192's own slab and its half of the middle one).
        ptx90::fence_operand(acc_dv);
        ptx90::fence_operand(acc_dk);
        if constexpr (kSharedSlab) {
            ptx90::fence_operand(acc_dv_shared);
            ptx90::fence_operand(acc_dk_shared);
        }
        ptx90::wgmma_fence();
        auto dkv_gemm = [&](float (&acc)[kOwnCols / 2], float (&acc_shared)[kSharedAcc],
                            uint32_t a_rows, uint32_t b_tile) {
#pragma unroll
            for (int kk = 0; kk < kBlockM / 16; ++kk) {
                ptx90::wgmma_ss<kOwnCols, Element, false, true>(
                    acc, ptx90::make_smem_desc_sw128(a_rows + 32 * kk),
                    ptx90::make_smem_desc_sw128(b_tile + slab_offset + 2048 * kk,
                                                Traits::kQSlabBytes),
                    true);
                if constexpr (kSharedSlab) {
                    ptx90::wgmma_ss<32, Element, false, true>(
                        acc_shared, ptx90::make_smem_desc_sw128(a_rows + 32 * kk),
                        ptx90::make_smem_desc_sw128(b_tile + shared_offset + 2048 * kk), true);
                }
            }
        };
        dkv_gemm(acc_dv, acc_dv_shared, pt_rows, smem.d_o(stage));
        dkv_gemm(acc_dk, acc_dk_shared, ds_rows, smem.q(stage));
        ptx90::wgmma_commit();
        ptx90::wgmma_wait<0>();
        ptx90::fence_operand(acc_dv);
        ptx90::fence_operand(acc_dk);
        if constexpr (kSharedSlab) {
            ptx90::fence_operand(acc_dv_shared);
            ptx90::fence_operand(acc_dk_shared);
        }
        // Q, dO, lse, D of this stage consumed; d256: thread 0 arrives once the staged dQ is read.
        if (!kDqInQdoTiles || t != 0) ptx90::mbarrier_arrive(smem.empty_q(stage));

        // dQ = dS K on this warpgroup's columns, over all 64 keys of the block, as two pieces
        // (issue_dq_slab each): d256 its slabs 2 c, 2 c + 1, staged in slabs 2 c, 2 c + 1 of the
        // stage's Q (piece 0) or dO (piece 1) tile, 64 rows x 64 fp32 columns = 16 KB, two boxes
        // of 32 columns (bwd_sm90.cuh stage_dq_slab); d192 its own slab (two boxes) and its 32
        // columns of the middle slab (one box), staged in the warpgroup's buffer.
        constexpr int kPiece1Cols = kSharedSlab ? 32 : 64;
        const bool ordered = turns.sem != nullptr;  // deterministic
        if (ordered) turns.acquire(m0 / kBlockM, it, blocks.min, elected, Traits::kConsumerThreads);
        float acc_dq0[32], acc_dq1[kPiece1Cols / 2];
        // The pieces' first columns (of K, dQ) and where they start in K's slabs.
        const int piece_col[2] = {64 * own_slab0, kSharedSlab ? shared_col0 : 64 * (own_slab0 + 1)};
        const int k_piece[2] = {own_slab0 * Traits::kKVSlabBytes,
                                kSharedSlab ? kOwnSlabs * Traits::kKVSlabBytes + 64 * c
                                            : (own_slab0 + 1) * Traits::kKVSlabBytes};
        issue_dq_slab<Element, kBlockN / 16>(
            acc_dq0, ds_rows, smem.k() + ptx::opaque(static_cast<uint32_t>(k_piece[0])));
        issue_dq_slab<Element, kBlockN / 16, kPiece1Cols>(
            acc_dq1, ds_rows, smem.k() + ptx::opaque(static_cast<uint32_t>(k_piece[1])));
        const uint32_t qdo_half = static_cast<uint32_t>(own_slab0 * Traits::kQSlabBytes);
        const uint32_t dq_stage[2] = {
            kDqInQdoTiles ? smem.q(stage) + qdo_half : smem.dq(c),
            kDqInQdoTiles ? smem.d_o(stage) + qdo_half : smem.dq(c) + 2 * Traits::kDqBoxBytes};
        ptx90::wgmma_wait<1>();
        ptx90::fence_operand(acc_dq0);
        stage_dq_slab<Traits::kDqBoxBytes>(acc_dq0, dq_stage[0], t);
        ptx90::wgmma_wait<0>();
        ptx90::fence_operand(acc_dq1);
        stage_dq_slab<Traits::kDqBoxBytes, kPiece1Cols>(acc_dq1, dq_stage[1], t);
        ptx90::fence_proxy_async_shared();  // the stores above, seen by the TMA
        consumer_warpgroup_sync(c);
        if (t == 0) {
            issue_dq_reductions<Traits::kDqBoxBytes>(&dq_map, dq_stage[0], piece_col[0],
                                                     dq_row0 + m0);
            issue_dq_reductions<Traits::kDqBoxBytes, kPiece1Cols>(&dq_map, dq_stage[1],
                                                                  piece_col[1], dq_row0 + m0);
            commit_dq_reductions(ordered);  // ordered: complete before the turn's release
        }
        if (ordered) turns.release(m0 / kBlockM, elected, Traits::kConsumerThreads);
    }
    // The staged dQ must outlive its reductions' reads (the last stage is not released).
    if (t == 0) ptx90::bulk_wait_group<0>();
    if (turns.sem != nullptr && elected) {  // deterministic: the query blocks after this CTA's
        turns.pass_range(n_iters > 0 ? blocks.max : 0, turns.n_blocks);
    }

    // ---- dK, dV: the warp's 16 keys, this warpgroup's columns (its own slabs, then d192's
    // 32 of the middle slab).
    if constexpr (IsDropout) {
        scale_dv_for_dropped_pairs(acc_dv, params.rp_keep);
        if constexpr (kSharedSlab) scale_dv_for_dropped_pairs(acc_dv_shared, params.rp_keep);
    }
    const auto& dk_frag = *reinterpret_cast<const float(*)[1][kOwnCols / 8][4]>(&acc_dk);
    const auto& dv_frag = *reinterpret_cast<const float(*)[1][kOwnCols / 8][4]>(&acc_dv);
    sm80::store_dk_dv<Element, kHeadDim, true, true>(params, batch, head, seq.kv_row0, n0, key_row0,
                                                      64 * own_slab0, lane, valid_keys, dk_frag,
                                                      dv_frag);
    if constexpr (kSharedSlab) {
        const auto& dk_shared = *reinterpret_cast<const float(*)[1][4][4]>(&acc_dk_shared);
        const auto& dv_shared = *reinterpret_cast<const float(*)[1][4][4]>(&acc_dv_shared);
        sm80::store_dk_dv<Element, kHeadDim, true, true>(params, batch, head, seq.kv_row0, n0,
                                                          key_row0, shared_col0, lane, valid_keys,
                                                          dk_shared, dv_shared);
    }
#endif  // sm_90a
}

// The main kernel for a Traits: the wide one at d192 / d256.
template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool IsDropout = false>
constexpr auto bwd_sm90_kernel() {
    if constexpr (Traits::kWide) {
        return &mha_bwd_sm90_wide_kernel<Element, Traits, Causal, HasAlibi, IsDropout>;
    } else {
        return &mha_bwd_sm90_kernel<Element, Traits, Causal, HasAlibi, IsDropout>;
    }
}

}  // namespace sm90
}  // namespace flash_cuda
