// Paged KV cache for shared-KV (MQA, K = V) attention: per layer, a pool of fixed-size blocks of
// kv rows, and per request slot a block table listing the blocks that hold its rows in order (row
// p of a request lives in block table[p / block_size], at p % block_size). The block table is shared
// by the layers (a block id names the same block in every layer's pool), the length is per layer
// (a forward appends layer by layer). Truncation rolls back rejected speculative rows in every
// layer and returns whole blocks no layer still uses. Everything is allocated up front from a shape;
// shape.bytes() is the estimate, and a cache that would not fit its memory limit is refused.
// The cache is addressed by slot; which request holds a slot is relayout::RequestTable's, which
// tells the cache of joins, leaves and rollbacks through hook(exec) (continuous batching).
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

struct KvCacheShape {
  int layers = 1;
  int head_dim = 0;
  int block_size = 16;       // rows per block
  int num_blocks = 0;        // blocks in each layer's pool
  int max_requests = 0;      // request slots
  int max_blocks_per_request = 0;

  std::int64_t rows_per_request() const { return std::int64_t(max_blocks_per_request) * block_size; }
  // Device bytes the cache allocates for scalar size `scalar_bytes`: pools, block table, lengths.
  std::size_t bytes(std::size_t scalar_bytes) const {
    return std::size_t(layers) * num_blocks * block_size * head_dim * scalar_bytes +
           std::size_t(max_requests) * max_blocks_per_request * sizeof(int) +
           std::size_t(layers) * max_requests * sizeof(int);
  }
};

// What decode attention reads for one layer: the pool, the block table, the lengths, and which
// request slot each query row belongs to (slots(b) for query row b).
template <class T, class MemSpace>
struct PagedKv {
  RowsView<const T, MemSpace> pool;               // num_blocks * block_size x head_dim
  Kokkos::View<const int**, MemSpace> block_table;  // max_requests x max_blocks_per_request
  Kokkos::View<const int*, MemSpace> lengths;       // max_requests
  Kokkos::View<const int*, MemSpace> slots;         // query rows
  int block_size = 0;
};

template <class T, class MemSpace, class ExecSpace>
struct PagedKvHook;

template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
class PagedKvCache {
 public:
  using memory_space = MemSpace;
  using value_type = T;

  // Throws LayoutError when the shape is invalid, when shape.bytes() exceeds memory_limit (0: no
  // limit), or when the allocation fails.
  explicit PagedKvCache(const KvCacheShape& shape, std::size_t memory_limit = 0) : shape_(shape) {
    const char* fn = "PagedKvCache";
    impl::require(shape.layers >= 1, fn, "layers", "must be >= 1, got " + impl::str(shape.layers));
    impl::require(shape.head_dim >= 1, fn, "head_dim", "must be >= 1, got " + impl::str(shape.head_dim));
    impl::require(shape.block_size >= 1, fn, "block_size", "must be >= 1, got " + impl::str(shape.block_size));
    impl::require(shape.num_blocks >= 0, fn, "num_blocks", "must be >= 0, got " + impl::str(shape.num_blocks));
    impl::require(shape.max_requests >= 0, fn, "max_requests",
                  "must be >= 0, got " + impl::str(shape.max_requests));
    impl::require(shape.max_blocks_per_request >= 0, fn, "max_blocks_per_request",
                  "must be >= 0, got " + impl::str(shape.max_blocks_per_request));
    impl::require(std::int64_t(shape.num_blocks) * shape.block_size <= INT32_MAX, fn, "num_blocks",
                  "num_blocks x block_size must fit in int (rows are indexed with int)");
    const std::size_t need = shape.bytes(sizeof(T));
    impl::require(memory_limit == 0 || need <= memory_limit, fn, "num_blocks",
                  "the cache needs " + impl::str(std::int64_t(need)) + " bytes (" + impl::str(shape.layers) +
                      " layers x " + impl::str(shape.num_blocks) + " blocks x " + impl::str(shape.block_size) +
                      " rows x " + impl::str(shape.head_dim) + " values), more than the limit of " +
                      impl::str(std::int64_t(memory_limit)) + " bytes");
    try {
      for (int l = 0; l < shape.layers; ++l)
        pools_.emplace_back(Kokkos::view_alloc(std::string("relayout::kv_pool"), Kokkos::WithoutInitializing),
                            std::size_t(shape.num_blocks) * shape.block_size, std::size_t(shape.head_dim));
      table_ = Kokkos::View<int**, MemSpace>("relayout::kv_block_table", shape.max_requests,
                                             shape.max_blocks_per_request);
      lengths_ = Kokkos::View<int**, MemSpace>("relayout::kv_lengths", shape.layers, shape.max_requests);
    } catch (const std::bad_alloc&) {
      throw KernelError("num_blocks", "relayout::kernels::PagedKvCache: num_blocks: allocating " +
                                          impl::str(std::int64_t(need)) + " bytes failed");
    }
    table_h_ = Kokkos::create_mirror_view(table_);
    lengths_h_ = Kokkos::create_mirror_view(lengths_);
    used_.assign(std::size_t(shape.max_requests), 0);
    for (int b = shape.num_blocks - 1; b >= 0; --b) free_.push_back(b);
  }

