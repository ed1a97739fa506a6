// Shared-memory tiles of the sm80 kernels: the XOR-swizzled layout and the 16-byte copies
// between global and shared memory (cp.async in, vector stores out).
//
// A tile holds kRows x kCols 16-bit elements (kCols = the kernel head dim). It is split into
// column blocks ("atoms") of kAtomCols = 64 elements (32 when kCols is not a multiple of 64);
// inside an atom, rows follow each other and every 128-byte line (64 elements: one row of a
// 64-wide atom, two rows of a 32-wide one) has its eight 16-byte chunks permuted by
//     chunk' = chunk ^ (line % 8).
// Eight consecutive rows at the same logical column then sit in eight different bank groups,
// so each 8x8 matrix of an ldmatrix (eight 16-byte rows at one column) is read without bank
// conflicts, and so are the 4-byte accumulator stores of the epilogue and the 16-byte copies
// (each group of 8 threads writes one whole 128-byte line).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/ptx.cuh"

namespace flash_cuda {
namespace sm80 {

// Calls fn(std::integral_constant<int, i>{}) for i = 0 .. kCount - 1: compile-time indices,
// so offsets built from them fold into instruction immediates.
template <typename Fn, int... kIndices>
__device__ __forceinline__ void static_for_each_impl(Fn&& fn, std::integer_sequence<int, kIndices...>) {
    (fn(std::integral_constant<int, kIndices>{}), ...);
}
template <int kCount, typename Fn>
__device__ __forceinline__ void static_for_each(Fn&& fn) {
    static_for_each_impl(fn, std::make_integer_sequence<int, kCount>{});
}

template <int kRows_, int kCols_>
struct SwizzledTile {
    static constexpr int kRows = kRows_;
    static constexpr int kCols = kCols_;
    static constexpr int kAtomCols = (kCols % 64 == 0) ? 64 : 32;
    static constexpr int kElements = kRows * kCols;
    static constexpr int kBytes = kElements * 2;
    static_assert(kCols % kAtomCols == 0, "tile width must be a multiple of 32 elements");
    static_assert(kRows % 8 == 0, "tile height must be a multiple of 8 rows");

    // Element offset of (row, col) from the tile start. col % 8 is kept, so a 16-byte chunk
    // (col a multiple of 8) stays contiguous.
    // row, col >= 0 (unsigned arithmetic: divisions are shifts).
    __device__ __forceinline__ static int offset(int row, int col) {
        const uint32_t urow = static_cast<uint32_t>(row), ucol = static_cast<uint32_t>(col);
        const uint32_t atom = ucol / kAtomCols;
        const uint32_t linear = urow * kAtomCols + ucol % kAtomCols;  // offset inside the atom
        const uint32_t line = linear / 64;                            // 128-byte line
        return static_cast<int>(atom * (kRows * kAtomCols) + (linear ^ ((line % 8) << 3)));
    }

    // Byte offset, for shared-memory addresses.
    __device__ __forceinline__ static uint32_t byte_offset(int row, int col) {
        return static_cast<uint32_t>(offset(row, col)) * 2u;
    }

