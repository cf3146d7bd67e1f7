// Thread counts of the CPU runtime: OpenMP loops and OpenBLAS GEMMs share one setting so that
// several MPI ranks on one machine do not oversubscribe its cores.
#pragma once

namespace alloy {

// ALLOY_THREADS when set, else cores / OMPI_COMM_WORLD_LOCAL_SIZE (ranks on this node), min 1.
int runtime_default_threads();

// Sets both the OpenMP thread count and OpenBLAS's; n < 1 means runtime_default_threads().
void runtime_set_threads(int n);

// The count last set (runtime_default_threads() before any call).
int runtime_threads();

// While alive, OpenBLAS runs single-threaded: for GEMMs issued from inside OpenMP loops.
class BlasSingleThreadScope {
 public:
  BlasSingleThreadScope();
  ~BlasSingleThreadScope();
  BlasSingleThreadScope(const BlasSingleThreadScope&) = delete;
  BlasSingleThreadScope& operator=(const BlasSingleThreadScope&) = delete;

 private:
  int saved_threads_;
};

}  // namespace alloy