  const KvCacheShape& shape() const { return shape_; }
  std::int64_t length(int layer, int slot) const {
    check_layer("length", layer);
    check_slot("length", slot);
    return lengths_h_(layer, slot);
  }
  int free_blocks() const { return int(free_.size()); }
  // Blocks the request holds (shared by its layers).
  int blocks(int slot) const {
    check_slot("blocks", slot);
    return used_[std::size_t(slot)];
  }

  // Appends rows (n x head_dim) to the request in `layer`, taking blocks from the pool as needed.
  // Rows have the cache's scalar type, or are float into a bf16 cache: then each value is rounded
  // to the nearest bf16 (ties to even) as it is stored, so a model that computes its kv rows in
  // fp32 appends them as they are.
  // Throws LayoutError naming the request and the capacity it would exceed; nothing changes then.
  template <class ExecSpace, RowMatrixView Rows>
  void append(const ExecSpace& exec, int layer, int slot, const Rows& rows) {
    static_assert(std::is_same_v<scalar_of<Rows>, T> ||
                      (std::is_same_v<T, relayout::bf16> && std::is_same_v<scalar_of<Rows>, float>),
                  "relayout::kernels::PagedKvCache::append: rows must have the cache's scalar type (or be float "
                  "into a bf16 cache)");
    static_assert(accessible_from<ExecSpace, Rows>, "relayout::kernels::PagedKvCache::append: rows space");
    check_layer("append", layer);
    check_slot("append", slot);
    impl::require(int(rows.extent(1)) == shape_.head_dim, "PagedKvCache::append", "rows",
                  "must have head_dim " + impl::str(shape_.head_dim) + " columns, got " + impl::str(rows.extent(1)));
    const std::int64_t n = std::int64_t(rows.extent(0));
    const std::int64_t start = lengths_h_(layer, slot), end = start + n;
    ensure_blocks(exec, slot, end);
    if (n == 0) return;
    lengths_h_(layer, slot) = int(end);
    Kokkos::deep_copy(exec, lengths_, lengths_h_);
    auto pool = pools_[std::size_t(layer)];
    auto table = Kokkos::subview(table_, slot, Kokkos::ALL);
    const int bs = shape_.block_size, dim = shape_.head_dim;
    Kokkos::parallel_for(
        "relayout::kernels::kv_append", Kokkos::RangePolicy<ExecSpace>(exec, 0, n * dim),
        KOKKOS_LAMBDA(const std::int64_t i) {
          const std::int64_t r = i / dim, d = i % dim, p = start + r;
          pool(std::int64_t(table(p / bs)) * bs + p % bs, d) = T(rows(r, d));
        });
  }

  // Keeps the first `length` rows of the request in every layer (a layer holding fewer keeps all
  // of its rows) and returns the blocks no layer needs any more: rolling back rejected speculative
  // rows. Appending after it equals never having appended the dropped rows. The device copy of the
  // lengths is updated on `exec`, as append does.
  template <class ExecSpace>
  void truncate(const ExecSpace& exec, int slot, std::int64_t length) {
    check_slot("truncate", slot);
    impl::require(length >= 0, "PagedKvCache::truncate", "length", "must be >= 0, got " + impl::str(length));
    std::int64_t longest = 0;
    for (int l = 0; l < shape_.layers; ++l) {
      if (lengths_h_(l, slot) > length) lengths_h_(l, slot) = int(length);
      longest = std::max<std::int64_t>(longest, lengths_h_(l, slot));
    }
    Kokkos::deep_copy(exec, lengths_, lengths_h_);
    const int keep = int((longest + shape_.block_size - 1) / shape_.block_size);
    int& used = used_[std::size_t(slot)];
    for (; used > keep; --used) free_.push_back(table_h_(slot, used - 1));
  }
  // Drops every row of the request (it finished) and returns its blocks.
  template <class ExecSpace>
  void release(const ExecSpace& exec, int slot) {
    truncate(exec, slot, 0);
  }