    // Fast addressing. For a 128-byte aligned tile address `tile`, a per-thread position
    // (row, col) and compile-time steps (kRowStep, kColStep), multiples of 8:
    //   tile + byte_offset(row + kRowStep, col + kColStep)
    //     == ((tile + byte_offset(row, col)) ^ kXor) + kAdd
    // provided the step does not carry into the thread's own column bits: either kColStep is a
    // multiple of kAtomCols (whole atoms), or the thread's col % 8 == 0 and its chunk index
    // (col % kAtomCols) / 8 shares no set bit with (kColStep % kAtomCols) / 8 (e.g. col in
    // [0, 16) with kColStep % 16 == 0, or col in [0, 8)). Row steps keep row % 8 for 64-wide
    // atoms; for 32-wide ones (two rows per 128-byte line) an odd multiple of 8 rows moves the
    // line by 4 and flips chunk bit 2. kAdd is a multiple of 128 bytes and never carries into
    // the swizzled bits, so every fragment address is one LOP3 on a per-thread base plus an
    // immediate offset.
    template <int kRowStep, int kColStep>
    __device__ __forceinline__ static uint32_t stepped(uint32_t thread_base) {
        static_assert(kRowStep % 8 == 0 && kColStep % 8 == 0, "steps of whole 8x8 blocks");
        constexpr int kChunkFlip = (kColStep % kAtomCols) / 8 ^
                                   ((kAtomCols == 32 && (kRowStep / 8) % 2 == 1) ? 4 : 0);
        constexpr uint32_t kXor = static_cast<uint32_t>(kChunkFlip) << 4;
        constexpr uint32_t kAdd = static_cast<uint32_t>(
            ((kColStep / kAtomCols) * kRows * kAtomCols + kRowStep * kAtomCols) * 2);
        return (thread_base ^ kXor) + kAdd;
    }
};

// Copies between a global (rows, head dim) slice with a 64-bit row stride and a SwizzledTile,
// 16 bytes (8 elements) per thread and step. Threads are laid out kThreadsPerRow per row
// (one atom width: 128 or 64 contiguous global bytes per row) and kRowsPerStep rows; they walk
// the tile atom by atom and kRowsPerStep rows at a time, so within one call a thread's shared
// address changes only by compile-time constants.
// A tile of fewer rows than the threads cover in one step (the key-split decode tile's 16-row Q
// tile at a head dim of 32-column atoms: 128 threads, 4 per row, would cover 32 rows) is copied
// by its first kActiveThreads threads; the others return at once (tid >= kActiveThreads), so
// every method below is called by all threads as usual. Tiles the threads cover evenly compile
// without that test.
// Requirements: global tile start and row stride 16-byte aligned (the host makes sure).
template <typename Tile, int kNThreads>
struct TileCopy {
    static constexpr int kThreadsPerRow = Tile::kAtomCols / 8;
    static constexpr int kRowsPerStep =
        kNThreads / kThreadsPerRow < Tile::kRows ? kNThreads / kThreadsPerRow : Tile::kRows;
    static constexpr int kActiveThreads = kRowsPerStep * kThreadsPerRow;
    static constexpr int kRowSteps = Tile::kRows / kRowsPerStep;
    static constexpr int kAtoms = Tile::kCols / Tile::kAtomCols;
    static_assert(kNThreads % kThreadsPerRow == 0 && Tile::kRows % kRowsPerStep == 0,
                  "tile rows must split evenly over the threads");
    static_assert(kRowsPerStep % 16 == 0, "row steps must keep the swizzle pattern");

    // Whether thread tid has no part in the copies (only for a tile shorter than one step).
    __device__ __forceinline__ static bool idle(int tid) {
        return kActiveThreads < kNThreads && tid >= kActiveThreads;
    }
    __device__ __forceinline__ static int thread_row(int tid) { return tid / kThreadsPerRow; }
    __device__ __forceinline__ static int thread_col(int tid) { return (tid % kThreadsPerRow) * 8; }

    // Element offset of this thread's first chunk from a global tile start.
    __device__ __forceinline__ static int64_t thread_offset(int tid, int64_t row_stride) {
        return thread_row(tid) * row_stride + thread_col(tid);
    }

    // Asynchronous global -> shared copy of tile rows [0, valid_rows) and columns
    // [0, valid_cols); the rest of the tile is zero-filled (no global byte outside is read).
    // gmem_thread: this thread's first chunk, gmem_tile + thread_offset(tid, row_stride).
    // Does not commit the cp.async group.
    template <typename Element>
    __device__ __forceinline__ static void load_async_from_thread(uint32_t smem_tile,
                                                                  const Element* gmem_thread,
                                                                  int64_t row_stride,
                                                                  int valid_rows, int valid_cols,
                                                                  int tid) {
        load_async_steps(smem_tile, gmem_thread, kRowsPerStep * row_stride, valid_rows,
                         valid_cols, tid);
    }

