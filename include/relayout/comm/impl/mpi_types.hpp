// Mapping of element types and reduction operators to MPI. bf16/fp16 travel as MPI_UINT16_T and
// reduce through user-defined operators that convert to float, combine and round back, so a SUM
// is a floating sum, not an integer sum of bit patterns.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "relayout/comm/error.hpp"
#include "relayout/comm/scalar.hpp"

#define RELAYOUT_MPI_CHECK(call) ::relayout::impl::mpi_check((call), #call, __FILE__, __LINE__)

namespace relayout::impl {

inline void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw CommError(call, file, line, "MPI error " + std::to_string(rc) + (len ? ": " : "") +
                                        std::string(text, static_cast<std::size_t>(len)));
}

template <CommScalar T>
MPI_Datatype mpi_datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else return MPI_UINT16_T;
}

template <Half16 H, ReduceOp Op>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const H*>(in);
  auto* b = static_cast<H*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r = 0;
    if constexpr (Op == ReduceOp::sum) r = x + y;
    else if constexpr (Op == ReduceOp::prod) r = x * y;
    else if constexpr (Op == ReduceOp::min) r = x < y ? x : y;
    else r = x > y ? x : y;
    b[i] = H(r);
  }
}

// The user-defined operators, created on first use (MPI is initialised by then) and freed when
// MPI_Finalize deletes MPI_COMM_SELF's attributes.
class HalfOps {
 public:
  static const HalfOps& get() {
    static const HalfOps ops;
    return ops;
  }
  template <Half16 H>
  MPI_Op op(ReduceOp op) const {
    return ops_[std::is_same_v<H, bf16> ? 0 : 1][static_cast<int>(op)];
  }

 private:
  HalfOps() {
    make<bf16>(0);
    make<fp16>(1);
    int keyval = MPI_KEYVAL_INVALID;
    RELAYOUT_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_at_finalize, &keyval, this));
    RELAYOUT_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr));
  }
  template <Half16 H>
  void make(int t) {
    RELAYOUT_MPI_CHECK(MPI_Op_create(&half_reduce<H, ReduceOp::sum>, 1, &ops_[t][0]));
    RELAYOUT_MPI_CHECK(MPI_Op_create(&half_reduce<H, ReduceOp::prod>, 1, &ops_[t][1]));
    RELAYOUT_MPI_CHECK(MPI_Op_create(&half_reduce<H, ReduceOp::min>, 1, &ops_[t][2]));
    RELAYOUT_MPI_CHECK(MPI_Op_create(&half_reduce<H, ReduceOp::max>, 1, &ops_[t][3]));
  }
  static int free_at_finalize(MPI_Comm, int keyval, void*, void* extra) {
    auto* self = static_cast<HalfOps*>(extra);
    for (auto& row : self->ops_)
      for (MPI_Op& o : row) MPI_Op_free(&o);
    MPI_Comm_free_keyval(&keyval);
    return MPI_SUCCESS;
  }
  std::array<std::array<MPI_Op, 4>, 2> ops_{};
};

template <CommScalar T>
MPI_Op mpi_op(ReduceOp op) {
  if constexpr (Half16<T>) {
    return HalfOps::get().op<T>(op);
  } else {
    switch (op) {
      case ReduceOp::sum: return MPI_SUM;
      case ReduceOp::prod: return MPI_PROD;
      case ReduceOp::min: return MPI_MIN;
      case ReduceOp::max: return MPI_MAX;
    }
    return MPI_SUM;
  }
}

}  // namespace relayout::impl
