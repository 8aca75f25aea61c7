// EpBuffer's messages: each dispatched row packed with its weights and local expert ids (as T, a
// 16-bit type or fp8 with block scales), decoded into the experts' batch where it arrives, and the
// returns of a combine summed per row. Internal: engines use EpBuffer.
#pragma once

#include <cstdint>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "relayout/placement/impl/ep_exchange.hpp"

namespace relayout::impl {

// The received messages grouped by local expert into the experts' batch, decoded from payload P.
template <class P, class T, class Space>
void group_received(const Space& exec, EpState<T, Space>& d, bool indexed) {
  constexpr bool fp8 = is_fp8_payload_v<P>;
  auto& buf = *d.mem;
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words(), H = d.hidden;
  const int per_rank = d.per_rank;
  const auto recv = d.received_messages;
  // Indexed: the rows are read where they arrived, message i's row at source + i * ld.
  const T* source = nullptr;
  std::int64_t ld = 0;
  if constexpr (!fp8 && std::is_same_v<P, T>)
    if (indexed && d.received > 0 && msg.bytes % std::int64_t(sizeof(T)) == 0 && msg.row % std::int64_t(sizeof(T)) == 0) {
      source = reinterpret_cast<const T*>(reinterpret_cast<const char*>(recv.data()) + msg.row);
      ld = msg.bytes / std::int64_t(sizeof(T));
    }
  d.batch = group_by_expert<T>(
      exec, buf, d.received, d.k, H,
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t f) {
        const char* at = reinterpret_cast<const char*>(recv.data() + i * W);
        if constexpr (fp8) {
          const float s = reinterpret_cast<const float*>(at + msg.scales)[f / fp8_block];
          return static_cast<T>(e4m3_bits_to_float(reinterpret_cast<const std::uint8_t*>(at + msg.row)[f]) * s);
        } else {
          return convert<T>(reinterpret_cast<const P*>(at + msg.row)[f]);
        }
      },
      KOKKOS_LAMBDA(const std::int64_t i, const int k) {
        return reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(recv.data() + i * W) + msg.ids)[k];
      },
      per_rank, d.first_expert, d.slot_of, source, ld);
}

// Each sent row's message: its weights and its local expert ids at the destination (-1: none),
// then the row as P (fp8: quantised per block). Low-latency mode writes destination r's messages
// after its block's head, B words apart.
template <class P, class T, class Space, class X, class Route>
void pack_messages(const Space& exec, EpState<T, Space>& d, const X& xv, const Route& route, std::int64_t mo,
                   int ep, std::int64_t B, const Kokkos::View<std::int32_t*, typename Space::memory_space>& send) {
  constexpr bool fp8 = is_fp8_payload_v<P>;
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words(), H = d.hidden;
  const int K = d.k, per_rank = d.per_rank;
  const bool ll = B > 0;
  const auto ids = route.ids;
  const auto wv = route.weights;
  const auto pos = d.send_pos;
  const auto starts = d.mem->starts;
  Kokkos::parallel_for(
      "relayout::ep_dispatch.pack", Kokkos::RangePolicy<Space>(exec, 0, mo * ep), KOKKOS_LAMBDA(const std::int64_t idx) {
        const int r = static_cast<int>(idx / mo);
        const std::int64_t i = idx % mo, q = pos(i, r);
        if (q < 0) return;
        const std::int64_t word = ll ? r * B + kLlHead + (q - starts(r)) * W : q * W;
        char* at = reinterpret_cast<char*>(send.data() + word);
        compute_t<T>* w = reinterpret_cast<compute_t<T>*>(at + msg.weights);
        std::int32_t* lid = reinterpret_cast<std::int32_t*>(at + msg.ids);
        for (int k = 0; k < K; ++k) {
          const int e = ids(i, k);
          const bool here = e / per_rank == r;
          lid[k] = here ? e - r * per_rank : -1;
          w[k] = here ? wv(i, k) : compute_t<T>(0);
        }
        if constexpr (fp8) {
          float* scale = reinterpret_cast<float*>(at + msg.scales);
          std::uint8_t* q8 = reinterpret_cast<std::uint8_t*>(at + msg.row);
          for (std::int64_t c = 0, b = 0; c < H; c += fp8_block, ++b)
            scale[b] = fp8_quantize_block(&xv(i, c), static_cast<int>(H - c < fp8_block ? H - c : fp8_block), q8 + c);
        } else {
          P* row = reinterpret_cast<P*>(at + msg.row);
          for (std::int64_t f = 0; f < H; ++f) row[f] = convert<P>(xv(i, f));
        }
      });
}