  // This cache as a RequestTable's store (KvStoreHook), on `exec`: admitting into a slot or
  // finishing its request empties the slot in every layer and returns its blocks.
  template <class ExecSpace>
  PagedKvHook<T, MemSpace, ExecSpace> hook(const ExecSpace& exec) {
    return {this, exec};
  }

  // Decode-attention input for `layer`; query row b reads request slots(b).
  template <class Slots>
  PagedKv<T, MemSpace> view(int layer, const Slots& slots) const {
    check_layer("view", layer);
    return {pools_[std::size_t(layer)], table_, Kokkos::subview(lengths_, layer, Kokkos::ALL), slots,
            shape_.block_size};
  }

  // The request's rows in `layer`, gathered in order into a host tensor (length x head_dim).
  RowsView<T, Kokkos::HostSpace> read(int layer, int slot) const {
    check_layer("read", layer);
    check_slot("read", slot);
    const int len = lengths_h_(layer, slot), bs = shape_.block_size;
    auto pool = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pools_[std::size_t(layer)]);
    RowsView<T, Kokkos::HostSpace> out("relayout::kv_rows", len, shape_.head_dim);
    for (int p = 0; p < len; ++p)
      for (int d = 0; d < shape_.head_dim; ++d) out(p, d) = pool(std::int64_t(table_h_(slot, p / bs)) * bs + p % bs, d);
    return out;
  }

 private:
  void check_layer(const char* fn, int layer) const {
    impl::require(layer >= 0 && layer < shape_.layers, (std::string("PagedKvCache::") + fn).c_str(), "layer",
                  "must be in [0, " + impl::str(shape_.layers) + "), got " + impl::str(layer));
  }
  void check_slot(const char* fn, int slot) const {
    impl::require(slot >= 0 && slot < shape_.max_requests, (std::string("PagedKvCache::") + fn).c_str(),
                  "request", "must be a slot in [0, " + impl::str(shape_.max_requests) + "), got " + impl::str(slot));
  }
  // Gives the request enough blocks for `rows` rows, or throws before changing anything.
  template <class ExecSpace>
  void ensure_blocks(const ExecSpace& exec, int slot, std::int64_t rows) {
    const std::int64_t cap = shape_.rows_per_request();
    if (rows > cap)
      throw KernelError("request", "relayout::kernels::PagedKvCache::append: request " + impl::str(slot) +
                                       ": " + impl::str(rows) + " rows exceed the capacity of " + impl::str(cap) +
                                       " rows per request (" + impl::str(shape_.max_blocks_per_request) +
                                       " blocks of " + impl::str(shape_.block_size) + ")");
    int& used = used_[std::size_t(slot)];
    const int need = int((rows + shape_.block_size - 1) / shape_.block_size);
    if (need - used > int(free_.size()))
      throw KernelError("request", "relayout::kernels::PagedKvCache::append: request " + impl::str(slot) +
                                       ": " + impl::str(rows) + " rows need " + impl::str(need - used) +
                                       " more blocks, the pool of " + impl::str(shape_.num_blocks) +
                                       " blocks has " + impl::str(std::int64_t(free_.size())) + " free");
    if (need <= used) return;
    for (; used < need; ++used) {
      table_h_(slot, used) = free_.back();
      free_.pop_back();
    }
    Kokkos::deep_copy(exec, table_, table_h_);
  }

  KvCacheShape shape_;
  std::vector<RowsView<T, MemSpace>> pools_;
  Kokkos::View<int**, MemSpace> table_, lengths_;
  typename Kokkos::View<int**, MemSpace>::HostMirror table_h_, lengths_h_;
  std::vector<int> used_;   // blocks held per slot
  std::vector<int> free_;   // free block ids (a stack)
};

// A handle onto a PagedKvCache for RequestTable (it never owns the cache; the cache outlives it).
template <class T, class MemSpace, class ExecSpace>
struct PagedKvHook {
  PagedKvCache<T, MemSpace>* cache = nullptr;
  ExecSpace exec{};
  void on_admit(int slot, std::int64_t) const { cache->release(exec, slot); }
  void on_release(int slot) const { cache->release(exec, slot); }
  void on_truncate(int slot, std::int64_t rows) const { cache->truncate(exec, slot, rows); }
};

}  // namespace relayout::kernels