    // The same with the element distance between the thread's consecutive row steps given
    // (step_stride: kRowsPerStep x row_stride above): tiles whose rows are not evenly spaced
    // but whose every thread's rows are (head-group K/V tiles, sm80/fwd.cuh load_kv_tile).
    template <typename Element>
    __device__ __forceinline__ static void load_async_steps(uint32_t smem_tile,
                                                            const Element* gmem_thread,
                                                            int64_t step_stride, int valid_rows,
                                                            int valid_cols, int tid) {
        if (idle(tid)) return;
        const int row = thread_row(tid), col = thread_col(tid);
        const uint32_t smem_thread = smem_tile + Tile::byte_offset(row, col);
        static_for_each<kRowSteps>([&](auto r) {
            const bool row_ok = row + r * kRowsPerStep < valid_rows;
            const Element* gmem_row = gmem_thread + r * step_stride;
            static_for_each<kAtoms>([&](auto a) {
                const bool in_bounds = row_ok && col + a * Tile::kAtomCols < valid_cols;
                // Out of bounds: src-size 0 reads nothing; pass an address that is never used.
                const Element* src = in_bounds ? gmem_row + a * Tile::kAtomCols : gmem_thread;
                ptx::cp_async_16(
                    Tile::template stepped<r * kRowsPerStep, a * Tile::kAtomCols>(smem_thread),
                    src, in_bounds);
            });
        });
    }

    // The same for a whole tile (valid_rows >= kRows, valid_cols >= kCols; the caller checks):
    // no per-chunk bounds, so no predicates and no address selects.
    template <typename Element>
    __device__ __forceinline__ static void load_async_full(uint32_t smem_tile,
                                                           const Element* gmem_tile,
                                                           int64_t row_stride, int tid) {
        load_async_full_steps(smem_tile, gmem_tile + thread_offset(tid, row_stride),
                              kRowsPerStep * row_stride, tid);
    }

    // The same from this thread's first chunk, with its row steps step_stride elements apart
    // (see load_async_steps).
    template <typename Element>
    __device__ __forceinline__ static void load_async_full_steps(uint32_t smem_tile,
                                                                 const Element* gmem_thread,
                                                                 int64_t step_stride, int tid) {
        if (idle(tid)) return;
        const int row = thread_row(tid), col = thread_col(tid);
        const uint32_t smem_thread = smem_tile + Tile::byte_offset(row, col);
        static_for_each<kRowSteps>([&](auto r) {
            const Element* gmem_row = gmem_thread + r * step_stride;
            static_for_each<kAtoms>([&](auto a) {
                ptx::cp_async_16(
                    Tile::template stepped<r * kRowsPerStep, a * Tile::kAtomCols>(smem_thread),
                    gmem_row + a * Tile::kAtomCols, true);
            });
        });
    }

    // The same from the tile start.
    template <typename Element>
    __device__ __forceinline__ static void load_async(uint32_t smem_tile, const Element* gmem_tile,
                                                      int64_t row_stride, int valid_rows,
                                                      int valid_cols, int tid) {
        load_async_from_thread(smem_tile, gmem_tile + thread_offset(tid, row_stride), row_stride,
                               valid_rows, valid_cols, tid);
    }

    // The same with rows gathered from anywhere (packed GQA rows): row_ptr(r) returns the global
    // address of tile row r (column 0), once per row step; rows past valid_rows take the last
    // valid row's address (never read: src-size 0).
    template <typename RowPtr>
    __device__ __forceinline__ static void load_async_gather(uint32_t smem_tile, RowPtr&& row_ptr,
                                                             int valid_rows, int valid_cols,
                                                             int tid) {
        const int row = thread_row(tid), col = thread_col(tid);
        const int last_row = valid_rows > 0 ? valid_rows - 1 : 0;
        load_async_gather_steps(
            smem_tile,
            [&](auto step) { return row_ptr(min(row + step * kRowsPerStep, last_row)) + col; },
            valid_rows, valid_cols, tid);
    }