// pack_messages for the dispatch's dtype.
template <class T, class Space, class X, class Route>
void pack_dtype(const Space& exec, EpState<T, Space>& d, const X& xv, const Route& route, std::int64_t mo, int ep,
                std::int64_t B, const Kokkos::View<std::int32_t*, typename Space::memory_space>& send) {
  switch (d.dtype) {
    case DispatchDtype::bf16: return pack_messages<relayout::bf16>(exec, d, xv, route, mo, ep, B, send);
    case DispatchDtype::fp16: return pack_messages<relayout::fp16>(exec, d, xv, route, mo, ep, B, send);
    case DispatchDtype::fp8: return pack_messages<fp8_e4m3>(exec, d, xv, route, mo, ep, B, send);
    case DispatchDtype::compute: return pack_messages<T>(exec, d, xv, route, mo, ep, B, send);
  }
}

// The received messages grouped into the experts' batch, decoded from the dispatch's dtype.
template <class T, class Space>
void group_dispatched(const Space& exec, EpState<T, Space>& d, bool indexed) {
  switch (d.dtype) {
    case DispatchDtype::bf16: return group_received<relayout::bf16>(exec, d, indexed);
    case DispatchDtype::fp16: return group_received<relayout::fp16>(exec, d, indexed);
    case DispatchDtype::fp8: return group_received<fp8_e4m3>(exec, d, indexed);
    case DispatchDtype::compute: return group_received<T>(exec, d, indexed);
  }
}

// out(i) = the sum of row i's returns (one per destination member, in member order); bf16 and fp16
// rows sum in float and are rounded once.
template <class T, class Space>
void sum_returns(const Space& exec, const EpState<T, Space>& d, const RowsView<T, Space>& back,
                 const RowsView<T, Space>& out, int ep) {
  const std::int64_t H = d.hidden;
  const auto pos = d.send_pos;
  Kokkos::parallel_for(
      "relayout::ep_combine.sum", Kokkos::RangePolicy<Space>(exec, 0, d.rows), KOKKOS_LAMBDA(const std::int64_t i) {
        using C = compute_t<T>;
        if constexpr (!std::is_same_v<T, C>) {
          constexpr std::int64_t kChunk = 32;  // a chunk of the row in fp32 accumulators
          for (std::int64_t f0 = 0; f0 < H; f0 += kChunk) {
            const std::int64_t width = H - f0 < kChunk ? H - f0 : kChunk;
            C acc[kChunk] = {};
            for (int r = 0; r < ep; ++r) {
              const std::int64_t q = pos(i, r);
              if (q < 0) continue;
              for (std::int64_t j = 0; j < width; ++j) acc[j] += C(back(q, f0 + j));
            }
            for (std::int64_t j = 0; j < width; ++j) out(i, f0 + j) = T(acc[j]);
          }
        } else {
          for (std::int64_t f = 0; f < H; ++f) out(i, f) = T(0);
          for (int r = 0; r < ep; ++r) {
            const std::int64_t q = pos(i, r);
            if (q < 0) continue;
            for (std::int64_t f = 0; f < H; ++f) out(i, f) += back(q, f);
          }
        }
      });
}

}  // namespace relayout::impl
