// The K/V ring of the warp-specialised key-split decode tile (sm_90; decode_keysplit.cuh
// FwdKeySplitTraits with ProducerWarps > 0).
//
// The CTA's warps are split in two: kNWarps compute warps (the key-split tile's math, as in the
// plain tile) and kProducerWarps producer warps that only copy K and V tiles into a ring of
// kStages slots (one K and one V tile each). A producer thread runs the same TileCopy the compute
// warps run in the plain tile (one copy thread per compute thread), paged lookups included, and
// signals a tile with cp.async.mbarrier.arrive.noinc: the arrival happens when that thread's
// copies have landed, so a phase of the tile's barrier completes once all of them have. Three
// mbarriers per slot:
//   full_k[s], full_v[s]   kProducerThreads arrivals: K / V of the slot's block has landed
//   empty[s]               kNWarps arrivals (lane 0 of each compute warp, after its last read of
//                          the slot's V tile): the slot may be refilled
// Block `it` of the CTA's key loop uses slot it % kStages in round r = it / kStages: the compute
// warps wait for phase r of full_k / full_v (parity r % 2), and the producers, from round 1 on,
// for phase r - 1 of empty (parity (r - 1) % 2).
// Why: at one CTA per SM the plain tile's time is its instruction stream (bench/NOTES.md run 53:
// one warp per scheduler, ~3.9 cycles per issued instruction), and every compute warp issued its
// share of the copies, the page lookups and two CTA barriers per block. Here the compute warps
// issue only the math and two mbarrier waits per block, the copies run on the other warp of each
// scheduler, and the ring keeps up to kStages blocks in flight ahead of the math. Measured
// (session 21), that pays only where the copies carry the page arithmetic and the plain plan
// has one CTA per SM (kernels/decode.h plan_decode_tile has the figures): on contiguous caches
// the ring ran at 0.978-0.981x the plain tiles, and for MQA b1 kv131k ncu gave the ring's kernel
// 24.0 us against the plain one's 22.2 (both 60-65% of DRAM peak), so the plain tile's steps
// there are not bound by its copies' instructions.
#pragma once

#include <cstdint>

#include "kernels/sm90/mbarrier_wait.cuh"
#include "kernels/sm90/ptx_sm90.cuh"

namespace flash_cuda {
namespace sm80 {

// Whether this compilation pass has the mbarrier waits of the ring (mbarrier.try_wait: sm_90):
// every pass but those for older GPUs (the host pass and the CPU emulator included). There the
// warp-specialised kernels only trap; the host launches them on compute capability 9.0 only.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kKVRingCompiled = false;
#else
constexpr bool kKVRingCompiled = true;
#endif

// Named barrier of the compute warps of a warp-specialised CTA (the producers never join it).
constexpr uint32_t kComputeWarpsBarrier = 1;

// A barrier of every thread that computes: __syncthreads(), or with producer warps the compute
// warps' named barrier (the producers may have exited).
template <typename Traits>
__device__ __forceinline__ void compute_warps_sync() {
    if constexpr (Traits::kProducerWarps > 0) {
        ptx90::named_barrier_sync(kComputeWarpsBarrier, Traits::kNThreads);
    } else {
        __syncthreads();
    }
}

template <typename Traits>
struct KVRing {
    static constexpr int kStages = Traits::kStages;
    uint32_t bars;  // shared address of full_k[0]; then full_v[0..], empty[0..]

    __device__ __forceinline__ uint32_t full_k(int slot) const { return bars + 8u * slot; }
    __device__ __forceinline__ uint32_t full_v(int slot) const {
        return bars + 8u * (kStages + slot);
    }
    __device__ __forceinline__ uint32_t empty(int slot) const {
        return bars + 8u * (2 * kStages + slot);
    }
    __device__ __forceinline__ static int slot_of(int it) { return it % kStages; }
    __device__ __forceinline__ static uint32_t parity_of(int it) {
        return static_cast<uint32_t>(it / kStages) & 1u;
    }

    // One thread, before the CTA barrier that precedes every other use.
    __device__ __forceinline__ void init() const {
        for (int s = 0; s < kStages; ++s) {
            ptx90::mbarrier_init(full_k(s), Traits::kProducerThreads);
            ptx90::mbarrier_init(full_v(s), Traits::kProducerThreads);
            ptx90::mbarrier_init(empty(s), Traits::kNWarps);
        }
        ptx90::fence_barrier_init();
    }

    // Producer thread, before its copies of block `it`: the compute warps are done with the
    // slot's previous block (none in round 0).
    __device__ __forceinline__ void acquire(int it) const {
        if (it >= kStages) {
            sm90::wait_phase(empty(slot_of(it)), static_cast<uint32_t>(it / kStages - 1) & 1u);
        }
    }
    // Producer thread, after issuing its copies of block `it`'s K (V) tile.
    __device__ __forceinline__ void k_issued(int it) const {
        ptx90::cp_async_mbarrier_arrive_noinc(full_k(slot_of(it)));
    }
    __device__ __forceinline__ void v_issued(int it) const {
        ptx90::cp_async_mbarrier_arrive_noinc(full_v(slot_of(it)));
    }

    // Compute thread: block `it`'s K (V) tile has landed.
    __device__ __forceinline__ void wait_k(int it) const {
        sm90::wait_phase(full_k(slot_of(it)), parity_of(it));
    }
    __device__ __forceinline__ void wait_v(int it) const {
        sm90::wait_phase(full_v(slot_of(it)), parity_of(it));
    }
    // Compute warp, after its last read of block `it`'s K and V tiles: one arrival per warp.
    __device__ __forceinline__ void release(int it, int lane) const {
        __syncwarp();
        if (lane == 0) ptx90::mbarrier_arrive(empty(slot_of(it)));
    }
};

// The ring of a CTA whose shared memory starts at smem_base (a tile without producer warps has
// none: an unused placeholder).
template <typename Traits>
__device__ __forceinline__ KVRing<Traits> kv_ring_at(uint32_t smem_base) {
    if constexpr (Traits::kProducerWarps > 0) {
        return KVRing<Traits>{smem_base + Traits::kSmemBarriersOffset};
    } else {
        return KVRing<Traits>{0u};
    }
}

}  // namespace sm80
}  // namespace flash_cuda