    // The same, with chunk_ptr(step) taking this thread's row step (a std::integral_constant in
    // [0, kRowSteps): tile row thread_row(tid) + step * kRowsPerStep) and returning the global
    // address of the thread's first chunk in that row (row start + thread_col(tid)), for
    // per-step values a caller keeps in registers. Every row step's address must lie in the
    // tensor: rows past valid_rows are not read (src-size 0) but their address is used as it
    // is, with no select per chunk, which the paged decode copies cannot afford at one CTA per
    // SM (bench/NOTES.md run 53). Chunks past valid_cols (a head dim below the tile width) are
    // not read either; their address lies past the row's last element by less than a tile row.
    // kWholeTile: the caller knows valid_rows >= kRows and valid_cols >= kCols (no predicates).
    template <bool kWholeTile = false, typename StepChunkPtr>
    __device__ __forceinline__ static void load_async_gather_steps(uint32_t smem_tile,
                                                                   StepChunkPtr&& chunk_ptr,
                                                                   int valid_rows,
                                                                   int valid_cols, int tid) {
        if (idle(tid)) return;
        const int row = thread_row(tid), col = thread_col(tid);
        const uint32_t smem_thread = smem_tile + Tile::byte_offset(row, col);
        static_for_each<kRowSteps>([&](auto r) {
            const bool row_ok = row + r * kRowsPerStep < valid_rows;
            const auto* gmem_row = chunk_ptr(r);  // const Element*
            static_for_each<kAtoms>([&](auto a) {
                const bool in_bounds =
                    kWholeTile || (row_ok && col + a * Tile::kAtomCols < valid_cols);
                ptx::cp_async_16(
                    Tile::template stepped<r * kRowsPerStep, a * Tile::kAtomCols>(smem_thread),
                    gmem_row + a * Tile::kAtomCols, in_bounds);
            });
        });
    }

    // Shared -> global copy of tile rows [0, valid_rows) and columns [0, valid_cols); nothing
    // else is written. The caller synchronizes so the tile is complete.
    template <typename Element>
    __device__ __forceinline__ static void store(Element* gmem_tile, int64_t row_stride,
                                                 uint32_t smem_tile, int valid_rows,
                                                 int valid_cols, int tid) {
        if (idle(tid)) return;
        const int row = thread_row(tid), col = thread_col(tid);
        const uint32_t smem_thread = smem_tile + Tile::byte_offset(row, col);
        Element* gmem_thread = gmem_tile + row * row_stride + col;
        const int64_t step_stride = kRowsPerStep * row_stride;
        static_for_each<kRowSteps>([&](auto r) {
            if (row + r * kRowsPerStep < valid_rows) {
                Element* gmem_row = gmem_thread + r * step_stride;
                static_for_each<kAtoms>([&](auto a) {
                    if (col + a * Tile::kAtomCols < valid_cols) {
                        const uint4 chunk = ptx::ld_shared_16(
                            Tile::template stepped<r * kRowsPerStep, a * Tile::kAtomCols>(smem_thread));
                        *reinterpret_cast<uint4*>(gmem_row + a * Tile::kAtomCols) = chunk;
                    }
                });
            }
        });
    }

    // The same with rows scattered anywhere: row_ptr(r) is the global address of tile row r
    // (column 0), called only for rows r < valid_rows.
    template <typename Element, typename RowPtr>
    __device__ __forceinline__ static void store_scatter(RowPtr&& row_ptr, uint32_t smem_tile,
                                                         int valid_rows, int valid_cols, int tid) {
        if (idle(tid)) return;
        const int row = thread_row(tid), col = thread_col(tid);
        const uint32_t smem_thread = smem_tile + Tile::byte_offset(row, col);
        static_for_each<kRowSteps>([&](auto r) {
            if (row + r * kRowsPerStep < valid_rows) {
                Element* gmem_row = row_ptr(row + r * kRowsPerStep) + col;
                static_for_each<kAtoms>([&](auto a) {
                    if (col + a * Tile::kAtomCols < valid_cols) {
                        const uint4 chunk = ptx::ld_shared_16(
                            Tile::template stepped<r * kRowsPerStep, a * Tile::kAtomCols>(smem_thread));
                        *reinterpret_cast<uint4*>(gmem_row + a * Tile::kAtomCols) = chunk;
                    }
                });
            }
        });
    }

    // Writes zeros to tile rows [0, valid_rows) and columns [0, valid_cols) of a global tile.
    template <typename Element>
    __device__ __forceinline__ static void store_zeros(Element* gmem_tile, int64_t row_stride,
                                                       int valid_rows, int valid_cols, int tid) {
        if (idle(tid)) return;
        const int row = thread_row(tid), col = thread_col(tid);
        for (int r = 0; r < kRowSteps; ++r) {
            if (row + r * kRowsPerStep >= valid_rows) break;
            Element* gmem_row = gmem_tile + (row + r * kRowsPerStep) * row_stride;
            for (int c = col; c < valid_cols; c += Tile::kAtomCols) {
                *reinterpret_cast<uint4*>(gmem_row + c) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }
};

}  // namespace sm80
}  // namespace flash_cuda
